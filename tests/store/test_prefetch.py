"""offgraph.store.prefetch: store files read into the page cache in the background. Residency is read with
``mincore(2)`` on a mapping of each file, not through the code under test."""

import os
import time

import pytest
from page_cache_files import cold_file, resident_bytes
from polling import wait_for

from offgraph.store.prefetch import Prefetcher, decide, store_files


def test_decide_by_mode_and_available_memory():
    gib = 2**30
    assert decide("auto", 4 * gib, available=10 * gib)[0] is True
    go, why = decide("auto", 6 * gib, available=10 * gib)
    assert go is False and "more than 50%" in why and "read from disk" in why
    assert decide("on", 100 * gib, available=gib)[0] is True
    assert decide("off", 1, available=10 * gib)[0] is False
    with pytest.raises(ValueError, match="prefetch mode"):
        decide("always", 1)


def test_prefetcher_reads_cold_files_into_the_page_cache(tmp_path):
    (tmp_path / "shard-000").mkdir()
    (tmp_path / "shard-001").mkdir()
    a = cold_file(tmp_path / "shard-000" / "000008.sst", 24)
    b = cold_file(tmp_path / "shard-001" / "000009.sst", 8)
    (tmp_path / "shard-000" / "LOG").write_text("not a table file")
    files = store_files(tmp_path)
    assert files == [a, b]  # table files only, biggest first
    pf = Prefetcher(files).start()
    assert pf.wait(60)
    assert pf.error is None and pf.done_bytes == pf.total_bytes == 32 << 20
    assert resident_bytes(a) == 24 << 20 and resident_bytes(b) == 8 << 20


def test_rate_limit_and_stop(tmp_path):
    path = cold_file(tmp_path / "x.sst", 32)
    pf = Prefetcher([path], max_mb_s=16).start()  # 32 MiB at 16 MiB/s: about 2 s
    wait_for(lambda: pf.done_bytes >= 4 << 20, 10, "the prefetch under way")
    pf.stop()
    assert pf.wait(10)
    assert 0 < pf.done_bytes < 32 << 20  # stopped part way
    assert resident_bytes(path) < 32 << 20
    t = time.perf_counter()
    pf = Prefetcher([path], max_mb_s=64).start()  # the rest at 64 MiB/s
    assert pf.wait(30)
    assert time.perf_counter() - t >= 0.4  # 32 MiB at 64 MiB/s cannot take less than 0.5 s
    assert pf.done_bytes == 32 << 20


def test_with_a_disk_share_the_prefetch_pauses_in_proportion_to_its_reads(tmp_path):
    path = cold_file(tmp_path / "x.sst", 32)
    pf = Prefetcher([path], max_mb_s=1e6, disk_share=0.25).start()  # a rate limit that never binds
    assert pf.wait(120)
    assert pf.done_bytes == 32 << 20 and pf.busy_seconds > 0
    # 3 s of pause for every second of reading: a slower (contended) disk makes them longer
    assert pf.seconds >= 0.9 * pf.busy_seconds / 0.25, (pf.seconds, pf.busy_seconds)
    free = Prefetcher([cold_file(tmp_path / "y.sst", 32)], max_mb_s=1e6).start()  # share 1: no pauses
    assert free.wait(120)
    assert free.seconds < 2 * free.busy_seconds + 0.05, (free.seconds, free.busy_seconds)
    with pytest.raises(ValueError, match="disk_share"):
        Prefetcher([path], disk_share=0)


def test_a_file_gone_is_an_error_not_an_exception(tmp_path):
    path = cold_file(tmp_path / "x.sst", 1)
    pf = Prefetcher([path])
    path.unlink()
    pf.start()
    assert pf.wait(10)
    assert pf.error is not None and "FileNotFoundError" in pf.error
    with pytest.raises(ValueError, match="max_mb_s"):
        Prefetcher([], max_mb_s=-1)


def test_the_prefetch_reads_in_the_idle_io_class_and_leaves_the_other_threads_alone(tmp_path):
    import psutil

    path = cold_file(tmp_path / "x.sst", 8)
    pf = Prefetcher([path], max_mb_s=2).start()  # about 4 s: long enough to look at its thread
    try:
        deadline = time.monotonic() + 10
        while pf.io_class is None and not pf.finished and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pf.io_class == "idle"
        assert psutil.Process(pf._thread.native_id).ionice().ioclass == psutil.IOPRIO_CLASS_IDLE  # the kernel's word
        assert psutil.Process(os.getpid()).ionice().ioclass != psutil.IOPRIO_CLASS_IDLE  # requests' reads keep theirs
    finally:
        pf.stop()
        assert pf.wait(10)

"""offgraph.store.device_probe: O_DIRECT random reads at a queue depth, on a real disk; memory-backed files refused."""

import os
import shutil
import uuid

import numpy as np
import pytest
from page_cache_files import cold_file, resident_bytes

from bench.lib.disk import cold_reads
from offgraph.store.device_probe import (
    DirectIOUnsupported,
    describe_profile,
    device_profile,
    direct_read_latency,
    direct_reads,
    filesystem_type,
)


@pytest.fixture
def disk_file(tmp_path):
    if filesystem_type(tmp_path) in ("tmpfs", "ramfs", None):
        pytest.skip(f"{tmp_path} is not on a disk")
    return cold_file(tmp_path / "x.sst", 16)


@pytest.fixture
def shm_file():
    d = f"/dev/shm/offgraph-probe-{uuid.uuid4().hex}"
    if not os.path.isdir("/dev/shm") or filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    os.makedirs(d)
    path = os.path.join(d, "x.sst")
    with open(path, "wb") as f:
        f.write(np.zeros(1 << 20, np.uint8).tobytes())
    yield path
    shutil.rmtree(d)


def test_depth_one_reads_a_block_at_a_time_and_leaves_the_page_cache_alone(disk_file):
    got = direct_read_latency([disk_file], depth=1, seconds=0.3, block_bytes=16384)
    assert got["reads"] > 10 and got["depth"] == 1 and got["block_bytes"] == 16384
    assert 0 < got["p50_ms"] <= got["p99_ms"] <= got["max_ms"]
    # one read in flight: reads per second times the mean latency is the share of the time reading (<= 1)
    assert got["reads_per_s"] * got["mean_ms"] / 1e3 <= 1.0
    assert got["reads_per_s"] == pytest.approx(got["reads"] / got["seconds"])
    assert resident_bytes(disk_file) < (1 << 20)  # O_DIRECT: nothing read into the cache


def test_depth_eight_keeps_reads_in_flight_together(disk_file):
    """Little's law: reads in flight on average = the sum of the reads' latencies / the wall time. Reader
    threads that held the GIL through a read would keep that near 1."""
    lat, wall = direct_reads([disk_file], depth=8, seconds=0.5)
    assert sum(lat) / wall > 2.0
    prof = device_profile([disk_file], 0.2, depths=(1, 8))
    assert set(prof) == {"qd1", "qd8"} and prof["qd8"]["depth"] == 8
    assert "qd8: 16-KiB direct reads" in describe_profile(prof)


def test_memory_backed_files_are_refused_with_the_reason(shm_file):
    with pytest.raises(DirectIOUnsupported, match="tmpfs, held in memory"):
        direct_read_latency([shm_file], depth=1, seconds=0.1)
    assert cold_reads([shm_file], seconds=0.1) is None  # the bench's probe: n/a, never memory passed off as disk


def test_bad_arguments_and_small_files(tmp_path, disk_file):
    tiny = tmp_path / "t.sst"
    tiny.write_bytes(b"x" * 1000)
    with pytest.raises(DirectIOUnsupported, match="no file of at least 32768 bytes"):
        direct_read_latency([tiny], 1, 0.1)
    with pytest.raises(ValueError, match="depth"):
        direct_read_latency([disk_file], 0, 0.1)
    with pytest.raises(ValueError, match="multiple of 4096"):
        direct_read_latency([disk_file], 1, 0.1, block_bytes=10000)
    with pytest.raises(ValueError, match="seconds"):
        direct_read_latency([disk_file], 1, 0)

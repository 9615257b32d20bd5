"""offgraph.server.models.loader: a version reads its store files into the page cache before its store opens (rate
limited while the server answers requests, as fast as the disk goes before), and its paced load
owes no pause for that wait. Residency is read with
``mincore(2)`` (tests/store/test_prefetch.py), not through the code under test."""

from __future__ import annotations

import logging
import shutil
import time

from page_cache_files import drop_from_cache, resident_bytes

from offgraph.server.config import ServerConfig
from offgraph.server.models.loader import open_version
from offgraph.server.models.pacing import Pacer
from offgraph.store.prefetch import SERVING_DISK_SHARE, store_files

PREFETCH_S = 1.5  # the store read at a rate that makes the prefetch take about this long


def _cold_version(tiny_model, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(tiny_model[0], models)
    vdir = models / "ml" / "1"
    files = store_files(vdir / "store")
    for p in files:
        drop_from_cache(p)
    total = sum(p.stat().st_size for p in files)
    assert total > 0 and sum(resident_bytes(p) for p in files) < total / 2, "the kernel kept the files cached"
    return models, vdir, total


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "offgraph.server"]


def test_a_version_loaded_while_serving_is_read_in_before_its_store_opens_and_not_paced_for_the_wait(
    tiny_model, tmp_path, caplog
):
    models, vdir, total = _cold_version(tiny_model, tmp_path)
    config = ServerConfig(models_dir=models, prefetch_store="on", prefetch_mb_s=total / 2**20 / PREFETCH_S)
    pacer = Pacer(0.25)
    caplog.set_level(logging.INFO, logger="offgraph.server")
    t0 = time.perf_counter()
    sv = open_version(vdir, config, pacer=pacer, serving=True)
    elapsed = time.perf_counter() - t0
    try:
        pf = sv.prefetcher
        assert pf is not None and pf.finished and pf.done_bytes == total and pf.error is None
        assert pf.seconds >= PREFETCH_S * 0.8  # the rate limit held: the wait below is real
        assert pf.disk_share == SERVING_DISK_SHARE < 1  # requests are served: it reads part of the time only
        msgs = _messages(caplog)
        read = next(i for i, m in enumerate(msgs) if "prefetched" in m)
        verified = next(i for i, m in enumerate(msgs) if "store verified" in m)
        assert read < verified, msgs  # all files were read before the first verification seek
        # pauses are owed for the load's work (a quarter of the time), not for the prefetch wait:
        # paced over the wait too, it would have slept 3 x PREFETCH_S more
        work = elapsed - pf.seconds - pacer.slept_s
        assert pacer.slept_s <= 3.0 * work * 1.2 + 0.3, (pacer.slept_s, work, pf.seconds)
    finally:
        sv.close()


def test_with_nothing_serving_the_prefetch_ignores_the_rate_limit_and_ends_before_the_version_serves(
    tiny_model, tmp_path, caplog
):
    models, vdir, total = _cold_version(tiny_model, tmp_path)
    slow_s = 60.0  # the limit would make it take this long: it is for protecting requests, and none are served
    config = ServerConfig(models_dir=models, prefetch_store="on", prefetch_mb_s=total / 2**20 / slow_s)
    caplog.set_level(logging.INFO, logger="offgraph.server")
    t0 = time.perf_counter()
    sv = open_version(vdir, config, serving=False)
    try:
        assert time.perf_counter() - t0 < slow_s / 2
        pf = sv.prefetcher
        assert pf is not None and pf.finished and pf.done_bytes == total and pf.error is None
        assert pf.disk_share == 1.0  # nothing served: no pauses
        assert sv.scorer.parallel_reads is False  # a store in the page cache is read on the scoring thread
        assert sum(resident_bytes(p) for p in store_files(vdir / "store")) >= 0.9 * total
        msgs = _messages(caplog)
        assert next(i for i, m in enumerate(msgs) if "prefetched" in m) < next(
            i for i, m in enumerate(msgs) if "store verified" in m
        ), msgs
    finally:
        sv.close()


def test_prefetch_off_reads_nothing(tiny_model, tmp_path, caplog):
    models, vdir, total = _cold_version(tiny_model, tmp_path)
    caplog.set_level(logging.INFO, logger="offgraph.server")
    sv = open_version(vdir, ServerConfig(models_dir=models, prefetch_store="off"))
    try:
        assert sv.prefetcher is None
        assert sv.scorer.parallel_reads is True  # reads that may wait on the device go to the read pool
        assert any("store not prefetched" in m for m in _messages(caplog))
    finally:
        sv.close()

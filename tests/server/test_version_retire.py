"""What happens around a swap besides the load itself: the next version warms its row cache on the
loader's own thread (not the store's read pool), a retired version's memory is freed a piece at a
time, and the server measures how late its event loop runs (a blocked loop delays every request)."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
from fg_samples import REQUEST, SPEC
from prometheus_client import CollectorRegistry, Histogram

from offgraph.features import FeatureGenerator
from offgraph.scoring.scorer import Scorer
from offgraph.server.models.served import ServedVersion
from offgraph.server.process.loop_lag import watch_loop_lag


def _crossed_traffic(fg: FeatureGenerator) -> list:
    out = []
    for k in range(4):
        cands = [{"price": 3 * i + k, "title_terms": ["red", f"t{i % 7}"], "cat_id": i % 9} for i in range(40)]
        out.append([r.ids.tolist() for r in fg.transform({**REQUEST, "user_id": 40 + k}, cands).fields])
    return out


def test_a_generator_releases_its_caches_in_paced_chunks_and_still_generates_the_same_features():
    fg = FeatureGenerator(SPEC, item_cache_size=1000)
    want = _crossed_traffic(fg)
    held = len(fg._cache) + len(fg._vid_intern) + sum(len(t) for t in fg._cross_memo)
    assert len(fg._cache) > 0 and len(fg._vid_intern) > 0 and any(fg._cross_memo)
    ticks = []
    assert fg.release(lambda: ticks.append(1), chunk=7) == held
    assert (len(fg._cache), len(fg._vid_intern), sum(len(t) for t in fg._cross_memo)) == (0, 0, 0)
    assert len(ticks) >= held // 7  # a pause after every chunk: the deallocation never comes in one piece
    # a released generator is an empty one: the same ids as before (and as a fresh generator)
    assert _crossed_traffic(fg) == want == _crossed_traffic(FeatureGenerator(SPEC, item_cache_size=1000))


def test_the_next_version_warms_on_the_loader_thread_and_the_retired_one_frees_its_parts(tiny_model, requests_, caplog):
    models, _ = tiny_model
    vdir = models / "ml" / "1"
    with Scorer(vdir, row_cache_mb=8) as old:
        want = [old.score(r, c) for r, c in requests_[:20]]
        hot = old.hot_rows(10_000)
    assert len(hot["rows"]) > 0
    new = Scorer(vdir, row_cache_mb=8)
    try:
        assert new.store.config.shards == 2 and new.store.config.read_threads > 1
        assert new.warm_rows(hot) == len(hot["rows"])
        # one thread read both shards: the read pool (one thread per shard, for requests) was never started,
        # so warming took one CPU at most while the serving version's requests had the others
        assert new.store._pool is None
        hits = new.stats()["cache_hits"]
        got = [new.score(r, c) for r, c in requests_[:20]]
        assert new.stats()["cache_hits"] > hits
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        sv = ServedVersion(new, 0.0, 8)
        with caplog.at_level(logging.INFO, logger="offgraph.server"):
            sv.close(share=0.5)
        assert new.row_cache is None and new._serve is None and len(new.fg._cache) == 0
        assert sv.closed and sv.close() == {}  # closing twice is a no-op
        assert any("closed version 1 of ml (memory freed in" in m for m in caplog.messages), caplog.messages
    finally:
        new.close()


@pytest.mark.parametrize("stall_s", [None, 0.25])
def test_the_loop_lag_is_measured_and_a_blocked_loop_is_logged(caplog, stall_s):
    """A lag is a DEBUG line (an idle server makes some: nothing periodic at INFO), a WARNING from stall_s."""
    hist = Histogram("lag", "lag", buckets=(0.01, 0.05, 0.1, 0.5, 1.0), registry=CollectorRegistry())
    kw = {} if stall_s is None else {"stall_s": stall_s}

    def count() -> float:
        return next(s.value for s in hist.collect()[0].samples if s.name == "lag_count")

    async def until(pred, timeout: float = 10.0) -> None:  # a bounded poll that lets the loop run
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out waiting for the lag watcher"
            await asyncio.sleep(0.01)

    async def main():
        task = asyncio.create_task(watch_loop_lag(hist, interval_s=0.01, **kw))
        await until(lambda: count() >= 3)  # the watcher runs
        time.sleep(0.3)  # the stimulus: a blocking call on the loop
        blocked = count()
        await until(lambda: count() >= blocked + 2)  # it measured the late wake-up and went on
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.DEBUG, logger="offgraph.server"):
        asyncio.run(main())
    samples = {s.name + str(s.labels.get("le", "")): s.value for s in hist.collect()[0].samples}
    assert samples["lag_count"] >= 5
    assert samples["lag_sum"] >= 0.25  # the 0.3-s block, less the timer's own 10 ms
    assert samples["lag_bucket0.5"] - samples["lag_bucket0.1"] == 1  # exactly one wake-up was that late
    said = [r.levelname for r in caplog.records if "event loop: a timer ran" in r.getMessage()]
    assert ("WARNING" in said) if stall_s else (said and set(said) == {"DEBUG"}), caplog.messages

"""Scorer with a row cache following a live writer: a row written by ANOTHER process
shows up in scores within seconds, through the write feed (not a cache flush)."""

import time

import numpy as np
import pyarrow as pa
import pytest
from conftest import StoreWriter
from scorer_parts import DenseHead, pooled
from server_helpers import copy_version

from offgraph.calibration import calibrate
from offgraph.export.export import export_run
from offgraph.features import parse_spec
from offgraph.features.hashing import row_of
from offgraph.model.train import TrainConfig, train_run
from offgraph.scoring.batch import read_through_cache
from offgraph.scoring.scorer import Scorer
from offgraph.store.keys import combine_keys

D = 8

SPEC = {
    "model": {"embedding_dim": D, "hash": "xxh64", "mlp": [16], "calibration": {"negative_rate": 0.5}},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 200},
        {"name": "item", "scope": "item", "op": "id", "input": "item_id", "rows": 300},
        {"name": "tags", "scope": "item", "op": "id", "input": "tags", "rows": 50},
        {"name": "user_x_tags", "scope": "cross", "op": "cross", "inputs": ["user", "tags"], "rows": 500},
    ],
}
ITEM_FIELD = 1


def synthetic_table(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 100, n)
    items = rng.integers(0, 150, n)
    tags = [[f"t{(i * 7 + k) % 20}" for k in range(1 + i % 3)] for i in items.tolist()]
    p = 1 / (1 + np.exp(-((users % 5) - 2 + (items % 3) - 1) * 0.8))
    label = (rng.random(n) < p).astype(np.int64)
    return pa.table({"user_id": users, "item_id": items, "tags": tags, "label": label})


@pytest.fixture(scope="module")
def exported_version(tmp_path_factory):
    """A model version exported once per module; tests write into copies of it (``version_dir``)."""
    root = tmp_path_factory.mktemp("follow")
    spec = parse_spec(SPEC)
    train_run(
        spec, synthetic_table(), TrainConfig(epochs=1, batch_size=256, split="random"), root / "run", progress=False
    )
    out = root / "models" / "m" / "1"
    export_run(root / "run", out, shards=3, quant="fp32", block_cache_mb=8, progress=False)
    return out


@pytest.fixture
def version_dir(exported_version, tmp_path):
    """A fresh copy of the exported version (its own store and write feed): no state of other tests."""
    out = tmp_path / "version-copy" / "m" / "1"
    out.parent.mkdir(parents=True)
    copy_version(exported_version, out)
    return out


REQUEST = {"user_id": 7}
CANDS = [{"item_id": i, "tags": [f"t{(i * 7 + k) % 20}" for k in range(1 + i % 3)]} for i in (3, 10, 42, 3, 99)]


def expected_after_write(scorer, emb0, fo0, cand_idx, value):
    """By hand: the pooled inputs from before, with the item field of the candidates
    showing that item replaced by the new row, through the dense head and calibration."""
    emb, fo = emb0.copy(), fo0.copy()
    emb[cand_idx, ITEM_FIELD] = np.linspace(-1, 1, D).astype(np.float32) * value
    fo[cand_idx, ITEM_FIELD] = value / 2
    return calibrate(DenseHead(scorer.version_dir)(emb, fo), scorer.calibration)


def start_writer(version_dir) -> StoreWriter:
    return StoreWriter(version_dir / "store")


def write_row(writer: StoreWriter, table, row, seq, value) -> float:
    """One row (the vector ``expected_after_write`` expects) fed to the followers; the writer's time after it."""
    v = np.linspace(-1, 1, D).astype(np.float32) * value
    return writer.write(table, [row], v[None, :], [value / 2], seqs=[seq], feed=True, meta={"offset": str(seq)})[1]


def wait_for_change(scorer, before, timeout_s=2.0):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        s = scorer.score(REQUEST, CANDS)
        if not np.array_equal(s, before):
            return s, time.time()
        time.sleep(0.005)
    return scorer.score(REQUEST, CANDS), None


def test_row_cache_scores_equal_uncached_scores(version_dir):
    with Scorer(version_dir) as plain, Scorer(version_dir, row_cache_mb=4) as cached:
        want = plain.score(REQUEST, CANDS)
        assert np.array_equal(cached.score(REQUEST, CANDS), want)  # cold
        st = cached.stats()
        assert st["cache_hits"] == 0 and st["cache_misses"] == st["store_rows_read"] > 0
        assert np.array_equal(cached.score(REQUEST, CANDS), want)  # warm: all from the cache
        st2 = cached.stats()
        assert st2["store_rows_read"] == st["store_rows_read"] and st2["cache_hits"] == st["cache_misses"]
        assert st2["cache_entries"] == st["store_rows_read"]
        other = [{"item_id": 5, "tags": ["t1", "zzz"]}]
        assert np.array_equal(cached.score({"user_id": 8}, other), plain.score({"user_id": 8}, other))
        assert plain.stats()["cache_hits"] == 0 and plain.stats()["catch_ups"] == 0


def test_follow_sees_a_row_written_by_another_process_within_2s(version_dir):
    spec = parse_spec(SPEC)
    rows = spec.fields[ITEM_FIELD].rows
    item_row = row_of(42, spec.model.hash, rows)
    showing = [i for i, c in enumerate(CANDS) if row_of(c["item_id"], spec.model.hash, rows) == item_row]
    assert showing == [2]
    scorer = Scorer(version_dir, store_mode="follow", row_cache_mb=16, follow_interval_s=0.05)
    proc = None
    try:
        assert scorer._follower is not None and scorer._follower._thread.is_alive()
        base = scorer.score(REQUEST, CANDS)
        assert np.array_equal(scorer.score(REQUEST, CANDS), base)  # warm cache: no store read
        emb0, fo0, _ = pooled(scorer, REQUEST, CANDS)  # the stored rows, pooled
        warm = scorer.stats()
        assert warm["cache_hits"] > 0 and warm["cache_entries"] == warm["store_rows_read"] > 0
        proc = start_writer(version_dir)
        t_write = write_row(proc, ITEM_FIELD, item_row, seq=1, value=0.75)
        new, t_seen = wait_for_change(scorer, base)
        assert t_seen is not None, "the written row did not reach the scores within 2 s"
        want = expected_after_write(scorer, emb0, fo0, showing, 0.75)
        np.testing.assert_allclose(new, want, rtol=1e-6, atol=1e-7)
        assert not np.allclose(want, base)
        after = scorer.stats()
        # the changed row came from the write feed, not from a store read;
        # the cache was not flushed
        assert after["cache_clears"] == 0
        assert after["epochs"] == 1 and after["feed_rows"] == 1 and after["feed_hits"] >= 1
        assert after["store_rows_read"] == warm["store_rows_read"]
        assert after["last_feed_poll_unix"] >= t_write - 1
        print(f"\nwrite -> visible in score: {1e3 * (t_seen - t_write):.0f} ms")
        # an older seq for the same row is ignored; a newer one lands too
        write_row(proc, ITEM_FIELD, item_row, seq=0, value=-5.0)
        write_row(proc, ITEM_FIELD, item_row, seq=2, value=-0.5)
        new2, t2 = wait_for_change(scorer, new)
        assert t2 is not None
        np.testing.assert_allclose(new2, expected_after_write(scorer, emb0, fo0, showing, -0.5), rtol=1e-6, atol=1e-7)
        polled = scorer._follower.stats()["last_feed_poll_unix"]
        wait_stats_after(scorer._follower, "last_feed_poll_unix", polled + 0.2)  # polls after both writes
        np.testing.assert_allclose(scorer.score(REQUEST, CANDS), new2, rtol=0, atol=0)
    finally:
        if proc is not None:
            proc.quit()
        scorer.close()
    assert not scorer._follower._thread.is_alive()


def test_last_catch_up_unix_moves_on_a_catch_up_not_on_every_feed_poll(tmp_path):
    """It said when the follower last polled the feed; the RocksDB view is only as fresh as
    its last catch-up (every catch_up_s), and the feed poll has its own time."""
    from offgraph.store import StoreConfig, open_store
    from offgraph.store.follower import Follower

    path = tmp_path / "s"
    with open_store(path, StoreConfig(dim=D, quant="fp32", shards=2, block_cache_mb=8), mode="w") as st:
        st.write(0, [1], np.ones((1, D), np.float32), np.ones(1, np.float32), feed=True)
        with open_store(path, mode="follow", secondary_dir=str(tmp_path / "sec")) as fol:
            f = Follower(fol, None, 0.01, catch_up_s=3600)
            try:
                first = wait_stats(f, "catch_ups", 1)
                assert first["catch_ups"] == 1 and first["last_catch_up_unix"] > 0
                later = wait_stats_after(f, "last_feed_poll_unix", first["last_catch_up_unix"] + 0.2)  # ~20 polls
                assert later["catch_ups"] == 1
                assert later["last_catch_up_unix"] == first["last_catch_up_unix"]
                assert later["last_feed_poll_unix"] > first["last_catch_up_unix"] + 0.1
            finally:
                f.stop()


def wait_stats_after(s, key, at_least, timeout_s=5.0) -> dict:
    """``s.stats()`` once its ``key`` (a time) is >= ``at_least``; AssertionError after ``timeout_s``."""
    st = wait_stats(s, key, at_least, timeout_s)
    assert st[key] >= at_least, (key, st[key], at_least)
    return st


def wait_stats(s, key, at_least, timeout_s=5.0) -> dict:
    t0 = time.time()
    while s.stats()[key] < at_least and time.time() - t0 < timeout_s:
        time.sleep(0.01)
    return s.stats()


def test_follow_maps_existing_feed_releases_covered_epochs_and_validates_args(version_dir):
    from offgraph.store import open_store

    store_dir = version_dir / "store"
    with open_store(store_dir, mode="w") as st:  # a writer before the scorer: feed epoch 1
        v, w = st.read(3, [1, 2, 3])
        st.write(3, [1, 2, 3], v + 0.5, w, feed=True)
        want_v = st.read(3, [1, 2, 3])[0]
    with Scorer(version_dir, store_mode="follow", row_cache_mb=1, follow_interval_s=0.02, catch_up_s=0.02) as s:
        base = wait_stats(s, "catch_ups", 2)
        # older epochs (earlier tests' writers) are released; the newest never is (it is
        # the live writer's), so its rows stay mapped
        assert base["catch_ups"] >= 2 and base["epochs"] == 1 and base["feed_rows"] == 3
        assert base["follow_errors"] == 0 and base["cache_clears"] == 0
        keys = combine_keys(3, [1, 2, 3])
        pos, vec, _ = s._follower.lookup(keys)
        assert sorted(pos.tolist()) == [0, 1, 2]
        np.testing.assert_array_equal(vec[np.argsort(pos)], want_v)
        # a cached copy of row 4 (read from the store), then a new writer: epoch 2, row 4 changed
        s.row_cache.insert(
            np.array([3]), np.array([4]), np.zeros((1, s.store.codec.record_bytes), np.uint8), s.row_cache.epoch
        )
        with open_store(store_dir, mode="w") as st2:
            v4, w4 = st2.read(3, [4])
            st2.write(3, [4], v4 - 0.25, w4, feed=True)
            want4 = st2.read(3, [4])[0]
        st = wait_stats(s, "epochs_released", base["epochs_released"] + 1)
        # the first writer's epoch is covered by the caught-up store: released, its 3 keys invalidated
        assert st["epochs_released"] == base["epochs_released"] + 1 and st["epochs"] == 1
        assert st["changes_applied"] == base["changes_applied"] + 3
        rows4, hits, read, _ = read_through_cache(
            s.row_cache, s.store, np.array([3], np.uint32), np.array([4]), s._follower, keys[:1] + 3
        )
        np.testing.assert_array_equal(rows4[:, :-1], want4)  # from epoch 2, not the stale cached zeros
        assert hits == 0 and read == 0
        assert st["follow_errors"] == 0 and st["cache_clears"] == 0
    with pytest.raises(ValueError, match="row_cache_mb"):
        Scorer(version_dir, row_cache_mb=-1)
    with pytest.raises(ValueError, match="follow_interval_s"):
        Scorer(version_dir, store_mode="follow", follow_interval_s=0)
    with pytest.raises(ValueError, match="catch_up_s"):
        Scorer(version_dir, store_mode="follow", catch_up_s=-1)


def _rewrite_rows(store: str, rb: int, tables: int, rows: int, stop) -> None:
    """A feed writer rewriting every row of ``tables`` tables as fast as it can."""
    from offgraph.store.feed import FeedWriter
    from offgraph.store.keys import key_array

    t = np.repeat(np.arange(tables, dtype=np.uint32), rows)
    r = np.tile(np.arange(rows, dtype=np.uint64), tables)
    keys, recs = key_array(t, r).tobytes(), np.zeros((len(r), rb), np.uint8)
    w = FeedWriter(store, rb)
    while not stop.is_set():
        w.append(keys, recs)
    w.close()


def test_a_torn_feed_read_is_a_503_not_a_500(version_dir, tmp_path):
    """Rows rewritten faster than a lookup re-reads them: a clear 503 with Retry-After
    (transient: the version stays healthy), never a 500."""
    import multiprocessing as mp
    import shutil

    import httpx
    from server_helpers import ThreadServer, score, server_config

    models = tmp_path / "models"
    shutil.copytree(version_dir, models / "m" / "1")  # its own store directory: its own feed
    spec = parse_spec(SPEC)
    srv = ThreadServer(server_config(models))
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(
        target=_rewrite_rows,
        args=(str(models / "m" / "1" / "store"), 4 * D + 4, len(spec.fields), max(f.rows for f in spec.fields), stop),
    )
    try:
        holder = srv.server.lifespan.state["server"].models.holders["m"]
        holder.current.scorer._follower.feed.torn_retries = 0  # a torn read at the first change seen
        proc.start()
        codes: dict[int, int] = {}
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            t_end = time.monotonic() + 60
            while time.monotonic() < t_end:
                r = score(c, {"request": REQUEST, "candidates": CANDS}, name="m")
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code == 503:
                    break
        assert set(codes) <= {200, 503} and codes.get(503) == 1, codes
        assert r.headers["Retry-After"] and "rewritten while this request read them: retry" in r.json()["detail"]
        assert str(tmp_path) not in r.text and holder.current.unhealthy is None
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        srv.stop()


def test_a_released_epochs_rows_are_written_through_to_the_row_cache_at_their_newest_value(version_dir):
    """Streamed rows stay hot: when their epoch is released they are in the row cache (a hit, no store
    read) at the value the writer streamed, not dropped to be read from disk again."""
    from offgraph.store import open_store

    store_dir = version_dir / "store"
    with open_store(store_dir, mode="w") as st:  # epoch 1: rows 1-3 of table 3 changed
        v, w = st.read(3, [1, 2, 3])
        st.write(3, [1, 2, 3], v + 0.5, w + 0.25, feed=True)
        want_v, want_w = st.read(3, [1, 2, 3])
    with Scorer(version_dir, store_mode="follow", row_cache_mb=1, follow_interval_s=0.02, catch_up_s=0.02) as s:
        base = wait_stats(s, "catch_ups", 2)
        with open_store(store_dir, mode="w") as st2:  # epoch 2 (another row): epoch 1 may now be released
            v9, w9 = st2.read(3, [9])
            st2.write(3, [9], v9 - 0.25, w9, feed=True)
        st = wait_stats(s, "epochs_released", base["epochs_released"] + 1)
        assert st["rows_written_through"] >= 3 and st["follow_errors"] == 0
        hit, vec, w, _ = s.row_cache.lookup(np.full(3, 3, np.uint32), np.array([1, 2, 3]))
        assert hit.all()
        np.testing.assert_array_equal(vec, want_v)
        np.testing.assert_array_equal(w, want_w)
        # and a request reads them from the cache: no store read
        _, hits, read, _ = read_through_cache(
            s.row_cache, s.store, np.full(3, 3, np.uint32), np.array([1, 2, 3]), s._follower
        )
        assert hits == 3 and read == 0

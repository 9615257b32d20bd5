"""Reads of missing rows split over the read threads, and the undecoded record reads (real RocksDB)."""

import numpy as np
import pytest

from offgraph.store import StoreConfig, get_codec, open_store
from offgraph.store.base import MIN_CHUNK_KEYS

D = 8


def rows_of(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, D)) * 0.1).astype(np.float32), (rng.standard_normal(n) * 0.1).astype(np.float32)


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_read_unique_records_are_the_encoded_rows_in_input_order(tmp_path, quant):
    cfg = StoreConfig(dim=D, quant=quant, shards=3, block_cache_mb=8)
    v, w = rows_of(500)
    want = get_codec(quant, D).encode(v, w)  # what the store was given, encoded by the codec
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(7, np.arange(500), v, w)
        rows = np.array([499, 3, 10**6, 3, 0, 250])  # one absent, one repeated, not sorted
        for parallel in (True, False):
            rec, found = st.read_unique_records(7, rows, parallel=parallel)
            assert rec.dtype == np.uint8 and rec.shape == (6, want.shape[1])
            assert found.tolist() == [True, True, False, True, True, True]
            assert np.array_equal(rec[[0, 1, 3, 4, 5]], want[[499, 3, 3, 0, 250]])
            assert not rec[2].any()
        empty, nothing = st.read_unique_records(7, np.array([], np.int64))
        assert empty.shape == (0, want.shape[1]) and nothing.shape == (0,)


def test_a_big_read_is_split_into_about_read_threads_sorted_chunks(tmp_path):
    cfg = StoreConfig(dim=D, shards=2, read_threads=8, block_cache_mb=8)
    v, w = rows_of(4000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(4000), v, w)
        rows = np.random.default_rng(1).permutation(4000)[:2000].astype(np.uint64)
        t = np.ones(len(rows), np.uint32)
        chunks = st._read_chunks(t, rows, parallel=True)
        assert 8 <= len(chunks) <= 10  # ~read_threads pieces over both shards
        pos = np.concatenate([p for _, p in chunks])
        assert np.array_equal(np.sort(pos), np.arange(len(rows)))  # every key read once
        for _, p in chunks:
            assert np.all(np.diff(rows[p].astype(np.int64)) > 0)  # key order within a chunk
        assert len(st._read_chunks(t, rows, parallel=False)) == 2  # one call a shard
        small = st._read_chunks(t[:MIN_CHUNK_KEYS], rows[:MIN_CHUNK_KEYS], parallel=True)
        assert len(small) <= 2  # a small read is not split beyond its shards
        got_v, got_w, found = st.read_unique(t, rows)
        assert found.all() and np.array_equal(got_v, v[rows]) and np.array_equal(got_w, w[rows])
    with open_store(tmp_path / "one", StoreConfig(dim=D, block_cache_mb=8), mode="w") as st:  # 1 shard, defaults
        st.write(1, np.arange(4000), v, w)
        assert len(st._read_chunks(t, rows, parallel=True)) == 8  # a single shard's keys are split too
        got_v, got_w, found = st.read_unique(t, rows)
        assert found.all() and np.array_equal(got_v, v[rows]) and np.array_equal(got_w, w[rows])


def test_the_store_read_of_a_request_is_timed(tmp_path):
    from offgraph.scoring.batch import read_through_cache

    cfg = StoreConfig(dim=D, shards=2, block_cache_mb=8)
    v, w = rows_of(300)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(2, np.arange(300), v, w)
        res = st.read_with_stats(2, np.arange(0, 300, 3))
        assert res.read_seconds > 0 and res.found_rows == 100
        t, r = np.full(50, 2, np.uint32), np.arange(50, dtype=np.uint64)
        timing: dict = {}
        got, hits, read, _ = read_through_cache(None, st, t, r, timing=timing)
        assert read == 50 and hits == 0 and timing["store_read_seconds"] > 0
        assert np.array_equal(got[:, :-1], v[:50])


def test_a_served_request_s_store_read_time_is_on_metrics(tiny_model, tmp_path):
    import re

    import httpx
    from server_helpers import ThreadServer, copy_models, score, server_config

    srv = ThreadServer(server_config(copy_models(tiny_model[0], tmp_path / "models")))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            cands = [{"movie_id": m, "genres": ["Comedy"]} for m in range(300, 340)]  # not in the warm-up
            assert score(c, {"request": {"user_id": 7}, "candidates": cands}).status_code == 200
            text = c.get("/metrics").text
        count = re.search(r'^offgraph_store_read_seconds_count\{model="ml"\} (\S+)$', text, re.M)
        total = re.search(r'^offgraph_store_read_seconds_sum\{model="ml"\} (\S+)$', text, re.M)
        assert count and float(count[1]) >= 1, text[-2000:]
        assert total and float(total[1]) > 0
    finally:
        srv.stop()

"""The embedding store against a real RocksDB (rocksdict) in tmp_path."""

import glob
import itertools
import json
import os
import re
import textwrap
import threading

import numpy as np
import pytest
from conftest import StoreWriter, run_then_kill

from offgraph.store import EmbeddingStore, StoreConfig, get_codec, open_store

D = 16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data(n, seed=0, dim=D):
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal((n, dim)) * 0.05).astype(np.float32)
    w = (rng.standard_normal(n) * 0.05).astype(np.float32)
    return v, w


def loose_bound(quant, v, w):
    """Independent per-element bound from the row itself (no codec code)."""
    if quant == "fp32":
        return np.zeros((len(v), 1))
    if quant == "fp16":
        return np.maximum(np.abs(np.concatenate([v, w[:, None]], 1)) * 2.0**-11, 2.0**-25)
    x = np.concatenate([v, w[:, None]], 1).astype(np.float64)
    return ((x.max(1) - x.min(1)) / 255 * 0.5 * 1.01 + 1e-6)[:, None]


def check_close(quant, got_v, got_w, v, w):
    b = loose_bound(quant, v, w)
    assert (np.abs(got_v - v) <= b[:, :D] if quant == "fp16" else np.abs(got_v - v) <= b).all()
    bw = b[:, D] if quant == "fp16" else b[:, 0]
    assert (np.abs(got_w - w) <= bw).all()


def chunks_of(rows, v, w, size):
    for s in range(0, len(rows), size):
        yield rows[s : s + size], v[s : s + size], w[s : s + size]


@pytest.fixture
def cfg():
    return StoreConfig(dim=D, quant="fp32", shards=4, block_cache_mb=8)


# ---------------------------------------------------------------- config / opening


def test_config_roundtrip_and_validation():
    c = StoreConfig(dim=8, quant="int8", shards=3)
    assert c.read_threads == 8  # the default, whatever the shards (keys of a shard are split over threads)
    assert StoreConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert StoreConfig(dim=8, shards=1).read_threads == 8 and StoreConfig(dim=8, shards=20).read_threads == 8
    for bad, name in [
        (dict(dim=0), "dim"),
        (dict(dim=8, quant="int4"), "quant"),
        (dict(dim=8, shards=0), "shards"),
        (dict(dim=8, block_cache_mb=0), "block_cache_mb"),
        (dict(dim=8, compression="brotli"), "compression"),
        (dict(dim=8, shard_fn="crc"), "shard_fn"),
        (dict(dim=8.0), "dim"),
    ]:
        with pytest.raises(ValueError, match=name):
            StoreConfig(**bad)
    with pytest.raises(ValueError, match="unknown setting"):
        StoreConfig.from_dict({"dim": 8, "colour": "red"})


def test_create_writes_store_json(tmp_path, cfg):
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        assert isinstance(st, EmbeddingStore)
    doc = json.loads((tmp_path / "s" / "store.json").read_text())
    # the on-disk format name every exported store carries (a renamed one would refuse them all)
    assert (doc["format"], doc["format_version"]) == ("offgraph-embstore", 1)
    assert doc["config"] == cfg.to_dict()
    assert doc["record"]["record_bytes"] == 4 * D + 4
    assert sorted(os.listdir(tmp_path / "s")) == ["shard-000", "shard-001", "shard-002", "shard-003", "store.json"]
    with open_store(tmp_path / "s") as st:  # config comes from store.json
        assert st.config == cfg and st.mode == "r"


@pytest.mark.parametrize("change", [dict(dim=8), dict(quant="int8"), dict(shards=2)])
def test_config_mismatch_on_reopen(tmp_path, cfg, change):
    open_store(tmp_path / "s", cfg, mode="w").close()
    other = StoreConfig(**{**cfg.to_dict(), **change, "read_threads": None})
    for mode in ("w", "r"):
        with pytest.raises(ValueError, match=next(iter(change))):
            open_store(tmp_path / "s", other, mode=mode)


def test_tuning_may_change_on_reopen(tmp_path, cfg):
    open_store(tmp_path / "s", cfg, mode="w").close()
    bigger = StoreConfig(**{**cfg.to_dict(), "block_cache_mb": 16})
    with open_store(tmp_path / "s", bigger, mode="r") as st:
        assert st.property_value(0, "rocksdb.block-cache-capacity") == str(16 << 20)


def test_open_errors(tmp_path, cfg):
    with pytest.raises(ValueError, match="not an embedding store"):
        open_store(tmp_path / "nothing", mode="r")
    with pytest.raises(ValueError, match="needs a StoreConfig"):
        open_store(tmp_path / "new", mode="w")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        open_store(tmp_path / "junk", cfg, mode="w")
    with pytest.raises(ValueError, match="mode"):
        open_store(tmp_path / "s", cfg, mode="rw")


# ---------------------------------------------------------------- reads and writes


@pytest.mark.parametrize("quant", ["fp32", "fp16", "int8"])
def test_write_read_round_trip(tmp_path, quant):
    cfg = StoreConfig(dim=D, quant=quant, shards=3)
    v, w = data(500, seed=1)
    rows = np.arange(1000, 1500)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(7, rows, v, w)
        order = np.random.default_rng(2).permutation(500)
        got_v, got_w = st.read(np.full(500, 7), rows[order])
        check_close(quant, got_v, got_w, v[order], w[order])
        # the store adds nothing to the codec's own round trip
        c = get_codec(quant, D)
        cv, cw = c.decode(c.encode(v[order], w[order]))
        assert np.array_equal(got_v, cv) and np.array_equal(got_w, cw)
    with open_store(tmp_path / "s", mode="r") as st:  # persisted
        got_v, _ = st.read(7, rows)
        assert np.array_equal(got_v, get_codec(quant, D).decode(get_codec(quant, D).encode(v, w))[0])


def test_absent_rows_read_as_zeros_and_duplicates(tmp_path, cfg):
    v, w = data(10)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(10), v, w)
        t = np.array([1, 1, 2, 1, 1, 1, 1, 0])
        r = np.array([3, 99, 3, 3, 0, 3, 2**50, 9])
        res = st.read_with_stats(t, r)
        assert res.rows_read == 8 and res.unique_rows == 6 and res.found_rows == 2
        want_v = np.zeros((8, D), np.float32)
        want_w = np.zeros(8, np.float32)
        for i in (0, 3, 5):
            want_v[i], want_w[i] = v[3], w[3]
        want_v[4], want_w[4] = v[0], w[0]
        assert np.array_equal(res.vectors, want_v) and np.array_equal(res.first_order, want_w)
        empty_v, empty_w = st.read(1, np.array([], dtype=np.int64))
        assert empty_v.shape == (0, D) and empty_w.shape == (0,)
        nothing_v, nothing_w = st.read(5, [1, 2, 3])
        assert not nothing_v.any() and not nothing_w.any()
        vv, found = st.read_unique([1, 1], [4, 50])[::2]
        assert found.tolist() == [True, False] and np.array_equal(vv[0], v[4])


def test_read_2d_with_table_per_column(tmp_path, cfg):
    v, w = data(30)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(np.repeat([10, 11, 12], 10), np.tile(np.arange(10), 3), v, w)
        rows = np.array([[0, 5, 9], [9, 9, 20], [3, 0, 1]])
        tables = np.array([10, 11, 12])  # one table per column (field)
        gv, gw = st.read(tables, rows)
        assert gv.shape == (3, 3, D) and gw.shape == (3, 3)
        for i in range(3):
            for j in range(3):
                k = (tables[j] - 10) * 10 + rows[i, j]
                want_v, want_w = (v[k], w[k]) if rows[i, j] < 10 else (np.zeros(D), 0.0)
                assert np.array_equal(gv[i, j], want_v) and gw[i, j] == want_w
        with pytest.raises(ValueError, match="broadcast"):
            st.read(np.array([10, 11]), rows)


def test_tables_are_separate_and_later_write_wins(tmp_path, cfg):
    v, w = data(20)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(10), v[:10], w[:10])
        st.write(2, np.arange(10), v[10:], w[10:])
        st.write([1, 1], [3, 3], v[15:17], w[15:17])  # duplicate in one call: last wins
        got_v, got_w = st.read([1, 2, 1], [2, 2, 3])
        assert np.array_equal(got_v, np.stack([v[2], v[12], v[16]]))
        assert np.array_equal(got_w, np.array([w[2], w[12], w[16]]))


def test_many_keys_over_all_shards_and_threads(tmp_path):
    cfg = StoreConfig(dim=D, quant="fp32", shards=8, read_threads=4)
    n = 20_000
    v, w = data(n, seed=3)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.bulk_load(3, chunks_of(np.arange(n), v, w, 4096))
        rng = np.random.default_rng(4)
        queries = [rng.integers(0, n + 500, 7000) for _ in range(8)]
        results = [None] * 8

        def job(i):
            results[i] = st.read(3, queries[i])

        threads = [threading.Thread(target=job, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for q, (gv, gw) in zip(queries, results):
            hit = q < n
            assert np.array_equal(gv[hit], v[q[hit]]) and np.array_equal(gw[hit], w[q[hit]])
            assert not gv[~hit].any() and not gw[~hit].any()
        per_shard = [s["estimated_keys"] for s in st.stats()["shards"]]
        assert sum(per_shard) == n and min(per_shard) > 0.8 * n / 8


def test_write_with_meta_in_same_batch(tmp_path, cfg):
    v, w = data(6)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(6), v, w, meta={b"offset": b"41"})
        assert st.get_meta_per_shard(b"offset") == [b"41"] * cfg.shards
        st.write(1, [0], v[:1], w[:1], meta={b"offset": b"42"}, meta_shards="touched")
        from offgraph.store.keys import shard_of

        s0 = int(shard_of(1, [0], cfg.shards)[0])
        got = st.get_meta_per_shard(b"offset")
        assert got[s0] == b"42" and sorted(set(got)) == [b"41", b"42"] and got.count(b"42") == 1
        st.put_meta(b"model", b"v3", shard=2)
        assert st.get_meta(b"model", shard=2) == b"v3" and st.get_meta(b"model", shard=1) is None
        # meta records are not rows
        assert st.stats(exact=True)["rows_per_table"] == {1: 6}
        # a failing write writes nothing, not even its meta
        bad = v[:2].copy()
        bad[1, 0] = np.nan
        with pytest.raises(ValueError, match="finite"):
            st.write(1, [100, 101], bad, w[:2], meta={b"offset": b"43"})
        assert b"43" not in st.get_meta_per_shard(b"offset")
        assert not st.read(1, [100])[0].any()
        with pytest.raises(ValueError, match="non-empty bytes"):
            st.write(1, [0], v[:1], w[:1], meta={"offset": b"1"})
        with pytest.raises(ValueError, match="shard must be in"):
            st.get_meta(b"offset", shard=cfg.shards)


WRITER_LOOP = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from offgraph.store import open_store
    st = open_store({path!r}, mode="w")
    i = 0
    print("ready", flush=True)
    while True:
        rows = np.arange(i * 10, i * 10 + 10)
        vec = np.full((10, {dim}), float(i), dtype=np.float32)
        st.write(1, rows, vec, np.full(10, float(i), np.float32),
                 meta={{b"offset": str(i).encode()}}, meta_shards="all")
        i += 1
    """
)


def test_batches_are_atomic_under_kill(tmp_path, cfg):
    """A writer killed with SIGKILL mid-stream: in every shard, exactly the rows of
    the batches up to that shard's recorded offset are there, and none after."""
    path = str(tmp_path / "s")
    open_store(path, cfg, mode="w").close()
    run_then_kill(WRITER_LOOP.format(root=ROOT, path=path, dim=D))
    from offgraph.store.keys import shard_of

    with open_store(path, mode="r") as st:
        offsets = [int(x) for x in st.get_meta_per_shard(b"offset")]
        assert min(offsets) > 5
        top = (max(offsets) + 3) * 10
        rows = np.arange(top)
        vec, wt = st.read(1, rows)
        batch = rows // 10
        shard = shard_of(1, rows, cfg.shards)
        applied = batch <= np.array(offsets)[shard]
        assert np.array_equal(vec[applied, 0], batch[applied].astype(np.float32))
        assert np.array_equal(wt[applied], batch[applied].astype(np.float32))
        assert not vec[~applied].any() and not wt[~applied].any()


# ---------------------------------------------------------------- bulk load


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_bulk_load_multiple_tables_moves_files(tmp_path, quant):
    cfg = StoreConfig(dim=D, quant=quant, shards=4)
    ingest = tmp_path / "ingest"
    ingest.mkdir()
    sizes = {0: 30_000, 5: 7_000, 9: 1}
    tables = {t: data(n, seed=t) for t, n in sizes.items()}
    done = []
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        moved = []  # (inode of the external file, whether it still exists after ingest)
        real_ingest = st.storage._ingest

        def spy(shard, paths):
            inodes = [os.stat(p).st_ino for p in paths]
            real_ingest(shard, paths)
            moved.extend((ino, os.path.exists(p)) for ino, p in zip(inodes, paths))

        st.storage._ingest = spy
        for t, (v, w) in tables.items():
            n = st.bulk_load(t, chunks_of(np.arange(sizes[t]), v, w, 4096), tmp_dir=str(ingest), progress=done.append)
            assert n == sizes[t]
        assert done[-1] == 1 and 30_000 in done
        assert list(ingest.iterdir()) == []  # nothing left behind
        live = [f for s in range(4) for f in glob.glob(str(tmp_path / "s" / f"shard-{s:03d}" / "*.sst"))]
        assert len(live) == 4 * 3 - 3  # one SST per shard per table (the 1-row table: one shard)
        # moved, not copied: RocksDB removed each external file, which lives on (same inode)
        assert len(moved) == len(live) and not any(still for _, still in moved)
        assert sorted(ino for ino, _ in moved) == sorted(os.stat(f).st_ino for f in live)
        stats = st.stats(exact=True)
        assert stats["rows_per_table"] == sizes
        assert not glob.glob(str(tmp_path / "s" / ".ingest-*"))
    with open_store(tmp_path / "s", mode="r") as st:
        for t, (v, w) in tables.items():
            q = np.random.default_rng(t).integers(0, sizes[t], 3000)
            gv, gw = st.read(t, q)
            check_close(quant, gv, gw, v[q], w[q])


def test_bulk_load_out_of_order_chunks_later_wins(tmp_path, cfg):
    v, w = data(3000, seed=8)
    rows = np.random.default_rng(9).permutation(3000)  # unsorted within chunks
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(2, [5, 10_000], v[:2] + 1, w[:2] + 1)  # existing rows get replaced
        st.bulk_load(2, chunks_of(rows, v[rows], w[rows], 700))
        # a second pass over part of the table: the newer values win
        st.bulk_load(2, [(np.array([7, 7, 3]), v[[0, 1, 2]], w[[0, 1, 2]])])
        gv, gw = st.read(2, np.arange(3000))
        want_v, want_w = v.copy(), w.copy()
        want_v[7], want_w[7] = v[1], w[1]  # duplicate in a chunk: last one wins
        want_v[3], want_w[3] = v[2], w[2]
        assert np.array_equal(gv, want_v) and np.array_equal(gw, want_w)
        assert np.array_equal(st.read(2, [10_000])[0][0], v[1] + 1)
        assert st.stats(exact=True)["rows_per_table"] == {2: 3001}


def test_bulk_load_in_worker_processes_equals_in_process(tmp_path):
    cfg = StoreConfig(dim=D, quant="int8", shards=4)
    n = 50_000
    v, w = data(n, seed=11)
    rows = np.arange(n)
    stores = {}
    for workers in (1, 2):
        st = stores[workers] = open_store(tmp_path / f"s{workers}", cfg, mode="w")
        # two runs in one load: the last chunk goes back in row order
        again = [(rows[:10], v[10:20], w[10:20])]
        assert st.bulk_load(1, itertools.chain(chunks_of(rows, v, w, 8192), again), workers=workers) == n + 10
    try:
        want_v, want_w = stores[1].read(1, rows)
        got_v, got_w = stores[2].read(1, rows)
        assert np.array_equal(got_v, want_v) and np.array_equal(got_w, want_w)
        c = get_codec("int8", D)
        assert np.array_equal(got_v[:10], c.decode(c.encode(v[10:20], w[10:20]))[0])
        assert stores[2].stats(exact=True)["rows_per_table"] == {1: n}
    finally:
        for st in stores.values():
            st.close()
    with pytest.raises(ValueError, match="workers"):
        with open_store(tmp_path / "s1", mode="w") as st:
            st.bulk_load(1, [], workers=0)


def test_bulk_load_rejects_bad_chunks(tmp_path, cfg):
    v, w = data(10)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        with pytest.raises(ValueError, match="table_id"):
            st.bulk_load(-1, [])
        with pytest.raises(ValueError, match="chunk"):
            st.bulk_load(1, [(np.arange(10), v)])
        with pytest.raises(ValueError, match=r"shape \[K, 16\]"):
            st.bulk_load(1, [(np.arange(10), v[:, :4], w)])
        with pytest.raises(ValueError, match="rows"):
            st.bulk_load(1, [(np.arange(9), v, w)])
        assert st.stats(exact=True)["rows_per_table"] == {}
        assert not glob.glob(str(tmp_path / "s" / ".ingest-*"))


def test_table_ids_the_write_feed_cannot_key_are_refused(tmp_path, cfg):
    """The store takes the table ids the write feed (16 table bits) takes: table 65536 used to be
    stored and put in the feed under table 0's key, so followers served it as table 0's row."""
    v, w = data(2)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        for tid in (0xFFFF, 1 << 16):
            with pytest.raises(ValueError, match=f"table id {tid} > 65534"):
                st.write([tid, tid], [1, 2], v, w, feed=True)
            with pytest.raises(ValueError, match=f"table_id must be in \\[0, 65534\\], got {tid}"):
                st.bulk_load(tid, [(np.arange(2), v, w)])
        assert st.stats(exact=True)["rows_per_table"] == {}
        st.write([0xFFFE], [1], v[:1], w[:1], feed=True)  # the last table id works
        np.testing.assert_array_equal(st.read([0xFFFE], [1])[0], v[:1])


# ---------------------------------------------------------------- RocksDB options


def _agg_props(st, shard):
    text = st.property_value(shard, "rocksdb.aggregated-table-properties")
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in text.split(";") if "=" in p)}


def _latest_options_file(shard_dir):
    files = glob.glob(os.path.join(shard_dir, "OPTIONS-*"))
    return max(files, key=lambda f: int(re.search(r"OPTIONS-(\d+)", f).group(1)))


def test_reopen_keeps_block_cache_and_bloom_filter(tmp_path):
    """rocksdict ignores Options for an existing DB's column family unless passed
    again: reopening must still give the configured cache and bloom filter."""
    cfg = StoreConfig(
        dim=D, quant="int8", shards=2, block_cache_mb=24, bloom_bits_per_key=12, optimize_filters_for_hits=False
    )
    v, w = data(4000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.bulk_load(1, chunks_of(np.arange(2000), v[:2000], w[:2000], 1000))
    for mode in ("w", "r", "follow"):
        with open_store(tmp_path / "s", mode=mode) as st:
            for s in range(2):
                assert int(st.property_value(s, "rocksdb.block-cache-capacity")) == 24 << 20
            if mode == "w":
                st.write(1, np.arange(2000, 4000), v[2000:], w[2000:])
                st.flush()  # a new SST written by the reopened DB
    with open_store(tmp_path / "s", mode="r") as st:
        for s in range(2):
            props = _agg_props(st, s)
            # every key of every SST file (bulk-loaded and flushed after reopen) is in a filter
            assert int(props["# entries"]) > 900
            assert props["# entries for filter"] == props["# entries"]
            opts = open(_latest_options_file(str(tmp_path / "s" / f"shard-{s:03d}"))).read()
            assert re.search(r"filter_policy=bloomfilter", opts)
            assert "cache_index_and_filter_blocks=true" in opts
            assert "compression=kLZ4Compression" in opts
            assert "bottommost_compression=kLZ4HCCompression" in opts
            assert re.search(r"index_type=kTwoLevelIndexSearch", opts)
            assert re.search(r"partition_filters=true", opts)
        gv, _ = st.read(1, np.arange(4000))
        check_close("int8", gv, st.read(1, np.arange(4000))[1], v, w)


def test_no_filter_in_bulk_loaded_files_by_default(tmp_path):
    """Every row of a bulk-loaded table exists: its files (the bottommost level) get no filter, while
    the live writer's flushes above them do (a filter there saves reads of keys they do not hold)."""
    cfg = StoreConfig(dim=D, quant="int8", shards=2, block_cache_mb=8)
    assert cfg.optimize_filters_for_hits
    v, w = data(4000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.bulk_load(1, chunks_of(np.arange(2000), v[:2000], w[:2000], 1000))
        for s in range(2):
            props = _agg_props(st, s)
            assert int(props["# entries"]) > 900 and int(props["# entries for filter"]) == 0
        st.write(1, np.arange(2000, 4000), v[2000:], w[2000:])
        st.flush()
    with open_store(tmp_path / "s", mode="r") as st:
        for s in range(2):
            props = _agg_props(st, s)
            assert 0 < int(props["# entries for filter"]) < int(props["# entries"])
            opts = open(_latest_options_file(str(tmp_path / "s" / f"shard-{s:03d}"))).read()
            assert "optimize_filters_for_hits=true" in opts
            assert "cache_index_and_filter_blocks=true" in opts
        gv, gw = st.read(1, np.arange(4000))
        check_close("int8", gv, gw, v, w)


def test_block_cache_stats_with_statistics(tmp_path):
    cfg = StoreConfig(dim=D, quant="int8", shards=2, block_cache_mb=8)
    v, w = data(3000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.bulk_load(0, chunks_of(np.arange(3000), v, w, 1000))
    with open_store(tmp_path / "s", mode="r") as st:
        assert st.block_cache_stats() is None  # statistics off: nothing counted
    with open_store(tmp_path / "s", cfg.replace(statistics=True), mode="r") as st:
        st.read(0, np.arange(3000))
        first = st.block_cache_stats()
        st.read(0, np.arange(3000))
        second = st.block_cache_stats()
    assert first["misses"] > 0
    assert second["misses"] == first["misses"] and second["hits"] > first["hits"]


# ---------------------------------------------------------------- modes


def test_read_only_cannot_write(tmp_path, cfg):
    v, w = data(3)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, [0, 1, 2], v, w)
    with open_store(tmp_path / "s", mode="r") as st:
        assert np.array_equal(st.read(1, [1])[0][0], v[1])
        for call in (
            lambda: st.write(1, [5], v[:1], w[:1]),
            lambda: st.put_meta(b"k", b"v"),
            lambda: st.bulk_load(1, [(np.arange(3), v, w)]),
            lambda: st.flush(),
        ):
            with pytest.raises(ValueError, match="read-only"):
                call()
        with pytest.raises(Exception, match="read only"):  # RocksDB itself refuses too
            st.storage._dbs[0].put(b"\x00" * 12, b"x")
        with pytest.raises(ValueError, match="follow"):
            st.catch_up()
    st.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        st.read(1, [1])


def test_follower_sees_live_writer_after_catch_up(tmp_path, cfg):
    path = str(tmp_path / "s")
    v, w = data(50)
    with open_store(path, cfg, mode="w") as st:
        st.bulk_load(4, [(np.arange(50), v, w)])
    with StoreWriter(path) as writer:
        with open_store(path, mode="follow", secondary_dir=str(tmp_path / "sec")) as fol:
            assert np.array_equal(fol.read(4, np.arange(50))[0], v)
            for k in (1, 2):
                rows = np.arange(k * 100, k * 100 + 100)
                assert (
                    writer.write(4, rows, np.full((100, D), k + 0.5), np.full(100, -k), meta={"offset": str(k)})[0]
                    == 100
                )
                assert not fol.read(4, rows)[0].any()  # not before catch_up
                fol.catch_up()
                gv, gw = fol.read(4, rows)
                assert (gv == k + 0.5).all() and (gw == -k).all()
                assert fol.get_meta_per_shard(b"offset") == [str(k).encode()] * cfg.shards
            with pytest.raises(ValueError, match="read-only"):
                fol.write(4, [1], v[:1], w[:1])


def test_stats(tmp_path, cfg):
    v, w = data(1000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.bulk_load(1, [(np.arange(1000), v, w)])
        st.write(2, [1, 2], v[:2], w[:2])
        s = st.stats()
        assert s["rows_per_table"] is None and s["config"] == cfg.to_dict()
        assert len(s["shards"]) == cfg.shards
        disk = sum(
            os.path.getsize(os.path.join(dp, f))
            for s_ in range(cfg.shards)
            for dp, _, fs in os.walk(tmp_path / "s" / f"shard-{s_:03d}")
            for f in fs
        )
        assert s["bytes_on_disk"] == disk
        assert sum(x["sst_bytes"] for x in s["shards"]) > 1000 * (4 * D + 4) * 0.5
        assert st.stats(exact=True)["rows_per_table"] == {1: 1000, 2: 2}


def test_store_written_before_the_filter_and_statistics_settings_still_opens(tmp_path):
    """A store.json without ``optimize_filters_for_hits`` / ``statistics`` (older stores) reads as before."""
    import json as _json

    cfg = StoreConfig(dim=D, quant="int8", shards=2, block_cache_mb=8)
    v, w = data(1000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.bulk_load(0, chunks_of(np.arange(1000), v, w, 500))
    path = tmp_path / "s" / "store.json"
    doc = _json.loads(path.read_text())
    del doc["config"]["optimize_filters_for_hits"], doc["config"]["statistics"]
    path.write_text(_json.dumps(doc))
    for mode in ("r", "follow"):
        with open_store(tmp_path / "s", mode=mode) as st:
            assert st.config.optimize_filters_for_hits and not st.config.statistics
            gv, gw = st.read(0, np.arange(1000))
            check_close("int8", gv, gw, v, w)

"""The embedding store: per-row sequence numbers, ``write(feed=True)`` and a writer process followed by
another process (real RocksDB, a real feed)."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import StoreWriter, run_then_kill

from offgraph.store import StoreConfig, WriteResult, open_store
from offgraph.store.keys import combine_keys, shard_of

D = 4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cfg():
    return StoreConfig(dim=D, quant="fp32", shards=3, block_cache_mb=8)


def vecs(vals):
    """Rows whose every value is ``vals[i]`` (fp32: read back exactly)."""
    v = np.asarray(vals, dtype=np.float32)
    return np.repeat(v[:, None], D, axis=1), v.copy()


# ---------------------------------------------------------------- sequence numbers


def test_older_seq_never_overwrites_newer(tmp_path, cfg):
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        res = st.write(1, [0, 1, 2], *vecs([10, 11, 12]), seqs=[5, 5, 5])
        assert res == WriteResult(applied=3, skipped_stale=0)
        # older (4), equal (5) and newer (6) seqs
        res = st.write(1, [0, 1, 2, 3], *vecs([20, 21, 22, 23]), seqs=[4, 5, 6, 1])
        assert res == WriteResult(applied=2, skipped_stale=2)
        v, w = st.read(1, [0, 1, 2, 3])
        assert w.tolist() == [10, 11, 22, 23] and v[:, 0].tolist() == [10, 11, 22, 23]
        assert st.row_seqs(1, [0, 1, 2, 3, 4]).tolist() == [5, 5, 6, 1, -1]
        assert st.row_seqs(2, [0]).tolist() == [-1]  # other table, same row
        # within one call the highest seq wins, wherever it is
        res = st.write(1, [7, 7, 7, 8, 8], *vecs([1, 3, 2, 4, 5]), seqs=[1, 3, 2, 9, 9])
        assert res == WriteResult(applied=2, skipped_stale=3)
        assert st.read(1, [7, 8])[1].tolist() == [3, 4]  # equal seqs: the first one (as across calls)
        assert st.row_seqs(1, [7, 8]).tolist() == [3, 9]
        # a stale duplicate in the same call as a fresh one: the fresh one is applied
        res = st.write(1, [7, 7], *vecs([30, 31]), seqs=[2, 4])
        assert res == WriteResult(applied=1, skipped_stale=1)
        assert st.read(1, [7])[1].tolist() == [31] and st.row_seqs(1, [7]).tolist() == [4]
        # writes without seqs neither read nor change the stored seqs
        res = st.write(1, [0, 9], *vecs([40, 49]))
        assert res == WriteResult(applied=2, skipped_stale=0)
        assert st.read(1, [0, 9])[1].tolist() == [40, 49]
        assert st.row_seqs(1, [0, 9]).tolist() == [5, -1]
        # seqs and rows are not counted as rows, nor in the meta key space of users
        assert st.stats(exact=True)["rows_per_table"] == {1: 7}
    with open_store(tmp_path / "s", mode="r") as ro:  # persisted
        assert ro.row_seqs(1, [0, 1, 2, 3, 7, 8]).tolist() == [5, 5, 6, 1, 4, 9]


def test_many_random_seq_writes_keep_the_max(tmp_path, cfg):
    rng = np.random.default_rng(0)
    best: dict[int, tuple[int, float]] = {}
    st = open_store(tmp_path / "s", cfg, mode="w")
    try:
        for i in range(30):
            if i % 10 == 9:  # a reopened writer knows its shards' seq watermarks from the store
                st.close()
                st = open_store(tmp_path / "s", cfg, mode="w")
            rows = rng.integers(0, 40, 25)
            seqs = rng.integers(0, 1000, 25)
            vals = rng.standard_normal(25).astype(np.float32)
            in_call: dict[int, tuple[int, float]] = {}  # highest seq per row (equal: the first)
            for r, s, x in zip(rows.tolist(), seqs.tolist(), vals.tolist()):
                if r not in in_call or s > in_call[r][0]:
                    in_call[r] = (s, x)
            applied = 0
            for r, (s, x) in in_call.items():
                if r not in best or s > best[r][0]:  # stored seq >= new: skipped
                    best[r] = (s, x)
                    applied += 1
            res = st.write(5, rows, *vecs(vals), seqs=seqs)
            assert res.applied == applied and res.skipped_stale == 25 - applied
        keys = sorted(best)
        assert st.row_seqs(5, keys).tolist() == [best[k][0] for k in keys]
        assert st.read(5, keys)[1].tolist() == pytest.approx([best[k][1] for k in keys])
    finally:
        st.close()


def _count_seq_reads(st, monkeypatch) -> list[int]:
    """Spy on the store's reads: how many stored row seqs each write looked up."""
    from offgraph.store.internal_keys import SEQ_PREFIX

    looked: list[int] = []
    real = st.storage._multi_get

    def spy(shard, keys):
        looked.append(sum(k.startswith(SEQ_PREFIX) for k in keys))
        return real(shard, keys)

    monkeypatch.setattr(st.storage, "_multi_get", spy)
    return looked


def test_increasing_seqs_read_no_stored_seq_and_lower_ones_still_lose(tmp_path, cfg, monkeypatch):
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(50), *vecs(np.zeros(50)), seqs=np.arange(100, 150))  # learns the watermarks
        looked = _count_seq_reads(st, monkeypatch)
        for k in range(5):  # increasing seqs, as stream-train numbers them: nothing to read back
            res = st.write(1, np.arange(50), *vecs(np.full(50, k + 1.0)), seqs=np.arange(200 + 50 * k, 250 + 50 * k))
            assert res == WriteResult(applied=50, skipped_stale=0)
        assert sum(looked) == 0
        # at or below a shard's watermark the stored seq is read and decides
        res = st.write(1, [0, 1, 99], *vecs([7, 7, 7]), seqs=[120, 10_000, 5])
        assert res == WriteResult(applied=2, skipped_stale=1)
        assert sum(looked) >= 2  # rows 0 and 99 are below their shard's watermark
        assert st.read(1, [0, 1, 99])[1].tolist() == [5, 7, 7]


def test_a_store_without_watermark_records_finds_them_from_its_seqs(tmp_path, cfg):
    """A store written before watermarks were kept (their records deleted here) must not
    let an older seq win: the writer derives each shard's watermark from its seq records."""
    from offgraph.store.internal_keys import SEQ_WATERMARK_KEY

    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(2, np.arange(30), *vecs(np.ones(30)), seqs=np.full(30, 500))
        for db in st.storage._dbs:  # the shards' RocksDB instances
            assert db.get(SEQ_WATERMARK_KEY) is not None
            db.delete(SEQ_WATERMARK_KEY)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        res = st.write(2, np.arange(30), *vecs(np.full(30, 9.0)), seqs=np.full(30, 400))
        assert res == WriteResult(applied=0, skipped_stale=30)
        res = st.write(2, [3], *vecs([8.0]), seqs=[501])
        assert res == WriteResult(applied=1, skipped_stale=0)
        assert st.read(2, [2, 3])[1].tolist() == [1, 8]


def test_seq_and_meta_validation(tmp_path, cfg):
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        with pytest.raises(ValueError, match="one sequence number per row"):
            st.write(1, [0, 1], *vecs([1, 2]), seqs=[1])
        with pytest.raises(ValueError, match="seqs must be >= 0"):
            st.write(1, [0], *vecs([1]), seqs=[-1])
        with pytest.raises(ValueError, match="seqs must be integers"):
            st.write(1, [0], *vecs([1]), seqs=[1.5])
        with pytest.raises(ValueError, match="reserved"):
            st.write(1, [0], *vecs([1]), meta={b"\x00s": b"x"})
        with pytest.raises(ValueError, match="reserved"):
            st.put_meta(b"\x00C", b"x")
        with pytest.raises(ValueError, match="feed must be a bool"):
            st.write(1, [0], *vecs([1]), feed=1)
        assert st.row_seqs(1, [0]).tolist() == [-1]  # nothing was written
    with open_store(tmp_path / "s", mode="r") as ro:
        with pytest.raises(ValueError, match="read-only"):
            ro.write(1, [0], *vecs([1]), feed=True)


# ---------------------------------------------------------------- feed=True


def fed(store, table, rows) -> dict[int, float]:
    """row -> first-order weight of the rows of ``table`` that the store's write feed holds."""
    reader = store.feed_reader()
    reader.refresh()
    rows = np.asarray(rows)
    pos, recs = reader.lookup(combine_keys(table, rows))
    _, w = store.codec.decode(recs)
    return dict(zip(rows[pos].tolist(), w.tolist()))


def test_feed_true_feeds_exactly_the_applied_rows(tmp_path, cfg):
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(5), *vecs(np.arange(5)))  # feed not asked: nothing fed
        assert fed(st, 1, np.arange(5)) == {}
        st.write(2, [1, 2], *vecs([1, 2]), seqs=[10, 10], feed=True)
        res = st.write(2, [1, 2, 3, 3], *vecs([5, 6, 7, 8]), seqs=[9, 11, 1, 2], feed=True)
        assert res == WriteResult(applied=2, skipped_stale=2)
        # the stale row 1 keeps its fed value; row 3's highest seq wins in the feed as in the store
        assert fed(st, 2, [0, 1, 2, 3]) == {1: 1.0, 2: 6.0, 3: 8.0}
        assert st.read(2, [1, 2, 3])[1].tolist() == [1.0, 6.0, 8.0]
        assert fed(st, 1, np.arange(5)) == {}


def test_follower_in_another_process_sees_fed_rows_at_once_and_stored_rows_after_catch_up(tmp_path, cfg):
    path = str(tmp_path / "s")
    open_store(path, cfg, mode="w").close()
    with StoreWriter(path) as writer:
        with open_store(path, mode="follow", secondary_dir=str(tmp_path / "sec")) as fol:
            for table in (1, 2, 3):
                rows = sorted({int(x) for x in np.random.default_rng(table).integers(0, 10**9, 40)})
                v, w = vecs(np.full(len(rows), table))
                assert writer.write(
                    table, rows, v, w, seqs=[table] * len(rows), feed=True, meta={"offset": str(table)}
                )[0] == len(rows)
                assert fed(fol, table, rows) == dict.fromkeys(rows, float(table))  # in the feed at once
                assert not fol.read(table, rows)[1].any()  # not in the store view before catch_up
                fol.catch_up()
                # the rows and their seqs are visible together (same batch)
                assert (fol.read(table, rows)[1] == table).all()
                assert (fol.row_seqs(table, rows) == table).all()
                assert fol.get_meta_per_shard(b"offset") == [str(table).encode()] * cfg.shards


KILLED_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from offgraph.store import open_store
    st = open_store({path!r}, mode="w")
    print("ready", flush=True)
    i = 1
    while True:
        rows = np.arange(i * 7, i * 7 + 7) % 50
        v = np.full((7, {dim}), float(i), np.float32)
        st.write(1, rows, v, v[:, 0], seqs=np.full(7, i), feed=True,
                 meta={{b"offset": str(i).encode()}})
        i += 1
    """
)


def test_rows_seqs_and_offsets_are_one_atomic_batch_under_kill(tmp_path, cfg):
    """A writer killed mid-stream: in every shard, each row's value and seq agree and are
    those of the newest batch up to the shard's recorded source offset (same batches)."""
    path = str(tmp_path / "s")
    open_store(path, cfg, mode="w").close()
    run_then_kill(KILLED_WRITER.format(root=ROOT, path=path, dim=D))
    with open_store(path, mode="r") as st:
        offsets = [int(x) for x in st.get_meta_per_shard(b"offset")]
        assert min(offsets) > 5
        rows = np.arange(50)
        _, w = st.read(1, rows)
        seqs = st.row_seqs(1, rows)
        assert np.array_equal(w, seqs.astype(np.float32))  # value and seq from the same batch
        shard = shard_of(1, rows, cfg.shards)
        for s in range(cfg.shards):
            batches = [np.arange(i * 7, i * 7 + 7) % 50 for i in range(1, offsets[s] + 1)]
            mine = [b[shard[b] == s] for b in batches]  # rows of batch i in shard s
            # every row has the seq (and value) of the newest batch that wrote it
            for row in rows[shard == s].tolist():
                writers = [i + 1 for i, m in enumerate(mine) if row in m]
                assert seqs[row] == (max(writers) if writers else -1), (s, row)


_WRITER_SESSION = textwrap.dedent("""
    import sys, numpy as np
    from offgraph.store import open_store
    s = open_store(sys.argv[1], mode="w")
    rows = np.arange(200, dtype=np.int64)
    s.write(np.zeros(200, np.uint32), rows, np.full((200, 4), float(sys.argv[2]), np.float32),
            np.zeros(200, np.float32), feed=True)
    s.close()
""")


def test_follower_keeps_up_when_the_writer_process_restarts(tmp_path, cfg):
    """Each round is a NEW writer process (an updater restart) while the follower catches
    up continuously in a thread: every round's rows must become visible in every shard."""
    path = str(tmp_path / "st")
    open_store(path, cfg, mode="w").close()
    follower = open_store(path, mode="follow")
    stop = threading.Event()

    def catch_up_loop():
        while not stop.is_set():
            follower.catch_up()
            stop.wait(0.005)

    t = threading.Thread(target=catch_up_loop, daemon=True)
    t.start()
    try:
        for rnd in range(1, 7):
            subprocess.run([sys.executable, "-c", _WRITER_SESSION, path, str(rnd)], check=True, timeout=60)
            deadline = time.monotonic() + 3.0
            while True:
                v, _ = follower.read(np.zeros(200, np.uint32), np.arange(200))
                stale = int((v[:, 0] != rnd).sum())
                if stale == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert stale == 0, f"round {rnd}: {stale} of 200 rows still stale 3 s after the writer closed"
    finally:
        stop.set()
        t.join(5)
        follower.close()


def test_flush_durability_persists_without_wal_and_reaches_followers(tmp_path, cfg):
    path = str(tmp_path / "st")
    st = open_store(path, cfg, mode="w")
    follower = open_store(path, mode="follow")
    v, w = vecs([1.5, 2.5, 3.5])
    st.write(np.zeros(3, np.uint32), np.array([4, 5, 6]), v, w, seqs=np.array([1, 1, 1]), feed=True, durability="flush")
    with pytest.raises(ValueError, match="durability must be one of"):
        st.write(np.zeros(1, np.uint32), np.array([1]), v[:1], w[:1], durability="fast")
    follower.catch_up()
    got, _ = follower.read(np.zeros(3, np.uint32), np.array([4, 5, 6]))
    np.testing.assert_array_equal(got, v)
    # nothing is in the WAL: the rows are in SST files already
    wal_bytes = sum(
        os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs if f.endswith(".log")
    )
    assert wal_bytes == 0
    follower.close()
    st.close()
    with open_store(path, mode="r") as ro:
        np.testing.assert_array_equal(ro.read(np.zeros(3, np.uint32), np.array([4, 5, 6]))[0], v)


META_ONLY_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from offgraph.store import StoreConfig, open_store
    st = open_store({path!r}, StoreConfig(dim={dim}, quant="fp32", shards=3), mode="w")
    v = np.full((1, {dim}), 7.0, np.float32)
    st.write(1, [0], v, v[:, 0], seqs=[1], meta={{b"pos": b"f1"}}, meta_shards="all", durability="flush")
    print("ready", flush=True)
    import time; time.sleep(60)
    """
)


def test_flush_durability_flushes_row_shards_and_logs_meta_only_ones(tmp_path, cfg):
    """durability="flush": the shard that got the row is flushed into an SST file; the shards that
    got only the meta record are not flushed (no SST file, no fsyncs) but go through the WAL, so a
    SIGKILL loses none of it."""
    import glob

    path = str(tmp_path / "s")
    run_then_kill(META_ONLY_WRITER.format(root=ROOT, path=path, dim=D), seconds=0.1)
    row_shard = int(shard_of(np.array([1], np.uint32), np.array([0]), 3)[0])
    ssts = [len(glob.glob(os.path.join(path, f"shard-{s:03d}", "*.sst"))) for s in range(3)]
    assert ssts[row_shard] == 1 and sum(ssts) == 1, ssts
    with open_store(path, mode="r") as st:
        assert st.get_meta_per_shard(b"pos") == [b"f1"] * 3
        assert st.read(1, [0])[1].tolist() == [7.0] and st.row_seqs(1, [0]).tolist() == [1]

"""embstore: per-row sequence numbers and the per-shard change log (real RocksDB)."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import StdinWriter, run_then_kill

from embstore import StoreConfig, WriteResult, open_store
from embstore.keys import shard_of

D = 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cfg():
    return StoreConfig(dim=D, quant="fp32", shards=3, block_cache_mb=8)


def vecs(vals):
    """Rows whose every value is ``vals[i]`` (fp32: read back exactly)."""
    v = np.asarray(vals, dtype=np.float32)
    return np.repeat(v[:, None], D, axis=1), v.copy()


def keyset(tids, rows):
    return sorted(zip(np.asarray(tids).tolist(), np.asarray(rows).tolist()))


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
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        for _ in range(30):
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
        with pytest.raises(ValueError, match="after must be an int >= 0"):
            st.changes_since(0, -1)
        with pytest.raises(ValueError, match="shard must be in"):
            st.changes_since(cfg.shards, 0)
        with pytest.raises(ValueError, match="max_records"):
            st.changes_since(0, 0, max_records=0)
        assert st.row_seqs(1, [0]).tolist() == [-1]  # nothing was written
    with open_store(tmp_path / "s", mode="r") as ro:
        with pytest.raises(ValueError, match="read-only"):
            ro.trim_changelog()


# ---------------------------------------------------------------- change log


def expected_per_shard(tids, rows, shards):
    sh = shard_of(np.broadcast_to(tids, np.shape(rows)), rows, shards)
    t = np.broadcast_to(tids, np.shape(rows))
    return {s: sorted(set(keyset(np.asarray(t)[sh == s], np.asarray(rows)[sh == s]))) for s in range(shards)}


def test_changes_since_returns_exactly_the_written_keys_per_shard(tmp_path, cfg):
    S = cfg.shards
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        assert [st.last_change_id(s) for s in range(S)] == [0] * S
        st.write(1, np.arange(20), *vecs(np.arange(20)))  # no change log asked: no record
        assert [st.last_change_id(s) for s in range(S)] == [0] * S
        rows1 = np.arange(30)
        st.write(2, rows1, *vecs(rows1), changelog=True, meta={b"offset": b"1"})
        rows2 = np.array([3, 3, 100, 101, 2**40])
        st.write(3, rows2, *vecs(np.arange(5)), changelog=True)
        exp1, exp2 = expected_per_shard(2, rows1, S), expected_per_shard(3, rows2, S)
        for s in range(S):
            n_rec = bool(exp1[s]) + bool(exp2[s])
            assert st.last_change_id(s) == n_rec
            got_id, t, r = st.changes_since(s, 0)
            assert got_id == n_rec and t.dtype == np.uint32 and r.dtype == np.int64
            assert keyset(t, r) == sorted(exp1[s] + exp2[s])  # rows2's duplicate 3 listed once
            if exp1[s] and exp2[s]:
                got_id, t, r = st.changes_since(s, 1)
                assert got_id == 2 and keyset(t, r) == exp2[s]
                got_id, t, r = st.changes_since(s, 0, max_records=1)
                assert got_id == 1 and keyset(t, r) == exp1[s]
            got_id, t, r = st.changes_since(s, n_rec)  # nothing newer
            assert got_id == n_rec and len(t) == len(r) == 0
        # stale rows are not logged; a batch that applies nothing logs nothing
        before = [st.last_change_id(s) for s in range(S)]
        st.write(4, [1, 2], *vecs([1, 2]), seqs=[10, 10], changelog=True)
        mid = [st.last_change_id(s) for s in range(S)]
        res = st.write(4, [1, 2, 3], *vecs([5, 5, 5]), seqs=[9, 11, 1], changelog=True,
                       meta={b"offset": b"2"})
        assert res == WriteResult(applied=2, skipped_stale=1)
        logged = []
        for s in range(S):
            _, t, r = st.changes_since(s, mid[s])
            logged += keyset(t, r)
            assert st.last_change_id(s) - mid[s] == (len(r) > 0)
        assert sorted(logged) == [(4, 2), (4, 3)]
        assert sum(mid) - sum(before) == len({int(x) for x in shard_of(4, [1, 2], S)})
        assert st.get_meta_per_shard(b"offset") == [b"2"] * S


def test_change_ids_continue_after_reopen_and_trim(tmp_path, cfg):
    path = tmp_path / "s"
    S = cfg.shards
    with open_store(path, cfg, mode="w") as st:
        for i in range(6):
            st.write(1, np.arange(i * 10, i * 10 + 10), *vecs(np.arange(10)), changelog=True)
        last = [st.last_change_id(s) for s in range(S)]
        assert last == [6] * S  # 10 consecutive rows touch every one of 3 shards
    with open_store(path, mode="w") as st:
        st.write(1, np.arange(60, 70), *vecs(np.arange(10)), changelog=True)
        assert [st.last_change_id(s) for s in range(S)] == [7] * S
        st.trim_changelog(keep=3)
        for s in range(S):
            assert st.oldest_change_id(s) == 5 and st.last_change_id(s) == 7
            got, t, r = st.changes_since(s, 0)  # only records 5..7 are left
            assert got == 7
            exp = expected_per_shard(1, np.arange(40, 70), S)[s]
            assert keyset(t, r) == exp
        st.trim_changelog(keep=0)
        assert [st.oldest_change_id(s) for s in range(S)] == [0] * S
        assert [st.changes_since(s, 0)[0] for s in range(S)] == [0] * S
        assert [st.last_change_id(s) for s in range(S)] == [7] * S  # ids are never reused
        st.write(1, np.arange(10), *vecs(np.arange(10)), changelog=True)
        assert [st.oldest_change_id(s) for s in range(S)] == [8] * S
        assert st.stats(exact=True)["rows_per_table"] == {1: 70}  # trimming never touches rows


CHANGE_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from embstore import open_store
    st = open_store({path!r}, mode="w")
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "write":  # write TABLE ROW ROW ...
            rows = np.array([int(x) for x in cmd[2:]])
            v = np.full((len(rows), {dim}), float(cmd[1]), np.float32)
            res = st.write(int(cmd[1]), rows, v, v[:, 0], seqs=np.full(len(rows), int(cmd[1])),
                           changelog=True, meta={{b"offset": cmd[1].encode()}})
            print("written", res.applied, flush=True)
        elif cmd[0] == "trim":
            st.trim_changelog(keep=int(cmd[1]))
            print("trimmed", flush=True)
        else:
            break
    st.close()
    """
)


def test_follower_in_another_process_sees_changes_after_catch_up(tmp_path, cfg):
    path = str(tmp_path / "s")
    S = cfg.shards
    open_store(path, cfg, mode="w").close()
    with StdinWriter(CHANGE_WRITER.format(root=ROOT, path=path, dim=D)) as writer:
        send = writer.send
        with open_store(path, mode="follow", secondary_dir=str(tmp_path / "sec")) as fol:
            seen = [fol.last_change_id(s) for s in range(S)]
            assert seen == [0] * S
            written: list[list[tuple[int, int]]] = []
            for table in (1, 2, 3):
                rows = sorted({int(x) for x in np.random.default_rng(table).integers(0, 10**9, 40)})
                assert send("write %d %s" % (table, " ".join(map(str, rows))), "written")[1] == str(len(rows))
                written.append([(table, r) for r in rows])
                # not visible before catch_up
                assert [fol.changes_since(s, seen[s])[0] for s in range(S)] == seen
                fol.catch_up()
                got_all = []
                for s in range(S):
                    got, t, r = fol.changes_since(s, seen[s])
                    assert got == seen[s] + 1 == fol.last_change_id(s)
                    keys = keyset(t, r)
                    assert keys == expected_per_shard(table, rows, S)[s]
                    got_all += keys
                    seen[s] = got
                assert sorted(got_all) == written[-1]
                # the rows and seqs of the logged keys are visible too (same batch)
                assert (fol.read(table, rows)[1] == table).all()
                assert (fol.row_seqs(table, rows) == table).all()
            send("trim 1", "trimmed")
            fol.catch_up()
            for s in range(S):
                assert fol.oldest_change_id(s) == 3
                got, t, r = fol.changes_since(s, 0)
                assert got == 3 and keyset(t, r) == expected_per_shard(3, [k[1] for k in written[2]], S)[s]


KILLED_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from embstore import open_store
    st = open_store({path!r}, mode="w")
    print("ready", flush=True)
    i = 1
    while True:
        rows = np.arange(i * 7, i * 7 + 7) % 50
        v = np.full((7, {dim}), float(i), np.float32)
        st.write(1, rows, v, v[:, 0], seqs=np.full(7, i), changelog=True,
                 meta={{b"offset": str(i).encode()}})
        i += 1
    """
)


def test_rows_seqs_and_change_records_are_one_atomic_batch_under_kill(tmp_path, cfg):
    """A writer killed mid-stream: in every shard, each row's value, its seq and the
    newest change record naming it agree, and the change log ends at the shard's
    recorded source offset (all written in the same batches)."""
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
            touched = [i + 1 for i, m in enumerate(mine) if len(m)]
            # one record per batch that touched the shard, none after its offset
            assert st.last_change_id(s) == len(touched) > 0
            got, t, r = st.changes_since(s, 0)
            assert got == len(touched)
            assert sorted(r.tolist()) == sorted(np.concatenate(mine).tolist()) and (t == 1).all()
            # every row has the seq (and value) of the newest batch that wrote it
            for row in rows[shard == s].tolist():
                writers = [i + 1 for i, m in enumerate(mine) if row in m]
                assert seqs[row] == (max(writers) if writers else -1), (s, row)


_WRITER_SESSION = textwrap.dedent("""
    import sys, numpy as np
    from embstore import open_store
    s = open_store(sys.argv[1], mode="w")
    rows = np.arange(200, dtype=np.int64)
    s.write(np.zeros(200, np.uint32), rows, np.full((200, 4), float(sys.argv[2]), np.float32),
            np.zeros(200, np.float32), changelog=True)
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
    st.write(np.zeros(3, np.uint32), np.array([4, 5, 6]), v, w, seqs=np.array([1, 1, 1]), changelog=True,
             durability="flush")
    with pytest.raises(ValueError, match="durability must be one of"):
        st.write(np.zeros(1, np.uint32), np.array([1]), v[:1], w[:1], durability="fast")
    follower.catch_up()
    got, _ = follower.read(np.zeros(3, np.uint32), np.array([4, 5, 6]))
    np.testing.assert_array_equal(got, v)
    # nothing is in the WAL: the rows are in SST files already
    wal_bytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs
                    if f.endswith(".log"))
    assert wal_bytes == 0
    follower.close()
    st.close()
    with open_store(path, mode="r") as ro:
        np.testing.assert_array_equal(ro.read(np.zeros(3, np.uint32), np.array([4, 5, 6]))[0], v)

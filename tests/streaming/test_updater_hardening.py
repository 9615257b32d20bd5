"""The updater never dies on input, and a full disk is a clear error that loses nothing
(real exports, real RocksDB, `offgraph update` as a subprocess)."""

import json
import os
import random
import signal
import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from streaming_helpers import (
    DIM,
    NAME,
    REPO,
    assert_store_holds,
    export_tiny,
    install_version,
    kill_at_a_random_point,
    last_write_wins,
    make_deltas,
    mount_tmpfs,
    open_version_store,
    publish,
    run_update,
    spool_files,
    train_tiny,
    update_cmd,
)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """quant -> an exported MODELS/tiny/1 of one tiny run (fp32, fp16, int8; 4 shards)."""
    root = tmp_path_factory.mktemp("hardening")
    run = train_tiny(root)
    return {q: export_tiny(run, root / q / NAME / "1", q) for q in ("fp32", "fp16", "int8")}


# --------------------------------------------------------------------------- raw files
def raw_delta(path, cols: dict, meta: dict | None = None):
    """Write an Arrow IPC file with exactly these columns/metadata (pyarrow only: no checks of ours)."""
    meta = {"offgraph.delta.version": "1", "model": NAME, "model_version": "1", "dim": str(DIM), **(meta or {})}
    table = pa.table(cols).replace_schema_metadata({k: v for k, v in meta.items() if v is not None})
    with open(path, "wb") as f, ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return path


def raw_cols(d: dict, **override) -> dict:
    """Arrow columns of a ``make_deltas`` dict, with any column replaced by ``override``."""
    k = len(d["rows"])
    v = np.asarray(d["vectors"], np.float32)
    cols = {
        "table_id": pa.array(np.asarray(d["table_ids"], np.uint32)),
        "row": pa.array(np.asarray(d["rows"], np.int64)),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]),
        "first_order": pa.array(np.asarray(d["first_order"], np.float32)),
        "seq": pa.array(np.asarray(d["seqs"], np.int64)),
        "event_time_ms": pa.array(np.full(k, int(time.time() * 1000), np.int64)),
    }
    cols.update(override)
    return {c: x for c, x in cols.items() if x is not None}


def spool_path(spool, i: int):
    spool.mkdir(parents=True, exist_ok=True)
    return spool / f"{i:020d}-0000000-000000.delta.arrow"


def reasons(spool) -> dict[str, str]:
    return {p.name[: -len(".reason.txt")]: p.read_text() for p in (spool / "dead").glob("*.reason.txt")}


# --------------------------------------------------------------------------- what a record format holds
@pytest.mark.parametrize(
    "quant,column,at,value,rule",
    [
        ("fp32", "vector", (3, 5), np.nan, "finite"),
        ("fp32", "first_order", 6, -np.inf, "finite"),
        ("fp16", "vector", (0, 1), 65505.0, "65504"),
        ("fp16", "first_order", 9, np.inf, "65504"),
        ("int8", "vector", (8, 7), -70000.0, "65504"),
        ("int8", "first_order", 2, 1e6, "65504"),
    ],
)
def test_check_storable_names_column_delta_and_value(quant, column, at, value, rule):
    from offgraph.store.quant import get_codec

    codec = get_codec(quant, DIM)
    v = np.random.default_rng(0).uniform(-65504, 65504, (10, DIM)).astype(np.float32)  # the edges are fine
    v[0, 0], v[1, 1] = 65504.0, -65504.0
    w = np.full(10, 65504.0, np.float32)
    assert codec.check_storable(v, w) is None
    codec.encode(v, w)  # and storable
    (v if column == "vector" else w)[at] = value
    why = codec.check_storable(v, w)
    where = f"delta {at[0]}, element {at[1]}" if column == "vector" else f"delta {at}"
    for want in (f"{quant} records", rule, f"column '{column}'", where, repr(float(value))):
        assert want in why, (want, why)
    with pytest.raises(ValueError, match=f"column '{column}'"):  # the store refuses with the same words
        codec.encode(v, w)


# --------------------------------------------------------------------------- item 1: one bad file
@pytest.mark.parametrize("quant,column", [("int8", "vector"), ("fp16", "first_order")])
def test_value_beyond_the_record_format_is_dead_lettered_and_its_batch_applied(exports, tmp_path, quant, column):
    models, spool = tmp_path / "models", tmp_path / "spool"
    vdir = install_version(exports[quant], models, 1)
    rng = np.random.default_rng(5)
    a, b = make_deltas(rng, 200, seq0=100, hot=3000), make_deltas(rng, 200, seq0=1000, hot=3000)
    bad = make_deltas(rng, 50, seq0=5000, tables=0)
    bad["rows"] = 10000 + np.arange(50)  # rows no good file touches
    if column == "vector":
        bad["vectors"][7, 3] = 70000.0
    else:
        bad["first_order"][7] = -1.5e5
    fa, fbad, fb = publish(spool, 1, a), publish(spool, 1, bad), publish(spool, 1, b)
    for _attempt in range(2):  # a restart finds nothing left to trip over
        p = run_update(models, spool, "--once")
        assert p.returncode == 0, p.stderr[-3000:]
    assert spool_files(spool) == [] and spool_files(spool / "applied") == sorted([fa.name, fb.name])
    assert spool_files(spool / "dead") == [fbad.name]
    why = reasons(spool)[fbad.name]
    value = "70000" if column == "vector" else "-150000"
    for want in (fbad.name, f"column '{column}'", "delta 7", value, quant, "65504"):
        assert want in why, (want, why)
    et, er, es, ev, ew = last_write_wins([a, b])
    with open_version_store(vdir) as st:
        np.testing.assert_array_equal(st.row_seqs(et, er), es)
        v, w = st.read(et, er)
        if quant == "fp16":  # exact after the fp16 cast
            np.testing.assert_array_equal(v, ev.astype(np.float16).astype(np.float32))
        else:  # int8: within the row's range / 255 (the row-wise affine bound, with fp16 rounding slack)
            x = np.concatenate([ev, ew[:, None]], axis=1)
            tol = (x.max(1) - x.min(1)) / 255 * 0.5 + np.abs(x).max(1) * 2.0**-9
            assert (np.abs(v - ev) <= tol[:, None]).all()
        assert (st.row_seqs(np.zeros(50, np.uint32), bad["rows"]) == -1).all()


def test_huge_schema_dim_is_dead_lettered(exports, tmp_path):
    models, spool = tmp_path / "models", tmp_path / "spool"
    install_version(exports["fp32"], models, 1)
    rng = np.random.default_rng(6)
    good = make_deltas(rng, 20, seq0=1)
    huge = raw_delta(spool_path(spool, 1), raw_cols(good), {"dim": "99999999999"})
    fgood = publish(spool, 1, good)
    p = run_update(models, spool, "--once")
    assert p.returncode == 0, p.stderr[-3000:]
    assert spool_files(spool / "dead") == [huge.name] and spool_files(spool / "applied") == [fgood.name]
    why = reasons(spool)[huge.name]
    assert huge.name in why and "99999999999" in why and "'dim'" in why, why


def test_a_file_the_store_refuses_after_all_checks_is_found_alone(exports, tmp_path):
    """Should a check of the updater miss a value the store refuses (simulated: the checks
    think the int8 store is fp32), the batch is retried file by file: the one file goes to
    the dead letters, the others are applied."""
    import dataclasses

    from streaming_helpers import updater

    from offgraph.store.quant import get_codec

    models, spool = tmp_path / "models", tmp_path / "spool"
    vdir = install_version(exports["int8"], models, 1)
    rng = np.random.default_rng(9)
    a, b = make_deltas(rng, 100, seq0=10, hot=3000), make_deltas(rng, 100, seq0=500, hot=3000)
    bad = make_deltas(rng, 10, seq0=900, tables=0)
    bad["rows"] = 10000 + np.arange(10)
    bad["vectors"][2, 2] = -80000.0
    fa, fbad, fb = publish(spool, 1, a), publish(spool, 1, bad), publish(spool, 1, b)
    up = updater(models, spool)
    up.start()
    up.live.limits = dataclasses.replace(up.live.limits, codec=get_codec("fp32", DIM))
    summary = up.run(once=True)
    assert summary["files_applied"] == 2 and summary["files_dead_lettered"] == 1, summary
    assert spool_files(spool / "applied") == [fa.name, fb.name] and spool_files(spool / "dead") == [fbad.name]
    why = reasons(spool)[fbad.name]
    assert "the store refused it" in why and "-80000" in why and "column 'vector'" in why, why
    et, er, es, *_ = last_write_wins([a, b])
    with open_version_store(vdir) as st:
        np.testing.assert_array_equal(st.row_seqs(et, er), es)
        assert (st.row_seqs(np.zeros(10, np.uint32), bad["rows"]) == -1).all()
        assert st.get_meta_per_shard(b"spool_position") == [fb.name.encode()] * 4


def test_a_bad_file_with_a_longest_name_is_dead_lettered(exports, tmp_path):
    """``<name>.reason.txt`` would be longer than a file name may be (was: ENAMETOOLONG, the
    updater stopped on every restart)."""
    from streaming_helpers import updater

    models, spool = tmp_path / "models", tmp_path / "spool"
    install_version(exports["fp32"], models, 1)
    name = "0" * 20 + "-" + "x" * (255 - 21 - len(".delta.arrow")) + ".delta.arrow"
    assert len(name) == 255
    (spool_path(spool, 0)).write_bytes(b"junk")
    os.rename(spool_path(spool, 0), spool / name)
    good = publish(spool, 1, make_deltas(np.random.default_rng(3), 10, seq0=1))
    summary = updater(models, spool).run(once=True)
    assert summary["files_dead_lettered"] == 1 and summary["files_applied"] == 1, summary
    assert spool_files(spool / "dead") == [name] and spool_files(spool / "applied") == [good.name]
    (why,) = (spool / "dead").glob("*.reason.txt")
    assert len(why.name) <= 255 and f"{name}: malformed delta file" in why.read_text()


@pytest.mark.parametrize("row0", [7, 1 << 40])  # the combined-key sort and the three-key one
def test_equal_seq_duplicates_are_refused_distinct_seqs_are_not(tmp_path, row0):
    from offgraph.streaming.deltas import DeltaFormatError, write_delta_file
    from offgraph.streaming.deltas import read as read_delta_file

    k = 50
    d = dict(
        table_ids=np.arange(k, dtype=np.uint32) % 3,
        rows=row0 + np.arange(k) // 3,
        seqs=np.arange(k) % 4,
        vectors=np.zeros((k, DIM), np.float32),
        first_order=np.zeros(k, np.float32),
        event_time_ms=0,
    )
    # rows repeat only across tables; then delta 47 repeats delta 2's (table, row) at a new seq: allowed
    d["table_ids"][47], d["rows"][47], d["seqs"][47] = d["table_ids"][2], d["rows"][2], 9
    write_delta_file(tmp_path / "ok.delta.arrow", model=NAME, model_version=1, **d)
    assert len(read_delta_file(tmp_path / "ok.delta.arrow")) == k
    d["seqs"][47] = d["seqs"][2]  # now the same seq: which value is meant?
    with pytest.raises(DeltaFormatError, match=f"deltas 2 and 47 both update table_id 2 row {row0} at seq 2"):
        write_delta_file(tmp_path / "bad.delta.arrow", model=NAME, model_version=1, **d)
    raw_delta(tmp_path / "raw.delta.arrow", raw_cols(d))
    with pytest.raises(DeltaFormatError, match="deltas 2 and 47 both update"):
        read_delta_file(tmp_path / "raw.delta.arrow")


# --------------------------------------------------------------------------- item 8: disk full
@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB tmpfs mounted for this test (root only; unmounted after, even on failure)."""
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "24m")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk, leave_bytes: int):
    """Take all the free space of ``disk`` but ``leave_bytes``; returns the filler file."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - leave_bytes)
    return filler


@pytest.mark.parametrize("full_at", ["feed", "rocksdb"])
def test_disk_full_is_a_clear_error_and_loses_no_delta(exports, small_disk, tmp_path, full_at, monkeypatch):
    """The feed's shared memory fills up when the write feed maps its epoch file (before: SIGBUS,
    "Bus error", no log line), or the store's disk when RocksDB flushes the batch: a clear error
    naming the path, rc != 0, every file still in the spool; with space again all are applied once."""
    from offgraph.store.feed import MIN_SLOTS, SHM_ENV, file_bytes

    models, spool = small_disk / "models", tmp_path / "spool"  # the store on the small disk, the spool not
    shm = small_disk / "shm"  # the feed's epochs too (a full /dev/shm is the same ENOSPC)
    shm.mkdir()
    monkeypatch.setenv(SHM_ENV, str(shm))
    vdir = install_version(exports["fp32"], models, 1)
    rng = np.random.default_rng(8)
    deltas = [make_deltas(rng, 1000, seq0=1 + 1000 * i) for i in range(5)]
    names = [publish(spool, 1, d).name for d in deltas]
    epoch_bytes = file_bytes(MIN_SLOTS, 4 * DIM + 4)  # the feed's first epoch file of an fp32 store
    # room to open the store but not for the epoch file / for the epoch file but not the SST flush
    filler = fill(small_disk, (1 << 20) if full_at == "feed" else epoch_bytes + (200 << 10))
    for attempt in range(2):  # the disk still full at the restart: the same clear error, nothing lost
        p = run_update(models, spool, "--once")
        assert p.returncode > 0, f"killed by signal {-p.returncode}: {p.stderr[-2000:]}"  # not a Bus error
        err = p.stderr
        where = shm if full_at == "feed" else vdir / "store"
        assert "No space left on device" in err and f"{where}" in err, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert spool_files(spool) == names and spool_files(spool / "applied") == [] and not (spool / "dead").exists()
        assert attempt or "stay in spool:" in err, err[-3000:]  # the restart may fail to open the store
    filler.unlink()  # space again: the same files are applied, none lost, none twice
    p = run_update(models, spool, "--once")
    assert p.returncode == 0, p.stderr[-3000:]
    assert spool_files(spool) == [] and spool_files(spool / "applied") == names
    assert_store_holds(vdir, deltas)


# --------------------------------------------------------------------------- acceptance: bad files + kill -9
GOOD_FILES = int(os.environ.get("OFFGRAPH_HARDENING_GOOD_FILES", "1000"))
KILLS = int(os.environ.get("OFFGRAPH_HARDENING_KILLS", "20"))
BAD_ROW0 = 10000  # bad files name rows >= this in table 0 (good files stay below 6000): never written


def bad_files(rng, d0: dict, good_bytes: bytes) -> dict:
    """kind -> (writer(path), words its dead-letter reason must hold). ``d0``: deltas whose
    rows are all >= BAD_ROW0 of table 0 (or made so), so a bad file applied by mistake shows."""
    from offgraph.streaming.deltas import write_delta_file

    k = len(d0["rows"])

    def good_fmt(**change):
        def w(path):
            args = {**d0, **change}
            model, version = args.pop("model", NAME), args.pop("model_version", 1)
            tmp = write_delta_file(
                path.with_name(".w" + path.name), model=model, model_version=version, fsync=False, **args
            )
            os.replace(tmp, path)

        return w

    def raw(meta=None, **cols):
        return lambda path: raw_delta(path, raw_cols(d0, **cols), meta)

    def data(b):
        return lambda path: path.write_bytes(b)

    v_big = d0["vectors"].copy()
    v_big[k // 2, 1] = 70000.0
    fo_big = d0["first_order"].copy()
    fo_big[-1] = -1.0e5
    v_nan = d0["vectors"].copy().reshape(-1)
    v_nan[3] = np.nan
    fo_inf = d0["first_order"].copy()
    fo_inf[0] = np.inf
    neg = d0["rows"].copy()
    neg[1] = -1
    seq_neg = d0["seqs"].copy()
    seq_neg[2] = -5
    dup_r, dup_s = d0["rows"].copy(), d0["seqs"].copy()
    dup_r[1], dup_s[1] = dup_r[0], dup_s[0]
    dup_t = np.zeros(k, np.uint32)
    row_oob = d0["rows"].copy()
    row_oob[0] = 500
    return {
        "beyond fp16 (vector)": (good_fmt(vectors=v_big), ["column 'vector'", "70000", "fp16"]),
        "beyond fp16 (first_order)": (good_fmt(first_order=fo_big), ["column 'first_order'", "-100000"]),
        "NaN": (raw(vector=pa.FixedSizeListArray.from_arrays(pa.array(v_nan), DIM)), ["'vector'", "NaN/Inf"]),
        "Inf": (raw(first_order=pa.array(fo_inf)), ["'first_order'", "NaN/Inf"]),
        "huge dim": (raw({"dim": "99999999999"}), ["'dim'", "99999999999"]),
        "dim mismatch": (good_fmt(vectors=d0["vectors"][:, :4].copy()), ["dim 4 but model tiny", "embedding_dim 8"]),
        "truncated": (data(good_bytes[: len(good_bytes) // 2]), ["not an Arrow IPC file"]),
        "random bytes": (data(rng.bytes(3000)), ["not an Arrow IPC file"]),
        "empty": (data(b""), ["empty (0-byte) file"]),
        "wrong model": (good_fmt(model="other"), ["addressed to model 'other'"]),
        "old version": (good_fmt(model_version=0), ["addressed to model version 0, but version 1 is live"]),
        "future version": (good_fmt(model_version=7), ["model version 7, which is not complete"]),
        "unknown table": (good_fmt(table_ids=np.full(k, 3, np.uint32)), ["table ids >= 3"]),
        "row out of range": (good_fmt(table_ids=np.full(k, 2, np.uint32), rows=row_oob), ["row 500 >= 500 rows"]),
        "negative row": (raw(row=pa.array(neg)), ["column 'row' holds negative"]),
        "negative seq": (raw(seq=pa.array(seq_neg)), ["column 'seq' holds negative"]),
        "row as int32": (raw(row=pa.array(d0["rows"].astype(np.int32))), ["column 'row' has type int32"]),
        "vector of float64": (
            raw(vector=pa.FixedSizeListArray.from_arrays(pa.array(d0["vectors"].reshape(-1).astype(np.float64)), DIM)),
            ["column 'vector' has type"],
        ),
        "missing column": (raw(first_order=None), ["missing column 'first_order'"]),
        "nulls": (raw(seq=pa.array([None] + d0["seqs"][1:].tolist(), pa.int64())), ["'seq' holds 1 nulls"]),
        "other format version": (raw({"offgraph.delta.version": "3"}), ["delta format version b'3'"]),
        "version 2 without appends": (raw({"offgraph.delta.version": "2"}), ["version 2 file without"]),
        "duplicate key and seq": (
            raw(table_id=pa.array(dup_t), row=pa.array(dup_r), seq=pa.array(dup_s)),
            ["deltas 0 and 1 both update table_id 0"],
        ),
    }


def test_bad_files_among_good_ones_with_kill9_restarts(exports, tmp_path):
    """>= 20 kinds of bad file among GOOD_FILES good ones; the updater SIGKILLed KILLS times at
    random points (startup, recovery, mid-batch): every good delta applied once (the store
    equals a last-write-wins state computed here from the good files), every bad file in the
    dead letters with a reason naming it, temporary files left alone, no run failing.
    Bigger: OFFGRAPH_HARDENING_GOOD_FILES=5000 OFFGRAPH_HARDENING_KILLS=55 (README)."""
    from offgraph.streaming.deltas import write_delta_file

    models, spool = tmp_path / "models", tmp_path / "spool"
    vdir = install_version(exports["fp16"], models, 1)
    rng = np.random.default_rng(11)
    good, good_names, seq = [], [], 10_000_000
    for i in range(GOOD_FILES):
        d = make_deltas(rng, int(rng.integers(1, 30)), seq0=seq, hot=6000)
        seq += 30
        if i % 7 == 3:  # old seqs, published late: lose to what is stored
            d["seqs"] = rng.integers(0, 10_000_000, len(d["rows"]))
        if i % 11 == 5 and good:  # a key of an earlier file at ITS seq: the first applied keeps it
            p = good[-1]
            d["table_ids"][0], d["rows"][0], d["seqs"][0] = p["table_ids"][-1], p["rows"][-1], p["seqs"][-1]
        if i % 13 == 6 and len(d["rows"]) > 1:  # a key twice in one file, higher seq later: it wins
            d["table_ids"][1], d["rows"][1], d["seqs"][1] = d["table_ids"][0], d["rows"][0], d["seqs"][0] + 1
        good.append(d)
    # names: good files at even leads, bad ones spread between them
    bad_at = sorted(rng.choice(np.arange(1, 2 * GOOD_FILES - 2, 2), size=66, replace=False).tolist())
    for i, d in enumerate(good):
        path = spool_path(spool, 2 * i)
        write_delta_file(path, model=NAME, model_version=1, fsync=False, **d)
        good_names.append(path.name)
    d0 = make_deltas(rng, 12, seq0=1, tables=0)
    d0["rows"] = BAD_ROW0 + rng.permutation(5000)[:12]
    kinds = bad_files(rng, d0, spool_path(spool, 0).read_bytes())
    expect = {}  # bad file name -> words of its reason
    for n, at in enumerate(bad_at):
        kind = list(kinds)[n % len(kinds)]
        writer, words = kinds[kind]
        path = spool_path(spool, at)
        writer(path)
        expect[path.name] = words
    bad_name = os.fsencode(spool) + b"/" + b"%020d-\xff\xfe.delta.arrow" % (2 * GOOD_FILES - 1)  # not UTF-8
    with open(bad_name, "wb") as f:
        f.write(spool_path(spool, 0).read_bytes())
    expect[os.fsdecode(os.path.basename(bad_name))] = ["not valid UTF-8"]
    ignored = [".hidden.delta.arrow", "00000000000000000001-x.delta.arrow.tmp", "notes.arrow", "x.tmp"]
    for name in ignored:
        (spool / name).write_bytes(b"left alone")
    (spool / "a-directory.delta.arrow").mkdir()
    assert len(set(kinds)) >= 20

    cmd = update_cmd(
        models,
        spool,
        "--batch-files",
        "8",
        "--once",
        "--wait-timeout",
        "0",
        "--log-every",
        "1",
        "--max-deltas-per-s",
        "400",
    )  # ~40 s of applying in all: room for the kills
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    log = open(tmp_path / "update.log", "ab")
    handled = lambda: len(spool_files(spool / "applied")) + len(spool_files(spool / "dead"))  # noqa: E731
    opened = lambda: (tmp_path / "update.log").read_bytes().count(b"recorded positions of")  # noqa: E731
    kills, rnd, exits = 0, random.Random(5), []
    for attempt in range(3 * KILLS):
        if kills >= KILLS or not spool_files(spool):
            break
        before, opened_before = handled(), opened()
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
        kills += kill_at_a_random_point(
            p, attempt % 3, rnd, lambda: opened() > opened_before, lambda: handled() > before
        )
        if p.returncode != -signal.SIGKILL:
            exits.append(p.returncode)
    assert kills >= KILLS, f"the updater finished before it could be killed {KILLS} times ({kills})"
    print(
        f"{kills} kills in {attempt + 1} runs; {handled()} of {len(good_names) + len(expect)} files handled before "
        "the last run"
    )
    assert all(rc == 0 for rc in exits), f"runs that ended by themselves failed: {exits}"
    final = subprocess.run(cmd[:-2], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    again = run_update(models, spool, "--once")  # nothing left, nothing redone
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout.strip().splitlines()[-1])["update"]
    assert summary["files_applied"] == 0 and summary["files_dead_lettered"] == 0, summary

    assert spool_files(spool / "applied") == good_names
    assert sorted(spool_files(spool / "dead")) == sorted(expect)
    got = reasons(spool)
    for name, words in expect.items():
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")  # how a reason names any file
        for w in [shown, *words]:
            assert w in got[name], (name, w, got[name])
    assert sorted(p.name for p in spool.iterdir() if p.name not in ("applied", "dead")) == sorted(
        ignored + ["a-directory.delta.arrow"]
    )
    for name in ignored:
        assert (spool / name).read_bytes() == b"left alone"

    et, er, es, ev, ew = last_write_wins(good)
    with open_version_store(vdir) as st:
        np.testing.assert_array_equal(st.row_seqs(et, er), es)
        v, w = st.read(et, er)
        np.testing.assert_array_equal(v, ev.astype(np.float16).astype(np.float32))  # fp16 store: the cast
        np.testing.assert_array_equal(w, ew.astype(np.float16).astype(np.float32))
        bad_rows = np.arange(BAD_ROW0, BAD_ROW0 + 5000)
        assert (st.row_seqs(np.zeros(len(bad_rows), np.uint32), bad_rows) == -1).all()
        assert st.get_meta_per_shard(b"spool_position") == [good_names[-1].encode()] * 4

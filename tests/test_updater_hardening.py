"""The updater never dies on input, and a full disk is a clear error that loses nothing
(real exports, real RocksDB, `offgraph update` as a subprocess)."""
import os
import random
import signal
import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from streaming_helpers import (DIM, NAME, REPO, ROWS, export_tiny, install_version, last_write_wins, make_deltas,
                               open_version_store, publish, run_update, spool_files, train_tiny, update_cmd)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """quant -> an exported MODELS/tiny/1 of one tiny run (fp32, fp16, int8; 4 shards)."""
    root = tmp_path_factory.mktemp("hardening")
    run = train_tiny(root)
    return {q: export_tiny(run, root / q / NAME / "1", q) for q in ("fp32", "fp16", "int8")}


# --------------------------------------------------------------------------- raw files
def raw_delta(path, cols: dict, meta: dict | None = None):
    """Write an Arrow IPC file with exactly these columns/metadata (pyarrow only: no checks of ours)."""
    meta = {"offgraph.delta.version": "1", "model": NAME, "model_version": "1", "dim": str(DIM),
            **(meta or {})}
    table = pa.table(cols).replace_schema_metadata({k: v for k, v in meta.items() if v is not None})
    with open(path, "wb") as f, ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    return path


def raw_cols(d: dict, **override) -> dict:
    """Arrow columns of a ``make_deltas`` dict, with any column replaced by ``override``."""
    k = len(d["rows"])
    v = np.asarray(d["vectors"], np.float32)
    cols = {"table_id": pa.array(np.asarray(d["table_ids"], np.uint32)), "row": pa.array(np.asarray(d["rows"], np.int64)),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]),
            "first_order": pa.array(np.asarray(d["first_order"], np.float32)),
            "seq": pa.array(np.asarray(d["seqs"], np.int64)),
            "event_time_ms": pa.array(np.full(k, int(time.time() * 1000), np.int64))}
    cols.update(override)
    return {c: x for c, x in cols.items() if x is not None}


def spool_path(spool, i: int):
    spool.mkdir(parents=True, exist_ok=True)
    return spool / f"{i:020d}-0000000-000000.delta.arrow"


def reasons(spool) -> dict[str, str]:
    return {p.name[: -len(".reason.txt")]: p.read_text() for p in (spool / "dead").glob("*.reason.txt")}


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
    for attempt in range(2):  # a restart finds nothing left to trip over
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


# --------------------------------------------------------------------------- item 8: disk full
@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB tmpfs mounted for this test (root only; unmounted after, even on failure)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {p.stderr.strip()}")
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
def test_disk_full_is_a_clear_error_and_loses_no_delta(exports, small_disk, tmp_path, full_at):
    """The store's disk fills up when the write feed maps its epoch file (before: SIGBUS,
    "Bus error", no log line) or when RocksDB flushes the batch: a clear error naming the
    path, rc != 0, every file still in the spool; with space again all are applied once."""
    from embstore.feed import MIN_SLOTS
    from embstore.feed_impl import file_bytes

    models, spool = small_disk / "models", tmp_path / "spool"  # the store on the small disk, the spool not
    vdir = install_version(exports["fp32"], models, 1)
    rng = np.random.default_rng(8)
    deltas = [make_deltas(rng, 1000, seq0=1 + 1000 * i) for i in range(5)]
    names = [publish(spool, 1, d).name for d in deltas]
    epoch_bytes = file_bytes(MIN_SLOTS, 4 * DIM + 4)  # the feed's first epoch file of an fp32 store
    # room to open the store but not for the epoch file / for the epoch file but not the SST flush
    filler = fill(small_disk, (1 << 20) if full_at == "feed" else epoch_bytes + (200 << 10))
    p = run_update(models, spool, "--once")
    assert p.returncode > 0, f"killed by signal {-p.returncode}: {p.stderr[-2000:]}"  # not a Bus error
    err = p.stderr
    where = vdir / "store" / ("feed" if full_at == "feed" else "")
    assert "No space left on device" in err and f"{where}" in err and "stay in spool:" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert spool_files(spool) == names and spool_files(spool / "applied") == [] and not (spool / "dead").exists()
    filler.unlink()  # space again: the same files are applied, none lost, none twice
    p = run_update(models, spool, "--once")
    assert p.returncode == 0, p.stderr[-3000:]
    assert spool_files(spool) == [] and spool_files(spool / "applied") == names
    et, er, es, ev, ew = last_write_wins(deltas)
    with open_version_store(vdir) as st:
        np.testing.assert_array_equal(st.row_seqs(et, er), es)
        v, w = st.read(et, er)
        np.testing.assert_array_equal(v, ev)
        np.testing.assert_array_equal(w, ew)

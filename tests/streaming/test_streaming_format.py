"""Delta file format v1 and the spool source (no model needed)."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from offgraph.streaming.deltas import (
    DeltaFormatError,
    parse_spool_name,
    publish_delta,
    spool_file_name,
    write_delta_file,
)
from offgraph.streaming.deltas import read as read_delta_bytes
from offgraph.streaming.deltas import read as read_delta_file
from offgraph.streaming.deltas import row_schema as schema
from offgraph.streaming.sources import open_source


def _deltas(k=50, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        table_ids=rng.integers(0, 3, k).astype(np.uint32),
        rows=rng.integers(0, 1000, k),
        vectors=rng.standard_normal((k, d)).astype(np.float32),
        first_order=rng.standard_normal(k).astype(np.float32),
        seqs=np.arange(k) + 10,
        event_time_ms=rng.integers(1, 2**40, k),
    )


def test_round_trip(tmp_path):
    d = _deltas()
    p = write_delta_file(tmp_path / "a.delta.arrow", model="ml", model_version=7, **d)
    assert sorted(os.listdir(tmp_path)) == ["a.delta.arrow"]  # the .tmp was renamed away
    b = read_delta_file(p)
    assert (b.model, b.model_version, b.dim, len(b)) == ("ml", 7, 4, 50)
    for name, col in [
        ("table_ids", "table_ids"),
        ("rows", "rows"),
        ("vectors", "vectors"),
        ("first_order", "first_order"),
        ("seqs", "seqs"),
        ("event_time_ms", "event_time_ms"),
    ]:
        np.testing.assert_array_equal(getattr(b, name), d[col])
    assert b.table_ids.dtype == np.uint32 and b.rows.dtype == np.int64 and b.vectors.dtype == np.float32
    assert b.vectors.base is not None  # a view of the memory-mapped Arrow buffer, not a copy
    meta = ipc.open_file(pa.memory_map(str(p))).schema.metadata
    assert meta[b"offgraph.delta.version"] == b"1" and meta[b"dim"] == b"4" and meta[b"model_version"] == b"7"
    # compressed, a scalar event time, and in memory (broker payloads)
    p2 = write_delta_file(
        tmp_path / "b.delta.arrow",
        model="ml",
        model_version=1,
        compression="zstd",
        fsync=False,
        **{**d, "event_time_ms": 123},
    )
    b2 = read_delta_bytes(p2.read_bytes())
    np.testing.assert_array_equal(b2.vectors, d["vectors"])
    assert (b2.event_time_ms == 123).all()


def test_empty_file_is_valid(tmp_path):
    p = write_delta_file(
        tmp_path / "e.delta.arrow",
        model="m",
        model_version=0,
        table_ids=[],
        rows=[],
        vectors=np.zeros((0, 16), np.float32),
        first_order=[],
        seqs=[],
        event_time_ms=[],
    )
    b = read_delta_file(p)
    assert len(b) == 0 and b.dim == 16 and b.vectors.shape == (0, 16)


def _raw(tmp_path, name, table=None, *, meta=None, dim=4, stream=False, k=3):
    if table is None:
        d = _deltas(k, dim)
        arrays = [
            pa.array(d["table_ids"]),
            pa.array(d["rows"]),
            pa.FixedSizeListArray.from_arrays(pa.array(d["vectors"].ravel()), dim),
            pa.array(d["first_order"]),
            pa.array(d["seqs"]),
            pa.array(d["event_time_ms"]),
        ]
        table = pa.Table.from_arrays(arrays, schema=schema(dim))
    m = {b"offgraph.delta.version": b"1", b"model": b"m", b"model_version": b"1", b"dim": str(dim).encode()}
    m.update(meta or {})
    table = table.replace_schema_metadata({k: v for k, v in m.items() if v is not None})
    p = tmp_path / name
    with open(p, "wb") as f:
        w = (ipc.new_stream if stream else ipc.new_file)(f, table.schema)
        w.write_table(table)
        w.close()
    return p


def _table_with(col, arr, dim=4):
    d = _deltas(3, dim)
    cols = {
        "table_id": pa.array(d["table_ids"]),
        "row": pa.array(d["rows"]),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(d["vectors"].ravel()), dim),
        "first_order": pa.array(d["first_order"]),
        "seq": pa.array(d["seqs"]),
        "event_time_ms": pa.array(d["event_time_ms"]),
    }
    if arr is None:
        del cols[col]
    else:
        cols[col] = arr
    return pa.table(cols)


@pytest.mark.parametrize(
    "case, match",
    [
        ("random bytes", "not an Arrow IPC file"),
        ("zero bytes", "0-byte"),
        ("stream format", "not an Arrow IPC file"),
        ("no version", "not an offgraph delta file"),
        ("version 3", "delta format version"),
        ("version 2 without appends", "version 2 file without"),
        ("appends in version 1", "appends need version 2"),
        ("appends not json", "is not UTF-8 JSON"),
        ("appends without keys", "at least one key"),
        ("no model", "'model'"),
        ("bad model_version", "decimal int"),
        ("missing column", "missing column 'seq'"),
        ("row int32", "column 'row' has type int32"),
        ("dim mismatch", "dim mismatch"),
        ("vector float64", "column 'vector' has type"),
        ("nan vector", "NaN/Inf"),
        ("inf first_order", "NaN/Inf"),
        ("negative row", "column 'row' holds negative"),
        ("negative seq", "column 'seq' holds negative"),
        ("null row", "nulls"),
    ],
)
def test_malformed_files_are_rejected_with_a_reason(tmp_path, case, match):
    name = "x.delta.arrow"
    if case == "random bytes":
        p = tmp_path / name
        p.write_bytes(os.urandom(300))
    elif case == "zero bytes":
        p = tmp_path / name
        p.write_bytes(b"")
    elif case == "stream format":
        p = _raw(tmp_path, name, stream=True)
    elif case == "no version":
        p = _raw(tmp_path, name, meta={b"offgraph.delta.version": None})
    elif case == "version 3":
        p = _raw(tmp_path, name, meta={b"offgraph.delta.version": b"3"})
    elif case == "version 2 without appends":
        p = _raw(tmp_path, name, meta={b"offgraph.delta.version": b"2"})
    elif case == "appends in version 1":
        p = _raw(tmp_path, name, meta={b"vocabulary_appends": b'{"0": [5, ["a"]]}'})
    elif case == "appends not json":
        p = _raw(tmp_path, name, meta={b"offgraph.delta.version": b"2", b"vocabulary_appends": b"{0: [5"})
    elif case == "appends without keys":
        p = _raw(tmp_path, name, meta={b"offgraph.delta.version": b"2", b"vocabulary_appends": b'{"0": [5, []]}'})
    elif case == "no model":
        p = _raw(tmp_path, name, meta={b"model": None})
    elif case == "bad model_version":
        p = _raw(tmp_path, name, meta={b"model_version": b"v1"})
    elif case == "missing column":
        p = _raw(tmp_path, name, _table_with("seq", None))
    elif case == "row int32":
        p = _raw(tmp_path, name, _table_with("row", pa.array([1, 2, 3], pa.int32())))
    elif case == "dim mismatch":
        p = _raw(tmp_path, name, meta={b"dim": b"8"})
    elif case == "vector float64":
        p = _raw(tmp_path, name, _table_with("vector", pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(12)), 4)))
    elif case == "nan vector":
        v = np.zeros(12, np.float32)
        v[5] = np.nan
        p = _raw(tmp_path, name, _table_with("vector", pa.FixedSizeListArray.from_arrays(pa.array(v), 4)))
    elif case == "inf first_order":
        p = _raw(tmp_path, name, _table_with("first_order", pa.array(np.array([0, np.inf, 1], np.float32))))
    elif case == "negative row":
        p = _raw(tmp_path, name, _table_with("row", pa.array([1, -2, 3], pa.int64())))
    elif case == "negative seq":
        p = _raw(tmp_path, name, _table_with("seq", pa.array([1, 2, -3], pa.int64())))
    elif case == "null row":
        p = _raw(tmp_path, name, _table_with("row", pa.array([1, None, 3], pa.int64())))
    with pytest.raises(DeltaFormatError, match=match):
        read_delta_file(p)


def test_writer_refuses_bad_values(tmp_path):
    d = _deltas(3)
    bad = [
        ({"vectors": np.full((3, 4), np.nan)}, "NaN/Inf"),
        ({"rows": [1, -1, 2]}, "negative"),
        ({"rows": [1.0, 2.0, 3.0]}, "integers"),
        ({"seqs": [1, 2]}, "expected 3"),
        ({"vectors": np.zeros(3)}, r"\[K, D\]"),
        ({"table_ids": [0, 1, 2**32]}, "2\\*\\*32"),
    ]
    for change, match in bad:
        with pytest.raises(DeltaFormatError, match=match):
            write_delta_file(tmp_path / "w.delta.arrow", model="m", model_version=1, **{**d, **change})
    with pytest.raises(DeltaFormatError, match="model_version"):
        write_delta_file(tmp_path / "w.delta.arrow", model="m", model_version=-1, **d)
    assert not list(tmp_path.iterdir())


def test_spool_names_sort_in_creation_order():
    names = [spool_file_name() for _ in range(2000)]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(n.endswith(".delta.arrow") and parse_spool_name(n) for n in names)
    assert spool_file_name(5).startswith("0" * 19 + "5-")
    with pytest.raises(ValueError):
        spool_file_name(-1)


def test_spool_source_order_ack_reject_seek(tmp_path):
    spool = tmp_path / "spool"
    src = open_source(f"spool:{spool}")
    names = [publish_delta(spool, model="m", model_version=1, fsync=False, **_deltas(2, seed=i)).name for i in range(5)]
    (spool / "junk.tmp").write_bytes(b"x")
    (spool / ".hidden.delta.arrow").write_bytes(b"x")
    items = src.poll(3)
    assert [i.position for i in items] == names[:3] and src.pending() == 5
    assert [i.position for i in src.poll(3)] == names[:3]  # not consumed until acked
    src.ack(items[0])
    dead = src.reject(items[1], "because")
    assert (spool / "applied" / names[0]).exists() and dead == spool / "dead" / names[1]
    assert "because" in (spool / "dead" / (names[1] + ".reason.txt")).read_text()
    assert [i.position for i in src.poll(10)] == names[2:] and src.positions() == {b"spool_position": names[1]}
    # a restarted source told the recorded position tidies leftovers at or before it
    src2 = open_source(f"spool:{spool}")
    src2.seek({b"spool_position": names[3]})
    assert [i.position for i in src2.poll(10)] == [names[4]]
    assert (spool / "applied" / names[3]).exists()
    # a late file (named before the cursor) is still delivered, flagged
    late = write_delta_file(
        spool / ("0" * 20 + "-late.delta.arrow"), model="m", model_version=1, fsync=False, **_deltas(2)
    )
    got = src2.poll(10)
    assert [(i.position, i.late) for i in got] == [(late.name, True), (names[4], False)]
    with pytest.raises(ValueError, match="unknown source scheme"):
        open_source("pulsar:topic")
    with pytest.raises(ValueError, match="expected kafka://HOST:PORT/TOPIC"):
        open_source("kafka:topic")
    with pytest.raises(ValueError, match="scheme:location"):
        open_source("/just/a/dir")

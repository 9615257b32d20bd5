"""Delta file format v1: the row deltas' Arrow schema, validation and (de)serialisation, and the metadata
keys every kind of delta file shares. Public API: ``offgraph.streaming.deltas``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

FORMAT_VERSION = 1
APPENDS_VERSION = 2  # a file that appends keys to a vocabulary: a reader of version 1 would drop them silently
META_APPENDS = b"vocabulary_appends"  # JSON {"table_id": [first row, [key, ...]]}
SUFFIX = ".delta.arrow"
META_VERSION = b"offgraph.delta.version"
META_MODEL = b"model"
META_MODEL_VERSION = b"model_version"
META_DIM = b"dim"
META_KIND = b"offgraph.delta.kind"  # absent: row deltas
KIND_FEATURES = b"features"
MAX_DIM = 2**31 - 1  # Arrow's limit on a fixed-size list
COLUMNS = ("table_id", "row", "vector", "first_order", "seq", "event_time_ms")
_LEAD_RE = re.compile(r"^([0-9]{20})-")


class DeltaFormatError(ValueError):
    """A delta file (or the values for one) that must not be applied; the message says why."""


def schema(dim: int, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    return pa.schema(
        [
            ("table_id", pa.uint32()),
            ("row", pa.int64()),
            ("vector", pa.list_(pa.float32(), dim)),
            ("first_order", pa.float32()),
            ("seq", pa.int64()),
            ("event_time_ms", pa.int64()),
        ],
        metadata=metadata,
    )


# ---------------------------------------------------------------------------- write side
def _ints(name: str, x, k: int | None) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise DeltaFormatError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise DeltaFormatError(f"{name} must be integers, got dtype {a.dtype}")
    if k is not None and len(a) != k:
        raise DeltaFormatError(f"{name} has {len(a)} values, expected {k} (one per row)")
    return a


def check_appends(appends) -> dict[int, tuple[int, tuple[str, ...]]]:
    """``vocabulary_appends`` as the batch holds it: table id -> (first row, keys); DeltaFormatError otherwise."""
    if not isinstance(appends, dict):
        raise DeltaFormatError(f"vocabulary_appends must map table ids to [first row, keys], got {appends!r}")
    out = {}
    for t, v in appends.items():
        try:
            tid = int(t)
            first, keys = v
            ok = (
                0 <= tid < 2**32
                and isinstance(first, int)
                and not isinstance(first, bool)
                and first >= 1
                and isinstance(keys, (list, tuple))
                and len(keys) > 0
                and all(isinstance(k, str) and k for k in keys)
            )
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise DeltaFormatError(
                f"vocabulary_appends[{t!r}] must be [first row >= 1, [non-empty key, ...]] (at least one key), "
                f"got {v!r}"
            )
        out[tid] = (int(first), tuple(keys))
    return out


def build_table(
    *, model, model_version, table_ids, rows, vectors, first_order, seqs, event_time_ms, vocabulary_appends=None
) -> pa.Table:
    if not isinstance(model, str) or not model:
        raise DeltaFormatError(f"model must be a non-empty string, got {model!r}")
    if isinstance(model_version, bool) or not isinstance(model_version, (int, np.integer)) or model_version < 0:
        raise DeltaFormatError(f"model_version must be an int >= 0, got {model_version!r}")
    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[1] < 1:
        raise DeltaFormatError(f"vectors must be [K, D] with D >= 1, got shape {v.shape}")
    if v.size and not np.issubdtype(v.dtype, np.number):
        raise DeltaFormatError(f"vectors must be numbers, got dtype {v.dtype}")
    k, dim = v.shape
    t = _ints("table_ids", table_ids, k)
    if t.size and (t.min() < 0 or t.max() > 0xFFFFFFFF):
        raise DeltaFormatError("table_ids must be in [0, 2**32)")
    r = _ints("rows", rows, k)
    s = _ints("seqs", seqs, k)
    if np.ndim(event_time_ms) == 0:
        if isinstance(event_time_ms, bool) or not isinstance(event_time_ms, (int, np.integer)):
            raise DeltaFormatError(f"event_time_ms must be an int or [K] ints, got {event_time_ms!r}")
        e = np.full(k, int(event_time_ms), dtype=np.int64)
    else:
        e = _ints("event_time_ms", event_time_ms, k)
    w = np.asarray(first_order)
    if w.shape != (k,):
        raise DeltaFormatError(f"first_order must have shape ({k},), got {w.shape}")
    cols = {
        "table_id": t.astype(np.uint32),
        "row": r.astype(np.int64),
        "vector": np.ascontiguousarray(v, dtype=np.float32),
        "first_order": w.astype(np.float32),
        "seq": s.astype(np.int64),
        "event_time_ms": e.astype(np.int64),
    }
    check_values(cols)
    meta = {
        META_VERSION: str(FORMAT_VERSION).encode(),
        META_MODEL: model.encode(),
        META_MODEL_VERSION: str(int(model_version)).encode(),
        META_DIM: str(dim).encode(),
    }
    if vocabulary_appends:
        appends = check_appends(vocabulary_appends)
        meta[META_VERSION] = str(APPENDS_VERSION).encode()
        meta[META_APPENDS] = json.dumps({str(t): [f, list(k)] for t, (f, k) in appends.items()}).encode()
    arrays = [
        pa.array(cols["table_id"]),
        pa.array(cols["row"]),
        pa.FixedSizeListArray.from_arrays(pa.array(cols["vector"].reshape(-1)), dim),
        pa.array(cols["first_order"]),
        pa.array(cols["seq"]),
        pa.array(cols["event_time_ms"]),
    ]
    return pa.Table.from_arrays(arrays, schema=schema(dim, meta))


def write_ipc(f, table: pa.Table, compression: str | None = None) -> None:
    """``table`` as an Arrow IPC file into the open binary file ``f`` (a file or a BytesIO)."""
    if compression not in (None, "lz4", "zstd"):
        raise ValueError(f"compression must be None, 'lz4' or 'zstd', got {compression!r}")
    with ipc.new_file(f, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)


def write_table(path: Path, table: pa.Table, *, compression: str | None, fsync: bool) -> None:
    with open(path, "wb") as f:
        write_ipc(f, table, compression)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- read side
def count_rows(path: Path | bytes) -> int:
    """Deltas in a file (or a message's bytes), from its Arrow footer (0 for one that is not
    readable as such: the updater's read says why)."""
    try:
        if isinstance(path, bytes):
            return int(ipc.open_file(pa.BufferReader(path)).count_rows())
        with pa.memory_map(os.fspath(path)) as m:
            return int(ipc.open_file(m).count_rows())
    except (OSError, pa.ArrowException, ValueError):
        return 0


def _meta_int(meta: dict, key: bytes, what: str, minimum: int, maximum: int | None = None) -> int:
    raw = meta.get(key)
    if raw is None:
        raise DeltaFormatError(f"schema metadata lacks {key!r} ({what})")
    try:
        val = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise DeltaFormatError(f"schema metadata {key!r} must be a decimal int, got {raw!r}") from None
    if val < minimum:
        raise DeltaFormatError(f"schema metadata {key!r} must be >= {minimum}, got {val}")
    if maximum is not None and val > maximum:
        raise DeltaFormatError(f"schema metadata {key!r} must be <= {maximum}, got {val}")
    return val


def _check_schema(sch: pa.Schema) -> tuple[str, int, int]:
    meta = sch.metadata or {}
    if META_VERSION not in meta:
        raise DeltaFormatError(f"not an offgraph delta file: schema metadata lacks {META_VERSION!r}")
    if meta[META_VERSION] not in (str(FORMAT_VERSION).encode(), str(APPENDS_VERSION).encode()):
        raise DeltaFormatError(
            f"delta format version {meta[META_VERSION]!r}; this offgraph reads versions {FORMAT_VERSION} and "
            f"{APPENDS_VERSION} (with vocabulary appends)"
        )
    try:
        model = meta.get(META_MODEL, b"").decode("utf-8")
    except UnicodeDecodeError:
        raise DeltaFormatError("schema metadata 'model' is not utf-8") from None
    if not model:
        raise DeltaFormatError("schema metadata lacks a non-empty 'model'")
    version = _meta_int(meta, META_MODEL_VERSION, "the model version", 0)
    dim = _meta_int(meta, META_DIM, "the embedding dim", 1, MAX_DIM)
    want = schema(dim)
    for name in COLUMNS:
        idx = sch.get_field_index(name)
        if idx < 0:
            raise DeltaFormatError(f"missing column {name!r} (columns: {sch.names})")
        got, exp = sch.field(idx).type, want.field(name).type
        if got != exp:
            if name == "vector" and pa.types.is_fixed_size_list(got) and got.value_type == pa.float32():
                raise DeltaFormatError(
                    f"dim mismatch: column 'vector' holds {got.list_size} floats per row, metadata says dim={dim}"
                )
            raise DeltaFormatError(f"column {name!r} has type {got}, expected {exp}")
    return model, version, dim


def _np(col: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        raise DeltaFormatError(f"column {name!r} holds {arr.null_count} nulls")
    if pa.types.is_fixed_size_list(arr.type):
        flat = arr.flatten()
        if flat.null_count:
            raise DeltaFormatError(f"column {name!r} holds null values inside its vectors")
        return flat.to_numpy(zero_copy_only=False).reshape(len(arr), arr.type.list_size)
    return arr.to_numpy(zero_copy_only=False)


def check_values(cols: dict[str, np.ndarray]) -> None:
    for name in ("vector", "first_order"):
        bad = ~np.isfinite(cols[name])
        if bad.any():
            at = int(np.argwhere(bad)[0][0])
            raise DeltaFormatError(f"column {name!r} holds {int(bad.sum())} NaN/Inf values (first at row {at})")
    for name in ("row", "seq", "event_time_ms"):
        a = cols[name]
        if a.size and a.min() < 0:
            at = int(np.argmax(a < 0))
            raise DeltaFormatError(f"column {name!r} holds negative values (first at delta {at}: {int(a[at])})")
    refuse_equal_seqs(
        cols["table_id"],
        cols["row"],
        cols["seq"],
        lambda a: f"table_id {int(cols['table_id'][a])} row {int(cols['row'][a])}",
    )


def refuse_equal_seqs(t: np.ndarray, r: np.ndarray, s: np.ndarray, row: Callable[[int], str]) -> None:
    """DeltaFormatError when two deltas of one file update one row (``(t, r)``; ``row(i)`` names delta i's)
    at one seq: which value is the row's at that seq would be left to file order. The one rule of
    embedding and feature-row deltas (``offgraph/streaming/deltas/features.py``)."""
    dup = equal_seq_duplicate(t, r, s)
    if dup is not None:
        a, b, n = dup
        raise DeltaFormatError(
            f"deltas {a} and {b} both update {row(a)} at seq {int(s[a])} ({n} such duplicates): "
            "one seq of a row must have one value (give each update its own seq; the highest wins)"
        )


def equal_seq_duplicate(t: np.ndarray, r: np.ndarray, s: np.ndarray) -> tuple[int, int, int] | None:
    """``(i, j, count)`` of two deltas with the same (table_id, row, seq), i < j, or None.
    One sort of a combined (table, row) key; the full three-key sort only over the keys
    that occur more than once (usually none)."""
    if len(r) < 2:
        return None
    idx = None
    if int(r.max()) < 1 << 32:
        key = (t.astype(np.uint64) << np.uint64(32)) | r.astype(np.uint64)
        order = np.argsort(key)
        ks = key[order]
        same = ks[1:] == ks[:-1]
        if not same.any():
            return None
        both = np.zeros(len(r), dtype=bool)
        both[1:] |= same
        both[:-1] |= same
        idx = order[both]
    sub = np.arange(len(r)) if idx is None else idx
    o = sub[np.lexsort((s[sub], r[sub], t[sub]))]
    d = (t[o][1:] == t[o][:-1]) & (r[o][1:] == r[o][:-1]) & (s[o][1:] == s[o][:-1])
    if not d.any():
        return None
    i = int(np.argmax(d))
    a, b = sorted((int(o[i]), int(o[i + 1])))
    return a, b, int(d.sum())


def read_table(source: Path | bytes | bytearray | memoryview) -> pa.Table:
    """The Arrow table of a delta file (a path) or of its bytes (a message payload), of any kind."""
    if isinstance(source, Path):
        if source.stat().st_size == 0:
            raise DeltaFormatError("empty (0-byte) file: not an Arrow IPC file")
        reader = pa.memory_map(str(source), "r")
    else:
        if len(source) == 0:
            raise DeltaFormatError("empty (0-byte) payload: not an Arrow IPC file")
        reader = pa.BufferReader(pa.py_buffer(source))
    try:
        return ipc.open_file(reader).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as e:
        raise DeltaFormatError(f"not an Arrow IPC file (or a damaged one): {e}") from None


def is_feature_table(table: pa.Table) -> bool:
    """The file's kind, as its metadata records it: feature rows, or (no kind) row deltas."""
    return (table.schema.metadata or {}).get(META_KIND) == KIND_FEATURES


def _appends(meta: dict) -> dict[int, tuple[int, tuple[str, ...]]]:
    """The file's vocabulary appends (version 2 carries them; version 1 has none)."""
    raw = meta.get(META_APPENDS)
    if meta[META_VERSION] == str(FORMAT_VERSION).encode():
        if raw is not None:
            raise DeltaFormatError(f"version {FORMAT_VERSION} file with {META_APPENDS!r}: appends need version 2")
        return {}
    if raw is None:
        raise DeltaFormatError(f"version {APPENDS_VERSION} file without {META_APPENDS!r}")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DeltaFormatError(f"schema metadata {META_APPENDS!r} is not UTF-8 JSON: {e}") from None
    return check_appends(value)


def columns(table: pa.Table) -> dict:
    """The checked columns of a row-delta table, as the fields of ``DeltaBatch``."""
    model, version, dim = _check_schema(table.schema)
    appends = _appends(table.schema.metadata)
    cols = {name: _np(table.column(name), name) for name in COLUMNS}
    check_values(cols)
    return {
        "model": model,
        "model_version": version,
        "dim": dim,
        "table_ids": cols["table_id"],
        "rows": cols["row"],
        "vectors": cols["vector"],
        "first_order": cols["first_order"],
        "seqs": cols["seq"],
        "event_time_ms": cols["event_time_ms"],
        "appends": appends,
    }


def parse_lead(name: str, suffix: str) -> int | None:
    if not name.endswith(suffix):
        return None
    m = _LEAD_RE.match(name)
    return int(m.group(1)) if m else None

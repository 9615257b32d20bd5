"""Feature-row deltas: new or changed rows of an entity feature table (a new item, a movie's new
release_year or genres, a user's changed profile), streamed through the same spool / Kafka
sources and the same updater as embedding rows (offgraph/streaming/README.md, "Feature deltas").

One Arrow IPC file (or Kafka message) holds K rows of ONE table of one model; the tables are
shared by the model's versions, so a feature delta names no version:

    schema metadata  b"offgraph.delta.version" = b"1"
                     b"offgraph.delta.kind"    = b"features"
                     b"model"                  = model name
                     b"table"                  = table name (the spec's `tables`)
                     b"key"                    = the key column's name
    columns          <key>           the table's key column (no nulls)
                     <each column>   every column of the table: the WHOLE row (a row replaces the
                                     stored one; a null is no value)
                     seq             int64 >= 0  last write wins per key
                     event_time_ms   int64 >= 0

    publish_feature_delta(spool, model="ml", table="item", key="movie_id",
                          rows=[{"movie_id": 242, "genres": [...], "title_words": [...], "release_year": 1997}],
                          seqs=[7], event_time_ms=now_ms)
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from offgraph.feature_tables.db import row_key
from offgraph.streaming.deltas._format import FORMAT_VERSION as _FORMAT
from offgraph.streaming.deltas._format import (
    KIND_FEATURES,
    META_KIND,
    META_MODEL,
    META_VERSION,
    DeltaFormatError,
    refuse_equal_seqs,
)
from offgraph.streaming.deltas.spool import publish_file

FORMAT_VERSION = str(_FORMAT).encode()

META_TABLE = b"table"
META_KEY = b"key"
RESERVED = ("seq", "event_time_ms")


@dataclass(frozen=True)
class FeatureDeltaBatch:
    """The K rows of one feature delta file, in file order."""

    model: str
    table: str
    key: str  # the key column's name
    columns: tuple[str, ...]  # the other columns, as in the file
    schema: pa.Schema  # for the type checks against the spec
    keys: list[bytes]  # record keys (offgraph.feature_tables.db.row_key)
    rows: list[dict[str, Any]]  # {column: value} per row, without the key
    seqs: np.ndarray  # int64 [K]
    event_time_ms: np.ndarray  # int64 [K]
    data: pa.Table  # the file's columns (the value checks of offgraph.feature_tables.checks.check_rows)

    def __len__(self) -> int:
        return len(self.keys)


def from_table(table: pa.Table) -> FeatureDeltaBatch:
    """A feature delta file's table (``_format.read_table``), checked (any problem: DeltaFormatError)."""
    meta = table.schema.metadata or {}
    if meta.get(META_VERSION) != FORMAT_VERSION:
        raise DeltaFormatError(
            f"feature delta of format version {meta.get(META_VERSION)!r}; this offgraph reads {FORMAT_VERSION.decode()}"
        )
    try:
        model, name, key = meta[META_MODEL].decode(), meta[META_TABLE].decode(), meta[META_KEY].decode()
    except (KeyError, UnicodeDecodeError):
        raise DeltaFormatError("feature delta without valid 'model', 'table' and 'key' metadata") from None
    for c in RESERVED:
        if c not in table.column_names:
            raise DeltaFormatError(f"feature delta without the {c!r} column")
        col = table.column(c)
        if not pa.types.is_int64(col.type) or col.null_count:
            raise DeltaFormatError(f"feature delta column {c!r} must be int64 without nulls, got {col.type}")
    seqs = table.column("seq").to_numpy()
    times = table.column("event_time_ms").to_numpy()
    if (seqs < 0).any() or (times < 0).any():
        raise DeltaFormatError("feature delta: seq and event_time_ms must be >= 0")
    if key not in table.column_names or key in RESERVED:
        raise DeltaFormatError(f"feature delta without its key column {key!r}")
    keys = [row_key(v) for v in table.column(key).to_pylist()]
    bad = [i for i, k in enumerate(keys) if k is None]
    if bad:
        raise DeltaFormatError(f"feature delta: key column {key!r} has no value at row {bad[0]}")
    if len(keys) > 1:  # two rows of one key at one seq: refused as embedding deltas are (one rule)
        _, kid = np.unique(np.array(keys, dtype=object), return_inverse=True)
        refuse_equal_seqs(
            np.zeros(len(keys), np.uint32),
            kid.reshape(-1).astype(np.int64),
            seqs,
            lambda a: f"{key}={keys[a][1:].decode()!r}",
        )
    cols = [c for c in table.column_names if c not in RESERVED and c != key]
    values = {c: table.column(c).to_pylist() for c in cols}
    rows = [{c: values[c][i] for c in cols} for i in range(table.num_rows)]
    return FeatureDeltaBatch(model, name, key, tuple(cols), table.schema, keys, rows, seqs, times, table)


def build_table(*, model: str, table: str, key: str, rows: Sequence[dict], seqs, event_time_ms) -> pa.Table:
    """``rows``: dicts holding the key and the table's columns (Arrow infers the types)."""
    k = len(rows)
    et = (
        np.full(k, int(event_time_ms), np.int64) if np.ndim(event_time_ms) == 0 else np.asarray(event_time_ms, np.int64)
    )
    if any(key not in r for r in rows):
        raise ValueError(f"every row needs its key {key!r}")
    cols = [key] + [c for c in (rows[0] if rows else {}) if c != key]
    t = pa.table(
        {
            **{c: [r.get(c) for r in rows] for c in cols},
            "seq": pa.array(np.asarray(seqs, np.int64)),
            "event_time_ms": pa.array(et),
        }
    )
    return t.replace_schema_metadata(
        {
            META_VERSION: FORMAT_VERSION,
            META_KIND: KIND_FEATURES,
            META_MODEL: model.encode(),
            META_TABLE: table.encode(),
            META_KEY: key.encode(),
        }
    )


def encode_feature_delta(**kwargs) -> bytes:
    """The file bytes of a feature delta (a Kafka message value); kwargs of :func:`build_table`."""
    buf = io.BytesIO()
    with pa.ipc.new_file(buf, (t := build_table(**kwargs)).schema) as w:
        w.write_table(t)
    return buf.getvalue()


def publish_feature_delta(spool_dir: str | Path, **kwargs) -> Path:
    """Write a feature delta into ``spool_dir`` atomically (hidden name, fsync, rename to a spool name)."""
    data = encode_feature_delta(**kwargs)

    def write(hidden: Path) -> None:
        with open(hidden, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return publish_file(spool_dir, write)

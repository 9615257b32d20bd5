"""Bulk-loading a feature table from an Arrow table (``offgraph features load``, the exporter).

The file must hold the table's key column and every one of its columns (an extra column is
ignored and reported); a column's type must be one FG can read (a scalar, or a list of scalars
for the ``id`` / ``tokenize`` inputs that take lists); the key has no nulls and no duplicates
(the first duplicate is named: two rows for one key would leave the loaded value to chance).
Rows are encoded, sorted by record key and ingested as one external SST file, with a tqdm bar.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from embstore.feature_db import LOADED_SEQ, FeatureDB, FeatureTableError, encode_row, row_key, table_dir
from features.spec import LIST_OPS, FeatureSpec
from features.table_spec import TableSpec

CHUNK = 65536


def list_inputs(spec: FeatureSpec) -> set[str]:
    """Raw inputs that may hold a list: those of id / tokenize fields only."""
    return {f.input for f in spec.fields if f.op in LIST_OPS and f.input is not None}


def check_schema(table: pa.Table, t: TableSpec, spec: FeatureSpec, source: str) -> list[str]:
    """Refuse a file that cannot fill ``t`` (FeatureTableError naming the column); returns the
    extra columns (ignored)."""
    names = table.column_names
    missing = [c for c in (t.key, *t.columns) if c not in names]
    if missing:
        raise FeatureTableError(f"{source}: table '{t.name}' needs column(s) {missing} (key {t.key!r}, columns "
                                f"{list(t.columns)}); the file has {names}")
    lists = list_inputs(spec)
    for c in (t.key, *t.columns):
        typ = table.schema.field(c).type
        if pa.types.is_list(typ) or pa.types.is_large_list(typ):
            if c == t.key:
                raise FeatureTableError(f"{source}: key column {c!r} is a list ({typ}); a key is one value")
            if c not in lists:
                raise FeatureTableError(f"{source}: column {c!r} is a list ({typ}) but the model reads it as one "
                                        "value (only id / tokenize inputs take lists)")
            typ = typ.value_type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
                or pa.types.is_large_string(typ) or pa.types.is_boolean(typ) or pa.types.is_null(typ)):
            raise FeatureTableError(f"{source}: column {c!r} has type {table.schema.field(c).type}; FG reads "
                                    "strings, numbers, booleans and lists of those")
    key = table.column(t.key)
    if key.null_count:
        first = int(np.flatnonzero(key.is_null().to_numpy(zero_copy_only=False))[0])
        raise FeatureTableError(f"{source}: key column {t.key!r} is null at row {first}")
    return [c for c in names if c not in (t.key, *t.columns)]


def encoded_rows(table: pa.Table, t: TableSpec, source: str) -> list[tuple[bytes, bytes]]:
    """``(record key, value)`` sorted by key; FeatureTableError naming the first duplicate key
    (two spellings of one key, 242 and "242", are one key)."""
    keys = [row_key(v) for v in table.column(t.key).to_pylist()]
    for i, k in enumerate(keys):
        if k is None:
            raise FeatureTableError(f"{source}: key column {t.key!r} has no value at row {i}")
    order = sorted(range(len(keys)), key=keys.__getitem__)
    for a, b in zip(order, order[1:]):
        if keys[a] == keys[b]:
            i, j = sorted((a, b))
            raise FeatureTableError(f"{source}: duplicate key {t.key}={keys[a][1:].decode()!r} (rows {i} and {j}); "
                                    "a feature file holds one row per key")
    cols = {c: table.column(c).to_pylist() for c in t.columns}
    return [(keys[i], encode_row(LOADED_SEQ, {c: cols[c][i] for c in t.columns})) for i in order]


def load_table(model_dir: str | Path, t: TableSpec, spec: FeatureSpec, table: pa.Table, *, source: str = "<data>",
               progress: bool = True, keep_streamed: bool = False) -> dict[str, Any]:
    """Check ``table`` against ``t`` and ingest its rows into MODELS/NAME/features/TABLE (created if
    needed; rows of keys already there are replaced, except, with ``keep_streamed``, rows a stream
    wrote (seq >= 0): the exporter's values are as of a training cut, older than those).
    Returns {rows, kept_streamed, ignored_columns, path}."""
    extra = check_schema(table, t, spec, source)
    items = encoded_rows(table, t, source)
    path = table_dir(model_dir, t.name)
    with FeatureDB.create(path, t) as db:
        kept = 0
        if keep_streamed and items:
            seqs = db.seqs([k for k, _ in items])
            kept = sum(1 for s in seqs if s is not None and s > LOADED_SEQ)
            if kept:
                items = [it for it, s in zip(items, seqs) if s is None or s <= LOADED_SEQ]
        bar = tqdm(total=len(items), unit="rows", desc=f"load {t.name}", disable=not progress)

        def counted():
            for k, item in enumerate(items):
                yield item
                if (k + 1) % CHUNK == 0:
                    bar.update(CHUNK)
            bar.update(len(items) % CHUNK)

        n = db.ingest_sorted(counted(), path)
        bar.close()
    return {"rows": n, "kept_streamed": kept, "ignored_columns": extra, "path": str(path)}


def latest_per_key(table: pa.Table, key: str, time: str | None, mask: np.ndarray | None = None) -> pa.Table:
    """The last row of each key (by ``time``, ties and no time: the last in file order) among the rows
    of ``mask`` (True = use; the exporter passes the training rows: the values known before the cut)."""
    if mask is not None:
        table = table.filter(pa.array(mask))
    n = table.num_rows
    if n == 0:
        return table
    t = table.column(time).to_numpy() if time is not None else np.zeros(n)
    canon = np.array([row_key(v) or b"" for v in table.column(key).to_pylist()], dtype=object)
    _, kid = np.unique(canon, return_inverse=True)
    order = np.lexsort((np.arange(n), t, kid))  # by key, then time, then position
    ks = kid[order]
    last = order[np.r_[ks[1:] != ks[:-1], True]]
    keep = last[canon[last] != b""]  # rows without a key fill nothing
    return table.take(pa.array(np.sort(keep)))


__all__ = ["load_table", "check_schema", "encoded_rows", "latest_per_key", "list_inputs"]

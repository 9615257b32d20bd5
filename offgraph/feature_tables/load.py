"""Bulk-loading a feature table from an Arrow table (``offgraph features load``, the exporter).

The data is checked first, with the tables' one set of write-time checks
(``offgraph.feature_tables.checks``: the columns and their types, the keys, every value), and refused
before anything is written. Rows are then encoded, sorted by record key and ingested as one external
SST file, with a tqdm bar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from offgraph.feature_tables.checks import Where, check_keys, check_rows, check_schema, data_row
from offgraph.feature_tables.db import LOADED_SEQ, FeatureDB, encode_row, row_key, table_dir
from offgraph.features.spec import FeatureSpec
from offgraph.features.table_spec import TableSpec

CHUNK = 65536


def encoded_rows(
    table: pa.Table, t: TableSpec, source: str, where: Where = data_row, cols: Mapping[str, Sequence[Any]] | None = None
) -> list[tuple[bytes, bytes]]:
    """``(record key, value)`` sorted by key; FeatureTableError naming the first row without a key or the
    first duplicate key (``offgraph.feature_tables.checks.check_keys``)."""
    keys, order = check_keys(table, t, source, where)
    cols = cols if cols is not None else {c: table.column(c).to_pylist() for c in t.columns}
    return [(keys[i], encode_row(LOADED_SEQ, {c: cols[c][i] for c in t.columns})) for i in order]


def load_table(
    model_dir: str | Path,
    t: TableSpec,
    spec: FeatureSpec,
    table: pa.Table,
    *,
    source: str = "<data>",
    progress: bool = True,
    keep_streamed: bool = False,
    where: Where = data_row,
) -> dict[str, Any]:
    """Check ``table`` against ``t`` and ingest its rows into MODELS/NAME/features/TABLE (created if
    needed; rows of keys already there are replaced, except, with ``keep_streamed``, rows a stream
    wrote (seq >= 0): the exporter's values are as of a training cut, older than those).
    Returns {rows, kept_streamed, ignored_columns, path}."""
    extra = check_schema(table, t, spec, source, where)
    cols = {c: table.column(c).to_pylist() for c in t.columns}
    items = encoded_rows(table, t, source, where, cols)
    check_rows(table, t, spec, source, where, cols)
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


__all__ = ["load_table", "encoded_rows", "latest_per_key"]

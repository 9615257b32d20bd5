"""Bulk-loading a feature table from an Arrow table (``offgraph features load``, the exporter).

The file must hold the table's key column and every one of its columns (an extra column is
ignored and reported); a column's type must be one FG can read (a scalar, or a list of scalars
for the ``id`` / ``tokenize`` inputs that take lists); the key has no nulls and no duplicates
(the first duplicate is named: two rows for one key would leave the loaded value to chance).
Every value must be one the serving FG takes (``check_rows``: FG's own rules, and the table's
size bounds), or the file is refused before anything is written: a stored value FG refuses
would otherwise break every request naming its key. Rows are encoded, sorted by record key and
ingested as one external SST file, with a tqdm bar.

Errors name a row with ``where(i)`` (i: 0-based position in the data): ``row i+1`` by default,
the file's line for a text file (``offgraph.features.tables.row_locator``), ``delta i`` for a delta.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from offgraph.features.spec import LIST_OPS, FeatureSpec
from offgraph.features.table_spec import TableSpec
from offgraph.features.value_limits import BadValue, value_errors
from offgraph.store.feature_db import LOADED_SEQ, FeatureDB, FeatureTableError, encode_row, row_key, table_dir

CHUNK = 65536
SHOWN = 3
"""Bad rows named in a refusal (the count says how many more)."""
CHECKED = 100
"""Bad rows looked for at most before refusing (a file of bad rows is not checked to its end)."""
Where = Callable[[int], str]


def data_row(i: int) -> str:
    return f"row {i + 1}"


def list_inputs(spec: FeatureSpec) -> set[str]:
    """Raw inputs that may hold a list: those of id / tokenize fields only."""
    return {f.input for f in spec.fields if f.op in LIST_OPS and f.input is not None}


def check_schema(table: pa.Table, t: TableSpec, spec: FeatureSpec, source: str, where: Where = data_row) -> list[str]:
    """Refuse a file that cannot fill ``t`` (FeatureTableError naming the column); returns the
    extra columns (ignored)."""
    names = table.column_names
    missing = [c for c in (t.key, *t.columns) if c not in names]
    if missing:
        raise FeatureTableError(
            f"{source}: table '{t.name}' needs column(s) {missing} (key {t.key!r}, columns "
            f"{list(t.columns)}); the file has {names}"
        )
    lists = list_inputs(spec)
    for c in (t.key, *t.columns):
        typ = table.schema.field(c).type
        if pa.types.is_list(typ) or pa.types.is_large_list(typ):
            if c == t.key:
                raise FeatureTableError(f"{source}: key column {c!r} is a list ({typ}); a key is one value")
            if c not in lists:
                raise FeatureTableError(
                    f"{source}: column {c!r} is a list ({typ}) but the model reads it as one "
                    "value (only id / tokenize inputs take lists)"
                )
            typ = typ.value_type
        if not (
            pa.types.is_integer(typ)
            or pa.types.is_floating(typ)
            or pa.types.is_string(typ)
            or pa.types.is_large_string(typ)
            or pa.types.is_boolean(typ)
            or pa.types.is_null(typ)
        ):
            raise FeatureTableError(
                f"{source}: column {c!r} has type {table.schema.field(c).type}; FG reads "
                "strings, numbers, booleans and lists of those"
            )
    key = table.column(t.key)
    if key.null_count:
        first = int(np.flatnonzero(key.is_null().to_numpy(zero_copy_only=False))[0])
        raise FeatureTableError(f"{source}: key column {t.key!r} is null at {where(first)}")
    return [c for c in names if c not in (t.key, *t.columns)]


def value_bytes(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """int64 [n]: each value's size (``offgraph.features.table_spec``): the UTF-8 bytes of its text, summed over a
    list's entries, 8 per number or boolean, 0 for no value. Columnar (Arrow kernels, one bincount)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        parents = pc.list_parent_indices(arr).to_numpy()
        per = _scalar_bytes(pc.list_flatten(arr))
        return np.bincount(parents, weights=per, minlength=len(arr)).astype(np.int64)
    return _scalar_bytes(arr)


def _scalar_bytes(arr: pa.Array) -> np.ndarray:
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return pc.fill_null(pc.binary_length(arr), 0).to_numpy().astype(np.int64)
    if pa.types.is_null(arr.type):
        return np.zeros(len(arr), np.int64)
    return np.where(arr.is_valid().to_numpy(zero_copy_only=False), 8, 0).astype(np.int64)


def row_problems(
    table: pa.Table, t: TableSpec, spec: FeatureSpec, cols: Mapping[str, Sequence[Any]] | None = None
) -> list[BadValue]:
    """The rows of ``table`` (its columns of ``t``) that must not be stored, sorted by row, at most about
    ``CHECKED``: a value or row over the table's size bounds, or a value the serving FG refuses (FG's own
    rules, ``offgraph.features.value_limits.value_errors``; ``cols``: the columns as Python lists, if at hand)."""
    n = table.num_rows
    sizes = {c: value_bytes(table.column(c)) for c in t.columns}
    bad: dict[int, BadValue] = {}
    for c, size in sizes.items():
        for r in np.flatnonzero(size > t.max_value_bytes)[:CHECKED].tolist():
            bad.setdefault(
                r,
                BadValue(
                    r,
                    c,
                    "-",
                    f"a value of {int(size[r]):,} bytes, more than the table's "
                    f"max_value_bytes of {t.max_value_bytes:,}",
                ),
            )
    total = sum(sizes.values()) if sizes else np.zeros(n, np.int64)
    for r in np.flatnonzero(total > t.max_row_bytes)[:CHECKED].tolist():
        bad.setdefault(
            r,
            BadValue(
                r,
                "*",
                "-",
                f"a row of {int(total[r]):,} bytes, more than the table's max_row_bytes of {t.max_row_bytes:,}",
            ),
        )
    if bad:  # the sizes first: FG's checks would run over the oversized values
        return [bad[r] for r in sorted(bad)]
    cols = cols if cols is not None else {c: table.column(c).to_pylist() for c in t.columns}
    return value_errors(spec, cols, n, limit=CHECKED)


def refusal(problems: Sequence[BadValue], table: pa.Table, t: TableSpec, where: Where) -> str | None:
    """The message naming the first rows of ``problems`` (row, key, column, rule); None for none."""
    if not problems:
        return None
    keys = table.column(t.key)
    shown = "; ".join(f"{where(b.row)} ({t.key}={keys[b.row].as_py()!r}): " + _what(b) for b in problems[:SHOWN])
    more = len(problems) - SHOWN
    count = f"{len(problems)}{'+' if len(problems) >= CHECKED else ''}"
    return (
        f"{count} row(s) the server could not use: {shown}"
        + (f"; and {more} more" if more > 0 else "")
        + " (values must be ones the model's FG takes, within the table's size bounds: offgraph/features/README.md "
        '"Feature tables")'
    )


def _what(b: BadValue) -> str:
    if b.column == "*":
        return b.problem
    if b.field == "-":
        return f"column '{b.column}': {b.problem}"
    return str(b)


def check_rows(
    table: pa.Table,
    t: TableSpec,
    spec: FeatureSpec,
    source: str,
    where: Where = data_row,
    cols: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """FeatureTableError naming the first bad rows of ``table`` (:func:`row_problems`)."""
    msg = refusal(row_problems(table, t, spec, cols), table, t, where)
    if msg is not None:
        raise FeatureTableError(f"{source}: {msg}")


def encoded_rows(
    table: pa.Table, t: TableSpec, source: str, where: Where = data_row, cols: Mapping[str, Sequence[Any]] | None = None
) -> list[tuple[bytes, bytes]]:
    """``(record key, value)`` sorted by key; FeatureTableError naming the first duplicate key
    (two spellings of one key, 242 and "242", are one key)."""
    keys = [row_key(v) for v in table.column(t.key).to_pylist()]
    for i, k in enumerate(keys):
        if k is None:
            raise FeatureTableError(f"{source}: key column {t.key!r} has no value at {where(i)}")
    order = sorted(range(len(keys)), key=keys.__getitem__)
    for a, b in zip(order, order[1:]):
        if keys[a] == keys[b]:
            i, j = sorted((a, b))
            raise FeatureTableError(
                f"{source}: duplicate key {t.key}={keys[a][1:].decode()!r} at {where(i)} and "
                f"{where(j)}; a feature file holds one row per key"
            )
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


__all__ = [
    "load_table",
    "check_schema",
    "check_rows",
    "encoded_rows",
    "row_problems",
    "refusal",
    "value_bytes",
    "latest_per_key",
    "list_inputs",
]

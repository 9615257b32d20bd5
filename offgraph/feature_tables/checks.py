"""The write-time checks of a feature table: ONE set, run by every writer before anything is written.

Two writers fill the tables: the bulk load (``offgraph features load`` and the exporter,
``offgraph.feature_tables.load``) and the updater applying streamed feature deltas
(``offgraph.feature_tables.apply``). Both refuse with these checks, so a row the bulk load refuses
is refused from a stream too, with the same words:

- :func:`check_schema`: the data holds the table's key column and every one of its columns (an extra
  column is ignored and reported); a column's type is one FG can read (a scalar, or a list of scalars
  for the ``id`` / ``tokenize`` inputs that take lists); the key is one value, never null;
- :func:`check_keys`: every row has a key, and no key twice (the first duplicate is named: two rows for
  one key would leave the stored value to chance);
- :func:`check_rows`: every value is one the serving FG takes (FG's own rules,
  ``offgraph.features.value_limits.value_errors``) within the table's size bounds
  (``max_value_bytes`` / ``max_row_bytes`` of ``offgraph.features.table_spec``): a stored value FG
  refuses would otherwise break every request naming its key;
- :func:`delta_refusal`: a streamed delta is addressed to this model and one of the live spec's tables,
  keyed by its key, and carries the WHOLE row (every column, no other), then the two checks above.

Errors name a row with ``where(i)`` (i: 0-based position in the data): ``row i+1`` by default,
the file's line for a text file (``offgraph.features.tables.row_locator``), ``delta i`` for a delta.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offgraph.feature_tables.db import FeatureTableError, row_key
from offgraph.features.spec import LIST_OPS, FeatureSpec
from offgraph.features.table_spec import TableSpec
from offgraph.features.value_limits import BadValue, value_errors

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
    total = cast(np.ndarray, sum(sizes.values())) if sizes else np.zeros(n, np.int64)
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


def check_keys(table: pa.Table, t: TableSpec, source: str, where: Where = data_row) -> tuple[list[bytes], list[int]]:
    """The record keys of ``table`` (``offgraph.feature_tables.db.row_key``) and their order sorted by key;
    FeatureTableError naming the first row without a key, or the first duplicate key (two spellings of one
    key, 242 and "242", are one key)."""
    found = [row_key(v) for v in table.column(t.key).to_pylist()]
    for i, k in enumerate(found):
        if k is None:
            raise FeatureTableError(f"{source}: key column {t.key!r} has no value at {where(i)}")
    keys = cast(list[bytes], found)  # none is None
    order = sorted(range(len(keys)), key=keys.__getitem__)
    for a, b in zip(order, order[1:]):
        if keys[a] == keys[b]:
            i, j = sorted((a, b))
            raise FeatureTableError(
                f"{source}: duplicate key {t.key}={keys[a][1:].decode()!r} at {where(i)} and "
                f"{where(j)}; a feature file holds one row per key"
            )
    return keys, order


class DeltaRows(Protocol):
    """What :func:`delta_refusal` reads of a feature delta (``offgraph.streaming.deltas.FeatureDeltaBatch``)."""

    @property
    def model(self) -> str: ...
    @property
    def table(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def columns(self) -> tuple[str, ...]: ...
    @property
    def schema(self) -> pa.Schema: ...
    @property
    def data(self) -> pa.Table: ...


def delta_refusal(b: DeltaRows, model: str, spec: FeatureSpec, version: int) -> str | None:
    """Why the feature delta ``b`` cannot be applied (None: it can): another model or table, other columns or
    types, or a value the server could not use (named: delta, key, column, rule)."""
    if b.model != model:
        return f"addressed to model {b.model!r}; this updater serves {model!r}"
    tables = {t.name: t for t in spec.tables}
    t = tables.get(b.table)
    if t is None:
        return (
            f"feature delta for table {b.table!r}, which the live version {version}'s spec does not declare "
            f"(its tables: {sorted(tables) or 'none'})"
        )
    if b.key != t.key:
        return f"feature delta for table {t.name!r} keyed by {b.key!r}; the table's key is {t.key!r}"
    missing = [c for c in t.columns if c not in b.columns]
    extra = [c for c in b.columns if c not in t.columns]
    if missing or extra:
        return (
            f"feature delta for table {t.name!r}: a row is the whole row, columns {list(t.columns)}; "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unknown {extra}" if extra else "")
        )
    try:
        check_schema(b.schema.empty_table(), t, spec, f"feature delta for table {t.name!r}")
        # the values: FG's own rules and the table's size bounds, as `offgraph features load` checks them
        check_rows(b.data, t, spec, f"feature delta for table {t.name!r}", where=lambda i: f"delta {i}")
    except FeatureTableError as e:
        return str(e)
    return None


__all__ = [
    "CHECKED",
    "SHOWN",
    "DeltaRows",
    "Where",
    "check_keys",
    "check_rows",
    "check_schema",
    "data_row",
    "delta_refusal",
    "list_inputs",
    "refusal",
    "row_problems",
    "value_bytes",
]

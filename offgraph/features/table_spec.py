"""Entity (feature) tables declared in a spec: the raw columns the server looks up by key.

    tables:
      user: {key: user_id, columns: [age, gender, occupation, zip_prefix]}
      item: {key: movie_id, columns: [genres, title_words, release_year]}

A table is keyed by one raw input and holds raw inputs of the same scope as its key: a
``request``-scope table (a user profile) is looked up once per request, an ``item``-scope
table (the catalog) once per candidate. The server fills, before FG, every column the
caller did not send (``offgraph/feature_tables/join.py``); the rows live in RocksDB, shared by the
model's versions (``offgraph/feature_tables/db.py``).

Validated here so that a table can never fill a column the model does not read, or read it
from the wrong place: the key and every column must be raw inputs (``input`` of a field) of
the table's scope; a column belongs to one table at most; a key is not a column of any table
(no chained joins). Every problem is a ``SpecError`` naming the table.

Size bounds: a stored value is read, hashed and pooled on every request naming its key, so
its writers (``offgraph features load``, the exporter's load, feature-row deltas) refuse a value
over ``max_value_bytes`` (default 64 KiB) and a row over ``max_row_bytes`` (default 256 KiB),
optional keys of a table (``item: {key: movie_id, columns: [...], max_value_bytes: 8192}``). A
value's size is the UTF-8 bytes of its text, summed over a list's entries, and 8 bytes per
number or boolean; a row's is the sum over its columns (``offgraph/feature_tables/load.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""A table's name is also its directory name under MODELS/NAME/features/."""

MAX_VALUE_BYTES = 64 * 1024
"""Default bound of one stored value: a huge value slows every request naming its key (bench/results/feature-bad-row/README.md)."""
MAX_ROW_BYTES = 256 * 1024
"""Default bound of one stored row (all its columns)."""
_KEYS = {"key", "columns", "max_value_bytes", "max_row_bytes"}


@dataclass(frozen=True)
class TableSpec:
    name: str
    key: str  # the raw input the rows are keyed by
    scope: str  # "request" or "item": the scope of the key and of every column
    columns: tuple[str, ...]  # raw inputs the table fills
    max_value_bytes: int = MAX_VALUE_BYTES  # write-time bounds (module docstring): not part of the stored layout
    max_row_bytes: int = MAX_ROW_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "scope": self.scope, "columns": list(self.columns)}


def parse_tables(raw: Any, fields: Sequence, fail: Callable[[str], NoReturn]) -> tuple[TableSpec, ...]:
    """The ``tables:`` mapping of a spec (None: no tables), against its parsed ``fields``
    (table and numeric fields); ``fail(msg)`` raises the SpecError."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        fail("'tables' must be a mapping of table name -> {key, columns}")
    scope_of: dict[str, set[str]] = {}
    for f in fields:
        if f.input is not None:
            scope_of.setdefault(f.input, set()).add(f.scope)
    tables: list[TableSpec] = []
    owner: dict[str, str] = {}  # column -> table filling it
    for name, t in raw.items():
        if not isinstance(name, str) or not TABLE_NAME.match(name):
            fail(f"table {name!r}: a table name is lowercase letters, digits and '_' (it names a directory)")
        where = f"table '{name}'"
        if not isinstance(t, dict) or set(t) - _KEYS:
            fail(
                f"{where}: must be a mapping with 'key', 'columns' and optionally 'max_value_bytes', "
                f"'max_row_bytes', got {t!r}"
            )
        bounds = {}
        for b in ("max_value_bytes", "max_row_bytes"):
            if b in t:
                v = t[b]
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    fail(f"{where}: '{b}' must be an integer >= 1 (bytes), got {v!r}")
                bounds[b] = v
        key, cols = t.get("key"), t.get("columns")
        if not isinstance(key, str) or not key:
            fail(f"{where}: 'key' must name the raw input the rows are keyed by")
        scopes = scope_of.get(key)
        if not scopes:
            fail(
                f"{where}: key '{key}' is not a raw input of any field (a key is sent by the caller and must "
                "be an 'input' the model reads, e.g. the item id field's)"
            )
        scope = sorted(scopes)[0]
        if not isinstance(cols, list) or not cols or not all(isinstance(c, str) and c for c in cols):
            fail(f"{where}: 'columns' must be a non-empty list of raw input names")
        if len(set(cols)) != len(cols):
            fail(f"{where}: a column is listed twice in {cols}")
        for c in cols:
            if c == key:
                fail(f"{where}: the key '{key}' cannot be one of its own columns")
            cs = scope_of.get(c)
            if not cs:
                fail(f"{where}: column '{c}' is not a raw input of any field (the model would never read it)")
            if scope not in cs:
                fail(
                    f"{where}: column '{c}' is a {sorted(cs)[0]}-scope input but the key '{key}' is "
                    f"{scope}-scope: a table fills inputs of its key's scope only"
                )
            if c in owner:
                fail(f"{where}: column '{c}' is already filled by table '{owner[c]}'")
            owner[c] = name
        tables.append(TableSpec(name=name, key=key, scope=scope, columns=tuple(cols), **bounds))
    for t in tables:
        if t.key in owner:
            fail(
                f"table '{t.name}': its key '{t.key}' is a column of table '{owner[t.key]}' (no chained "
                "lookups: the caller sends every key)"
            )
    return tuple(tables)

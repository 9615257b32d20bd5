"""Bounds of feature generation: values per field and row, values per request.

A request's cost grows with the number of feature values it carries (hashing, store reads,
pooling), so the serving FG (``FeatureGenerator.transform``) refuses, before that work:

* a row whose ``id`` / ``tokenize`` field holds more than the field's ``max_values`` values
  (the entries of a list, null entries included, or the terms of a split string), when the
  field's ``overflow`` is ``refuse`` (the default): the spec's declared bound, never cut,
  because the model was trained on whole lists;
* a request holding more than ``max_request_values`` values in all (request fields once, item
  and cross fields once per candidate), when the generator has such a bound.

Both raise ``FeatureValueError`` naming the field, the request or candidate, and the limit.
Training (``transform_columns``) is not bounded: real data with a long list trains as it is.
The checks are length-based and run on the request's row and the item-cache misses only; a
cache hit was checked when it was generated, and the request total is one sum over lengths.

A field with ``overflow: keep_last`` (a history: recent item ids, oldest first) is never refused
for its length: ``keep_last`` cuts each row to its last ``max_values`` values, the op's values
after nulls are dropped and strings split. It is part of FG itself, run by ``FeatureGenerator``
on every row in training and serving alike (as a cross's ``max_values`` cuts its product), so a
model is trained on the histories it serves. Before the cut, a list's entries still count
against ``max_request_values`` (the op reads them all).

``value_errors`` applies the same rules (the ops' value checks, ``max_values``, the numeric
fields' checks) to whole raw columns and returns EVERY row the serving FG would refuse, rather
than stopping at the first: a feature table's writers refuse such rows before they are stored
(``offgraph/feature_tables/load.py``), and the server's join scores a stored row that slipped past
them as unknown (``offgraph/feature_tables/join.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

import numpy as np

from offgraph.features.numeric import numeric_values
from offgraph.features.ops import RAW_OPS, FeatureValueError, Values
from offgraph.features.segment import prepare
from offgraph.features.spec import LIST_OPS, FeatureSpec, FieldSpec


class TooManyValues(FeatureValueError):
    """A request with more feature values than the generator's ``max_request_values``."""

    def __init__(self, limit: int, counted: int):
        super().__init__(
            f"the request holds more than {limit} feature values (counted {counted} so far; request "
            f"fields count once, item and cross fields once per candidate): max_request_values is "
            f"{limit}; send fewer candidates or shorter lists"
        )
        self.limit, self.counted = limit, counted


class Bound:
    """The bounds of one serving FG call.

    ``where(row)`` names a row of the columns being generated in errors ("request",
    "candidates[17]"); ``limit`` is the request's value budget (None: unbounded) and
    ``used`` the values counted against it so far.
    """

    __slots__ = ("where", "limit", "used")

    def __init__(self, limit: int | None, where: Callable[[int], str]):
        self.limit, self.used, self.where = limit, 0, where

    def locate(self, err: FeatureValueError) -> FeatureValueError:
        return err.at(self.where(err.row)) if err.row is not None else err

    def raw(self, f: FieldSpec, column: Sequence[Any]) -> None:
        """Before the op runs (its per-value work is what a long list costs): the entries of each
        list, null entries included, against ``max_values`` (unless the field cuts: ``keep_last``)
        and the budget."""
        # lists only (what JSON gives; a tuple or array is still checked after the op): the type
        # test is most of this pass's cost, and it runs on every cache miss
        self._check(f, [len(v) if type(v) is list else 0 for v in column], spend=False, cap=not cuts(f))

    def produced(self, f: FieldSpec, values: Sequence[Sequence[str]]) -> None:
        """After the op: values per row against ``max_values`` (split strings), spent from the budget."""
        self._check(f, list(map(len, values)), spend=True)

    def count(self, used: int) -> None:
        """Set the values counted so far to ``used`` (TooManyValues past the limit)."""
        self.used = 0
        self.spend(used)

    def spend(self, count: int) -> None:
        """Count ``count`` more values of the request (TooManyValues past the limit)."""
        self.used += count
        if self.limit is not None and self.used > self.limit:
            raise TooManyValues(self.limit, self.used)

    def _check(self, f: FieldSpec, lens: list[int], spend: bool, cap: bool = True) -> None:
        # plain lists: a request's columns are short (1 row, or the item-cache misses), where
        # NumPy's per-call overhead would cost more than the loop
        top = max(lens, default=0)
        if cap and top > f.params["max_values"]:
            r = lens.index(top)
            problem = too_many_values(f, top)
            raise FeatureValueError(
                f"field '{f.name}', {self.where(r)}: {problem}", field=f.name, row=r, problem=problem
            )
        total = sum(lens)
        if spend:
            self.spend(total)
        elif self.limit is not None and self.used + total > self.limit:
            raise TooManyValues(self.limit, self.used + total)


def cuts(f: FieldSpec) -> bool:
    """Whether list field ``f`` keeps its last ``max_values`` values (``overflow: keep_last``) rather than
    refusing a longer row."""
    return f.params.get("overflow") == "keep_last"


def keep_last(f: FieldSpec, values: Values) -> Values:
    """The op's ``values`` of list field ``f`` cut, row by row, to the last ``max_values`` (``cuts(f)``;
    any other field's values are returned as they are). One function for training and serving: FG runs it
    on every row of every call (``FeatureGenerator._values``)."""
    if not cuts(f):
        return values
    cap = f.params["max_values"]
    lens = np.fromiter(map(len, values), np.int64, len(values))
    if not len(lens) or int(lens.max()) <= cap:
        return values  # the usual case: one C-level pass over the lengths
    # a slice of each row in C (map + itemgetter): the rows are the op's Python lists, which the crosses
    # read as they are, so the cut is made on them (the ids then follow from the cut values)
    return list(map(itemgetter(slice(-cap, None)), values))


def too_many_values(f: FieldSpec, count: int) -> str:
    """The rule a row of ``count`` values breaks in field ``f`` (count > its ``max_values``)."""
    return f"{count} values, more than the field's max_values of {f.params['max_values']} (the model's feature spec)"


@dataclass(frozen=True)
class BadValue:
    """One row's value that the serving FG refuses: the row (of the columns checked), the raw input
    (column), the field reading it and the rule it breaks."""

    row: int
    column: str
    field: str
    problem: str

    def __str__(self) -> str:
        return f"column '{self.column}' (field '{self.field}'): {self.problem}"


def fields_reading(spec: FeatureSpec, columns) -> list[FieldSpec]:
    """The fields whose raw input is one of ``columns`` (table fields of raw ops, and numeric fields)."""
    cols = set(columns)
    return [f for f in (*spec.fields, *spec.numeric) if f.input in cols and (f.op in RAW_OPS or f in spec.numeric)]


def value_errors(
    spec: FeatureSpec, columns: Mapping[str, Sequence[Any]], n: int, limit: int | None = None
) -> list[BadValue]:
    """Every row of the raw ``columns`` (n rows each; a column not given is not checked) that the
    serving FG (``FeatureGenerator.transform``) would refuse, with FG's own rules: each field reading
    a column runs its op on the column (types, numbers that are finite, log1p's domain) and ``id`` /
    ``tokenize`` fields are held to ``max_values``, before (list entries) and after (split terms) the
    op, as ``Bound`` does (a ``keep_last`` field's long rows are cut, never refused). Sorted by row;
    with ``limit``, at most about that many (a file of bad rows is named by its first ones, without
    checking it all)."""
    bad: dict[int, BadValue] = {}
    for f in fields_reading(spec, columns):
        if f.op == "tokenize":
            prepare(f.params.get("segmenter", "whitespace"))
        _field_errors(f, f in spec.numeric, columns[cast(str, f.input)], n, bad)  # fields_reading: an input
        if limit is not None and len(bad) >= limit:
            break
    return [bad[r] for r in sorted(bad)]


def _field_errors(f: FieldSpec, numeric: bool, col: Sequence[Any], n: int, bad: dict[int, BadValue]) -> None:
    rows = np.array([r for r in range(n) if r not in bad], dtype=np.int64)
    capped = not numeric and f.op in LIST_OPS and not cuts(f)
    column = cast(str, f.input)  # the caller's fields read a column

    def refuse(at: np.ndarray, problem: Callable[[int], str]) -> np.ndarray:
        for r in at.tolist():
            bad.setdefault(int(rows[r]), BadValue(int(rows[r]), column, f.name, problem(r)))
        return np.delete(rows, at)

    if capped:  # the list entries, null ones included (Bound.raw), all rows at once
        lens = np.fromiter((len(col[r]) if type(col[r]) is list else 0 for r in rows.tolist()), np.int64, len(rows))
        over = np.flatnonzero(lens > f.params["max_values"])
        rows = refuse(over, lambda r: too_many_values(f, int(lens[r])))
    # the op raises at its first bad row: sweep past each one, then check the rest again as a whole (a check
    # over the whole column, numbers' finiteness, may have stopped before rows that it never looked at)
    while True:
        found, start = False, 0
        while start < len(rows):
            sub = rows[start:]
            try:
                vals = _run(f, numeric, [col[r] for r in sub.tolist()])
            except FeatureValueError as e:
                at, problem = _locate(f, numeric, col, sub, e)
                rows = refuse(np.array([start + at]), lambda r: problem)
                start, found = start + at, True
                continue
            if capped:  # split strings: the op's values per row (Bound.produced)
                lens = np.fromiter(map(len, vals), np.int64, len(vals))
                over = np.flatnonzero(lens > f.params["max_values"])
                if len(over):
                    rows = refuse(start + over, lambda r: too_many_values(f, int(lens[r - start])))
                    found = True
            break
        if not found:
            return


def _run(f: FieldSpec, numeric: bool, col: list):
    try:
        return numeric_values(f, col) if numeric else RAW_OPS[f.op](f.name, col, f.params)
    except (TypeError, ValueError) as e:  # FeatureValueError included; others are unlocated (FG: a 422 too)
        if isinstance(e, FeatureValueError):
            raise
        raise FeatureValueError(f"field '{f.name}': {e}", field=f.name, problem=str(e)) from None


def _locate(f: FieldSpec, numeric: bool, col, sub: np.ndarray, e: FeatureValueError) -> tuple[int, str]:
    """(position in ``sub``, the rule) of the op's error ``e``; an error without a row is found row by row."""
    if e.row is not None:
        return e.row, e.problem or str(e)
    for i, r in enumerate(sub.tolist()):
        try:
            _run(f, numeric, [col[r]])
        except FeatureValueError as one:
            return i, one.problem or str(one)
    return 0, e.problem or str(e)

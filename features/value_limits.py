"""Serving bounds of feature generation: values per field and row, values per request.

A request's cost grows with the number of feature values it carries (hashing, store reads,
pooling), so the serving FG (``FeatureGenerator.transform``) refuses, before that work:

* a row whose ``id`` / ``tokenize`` field holds more than the field's ``max_values`` values
  (the entries of a list, null entries included, or the terms of a split string): the spec's
  declared bound, never cut, because the model was trained on whole lists;
* a request holding more than ``max_request_values`` values in all (request fields once, item
  and cross fields once per candidate), when the generator has such a bound.

Both raise ``FeatureValueError`` naming the field, the request or candidate, and the limit.
Training (``transform_columns``) is not bounded: real data with a long list trains as it is.
The checks are length-based and run on the request's row and the item-cache misses only; a
cache hit was checked when it was generated, and the request total is one sum over lengths.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from features.ops_impl import FeatureValueError
from features.spec import FieldSpec


class TooManyValues(FeatureValueError):
    """A request with more feature values than the generator's ``max_request_values``."""

    def __init__(self, limit: int, counted: int):
        super().__init__(f"the request holds more than {limit} feature values (counted {counted} so far; request "
                         f"fields count once, item and cross fields once per candidate): max_request_values is "
                         f"{limit}; send fewer candidates or shorter lists")
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
        list, null entries included, against ``max_values`` and the budget."""
        # lists only (what JSON gives; a tuple or array is still checked after the op): the type
        # test is most of this pass's cost, and it runs on every cache miss
        self._check(f, [len(v) if type(v) is list else 0 for v in column], spend=False)

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

    def _check(self, f: FieldSpec, lens: list[int], spend: bool) -> None:
        # plain lists: a request's columns are short (1 row, or the item-cache misses), where
        # NumPy's per-call overhead would cost more than the loop
        top = max(lens, default=0)
        cap = f.params["max_values"]
        if top > cap:
            r = lens.index(top)
            problem = f"{top} values, more than the field's max_values of {cap} (the model's feature spec)"
            raise FeatureValueError(f"field '{f.name}', {self.where(r)}: {problem}", field=f.name, row=r,
                                    problem=problem)
        total = sum(lens)
        if spend:
            self.spend(total)
        elif self.limit is not None and self.used + total > self.limit:
            raise TooManyValues(self.limit, self.used + total)

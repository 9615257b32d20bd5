"""Feature-generation ops: raw values -> lists of canonical value strings.

Each op works on a column (one entry per row) and returns, per row, the list
of the field's values as canonical strings (``offgraph.features.hashing.canonical``). An
empty list is *no value*: the field then contributes a zero vector and a zero
first-order weight. None, NaN, "" and [] are no value everywhere.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from offgraph.features.hashing import canonical
from offgraph.features.segment import segment_fn

Values = list[list[str]]


class FeatureValueError(ValueError):
    """A raw value FG cannot use (e.g. text for a numeric bucket, a list longer than the field's
    ``max_values``); the message names the field and where the value is.

    Ops name the row of the column they were given (``row 3``); the serving FG relabels the
    error with the request's own terms (``request``, ``candidates[17]``) through ``at``.
    """

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None, problem: str | None = None):
        super().__init__(message)
        self.field, self.row, self.problem = field, row, problem

    @classmethod
    def in_row(cls, field: str, row: int, problem: str) -> FeatureValueError:
        return cls(f"field '{field}', row {row}: {problem}", field=field, row=row, problem=problem)

    def at(self, where: str) -> FeatureValueError:
        """The same error located at ``where`` instead of the op's row number."""
        if self.field is None or self.problem is None:
            return self
        return FeatureValueError(
            f"field '{self.field}', {where}: {self.problem}", field=self.field, row=self.row, problem=self.problem
        )


def _is_multi(v) -> bool:
    return isinstance(v, (list, tuple, np.ndarray))


def _canonical(field: str, i: int, v) -> str | None:
    """``canonical`` with its refusals (bytes that are not UTF-8, a type it cannot read) as FG's own
    FeatureValueError: such a value can only come from a stored row written around the checks, and the
    serving join then scores it as unknown instead of failing the request (offgraph/feature_tables/join.py)."""
    try:
        return canonical(v)
    except (TypeError, UnicodeDecodeError) as e:
        raise FeatureValueError.in_row(field, i, f"cannot read the value: {e}") from None


def _scalar_list(field: str, i: int, v) -> list[str]:
    out = []
    for x in v:
        if _is_multi(x) or isinstance(x, dict):
            raise FeatureValueError.in_row(field, i, f"nested value {x!r} inside a list")
        s = _canonical(field, i, x)
        if s is not None:
            out.append(s)
    return out


def _check_scalar(field: str, i: int, v):
    if isinstance(v, dict):
        raise FeatureValueError.in_row(field, i, "expected a value or a list of values, got an object")


def op_id(field: str, column: Sequence[Any], params: dict) -> Values:
    sep = params.get("separator")
    out: Values = []
    for i, v in enumerate(column):
        _check_scalar(field, i, v)
        if v is None:
            out.append([])
        elif _is_multi(v):
            out.append(_scalar_list(field, i, v))
        elif sep is not None and isinstance(v, str):
            out.append([t for t in v.split(sep) if t])
        else:
            s = _canonical(field, i, v)
            out.append([] if s is None else [s])
    return out


def op_tokenize(field: str, column: Sequence[Any], params: dict) -> Values:
    sep = params.get("separator")  # None: any whitespace
    lower = params.get("lowercase", True)
    split = segment_fn(params.get("segmenter", "whitespace"))
    out: Values = []
    for i, v in enumerate(column):
        _check_scalar(field, i, v)
        if v is None:
            out.append([])
            continue
        texts = v if _is_multi(v) else [v]
        terms: list[str] = []
        for t in texts:
            if t is None:
                continue
            if not isinstance(t, str):
                raise FeatureValueError.in_row(field, i, f"tokenize needs text, got {t!r}")
            if lower:
                t = t.lower()
            terms.extend(split(t, sep))
        out.append(terms)
    return out


def _numeric(field: str, column: Sequence[Any]) -> np.ndarray:
    """Column -> float64 array, NaN for no value; text that is not a number, and an infinite value
    ("inf", "1e999": JSON has no infinity, text does), is an error."""
    arr = np.empty(len(column), dtype=np.float64)
    for i, v in enumerate(column):
        if v is None or (isinstance(v, str) and v == ""):
            arr[i] = np.nan
        elif isinstance(v, (bool, np.bool_)):
            raise FeatureValueError.in_row(field, i, f"expected a number, got {v!r}")
        elif isinstance(v, (int, float, np.integer, np.floating)):
            arr[i] = float(v)
        elif isinstance(v, str):
            try:
                arr[i] = float(v)
            except ValueError:
                raise FeatureValueError.in_row(field, i, f"expected a number, got {v!r}") from None
        else:
            raise FeatureValueError.in_row(field, i, f"expected a number, got {type(v).__name__} {v!r}")
    inf = np.flatnonzero(np.isinf(arr))
    if len(inf):
        i = int(inf[0])
        raise FeatureValueError.in_row(field, i, f"expected a finite number, got {column[i]!r}")
    return arr


def _ints_or_empty(buckets: np.ndarray, missing: np.ndarray) -> Values:
    return [[] if m else [str(int(b))] for b, m in zip(buckets.tolist(), missing.tolist())]


def bucket_index(x: np.ndarray, boundaries: Sequence[float]) -> np.ndarray:
    """Bucket i such that boundaries[i-1] <= x < boundaries[i] (0 below the first)."""
    return np.searchsorted(np.asarray(boundaries, dtype=np.float64), x, side="right")


def op_bucketize(field: str, column: Sequence[Any], params: dict) -> Values:
    x = _numeric(field, column)
    missing = np.isnan(x)
    return _ints_or_empty(bucket_index(np.where(missing, 0.0, x), params["boundaries"]), missing)


def log_bucket_index(x: np.ndarray, base: float) -> np.ndarray:
    """floor(log_base(x)) for x >= 1 (299, base 2 -> 8); -1 for 0 <= x < 1; -2 for x < 0."""
    safe = np.where(x >= 1, x, 1.0)
    b = np.floor(np.log(safe) / math.log(base) + 1e-12).astype(np.int64)
    # correct float error at exact powers (e.g. log(1000)/log(10) = 2.9999999999999996)
    b = np.where(np.power(base, b + 1) <= safe, b + 1, b)
    b = np.where(np.power(base, b) > safe, b - 1, b)
    return np.where(x >= 1, b, np.where(x >= 0, -1, -2))


def op_log_bucket(field: str, column: Sequence[Any], params: dict) -> Values:
    x = _numeric(field, column)
    missing = np.isnan(x)
    return _ints_or_empty(log_bucket_index(np.where(missing, 1.0, x), params["base"]), missing)


def op_cross(field: str, parts: Sequence[Values], params: dict) -> Values:
    sep, cap = params["separator"], params["max_values"]
    out: Values = []
    for row in zip(*parts):
        if any(not p for p in row):
            out.append([])
        elif all(len(p) == 1 for p in row):
            out.append([sep.join(p[0] for p in row)])
        else:
            out.append([sep.join(c) for c in itertools.islice(itertools.product(*row), cap)])
    return out


def op_match_count(field: str, parts: Sequence[Values], params: dict) -> Values:
    a, b = parts
    counts = np.fromiter(
        (len(set(x).intersection(y)) if x and y else 0 for x, y in zip(a, b)), dtype=np.float64, count=len(a)
    )
    if "boundaries" in params:
        counts = bucket_index(counts, params["boundaries"]).astype(np.float64)
    return [[str(int(c))] for c in counts.tolist()]


RawOp = Callable[[str, Sequence[Any], dict], Values]
DerivedOp = Callable[[str, Sequence[Values], dict], Values]

RAW_OPS: dict[str, RawOp] = {
    "id": op_id,
    "tokenize": op_tokenize,
    "bucketize": op_bucketize,
    "log_bucket": op_log_bucket,
}
DERIVED_OPS: dict[str, DerivedOp] = {
    "cross": op_cross,
    "match_count": op_match_count,
}

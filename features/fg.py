"""Batch feature generation: raw features -> per-field row ids in ragged form.

The one FG used by training (``transform_columns``: every row carries all its
raw columns) and by serving (``transform``: one request + N candidates, the
request-scope fields computed once and broadcast). Row ids come out as
``RaggedIds`` (flat ``ids`` + ``offsets``), ready for a de-duplicated,
vectorized store lookup or for padding into a Keras batch.

Raw feature names are the spec's ``input`` columns; a missing key, None, NaN,
"" or [] is no value; keys the spec does not read are ignored.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import chain
from typing import Any, Mapping, Sequence

import numpy as np

from features.hashing_impl import rows_of
from features.ops_impl import DERIVED_OPS, RAW_OPS, FeatureValueError, Values
from features.spec import FeatureSpec, FieldSpec

__all__ = ["FeatureGenerator", "RaggedIds", "FGBatch", "FeatureValueError"]


@dataclass(frozen=True)
class RaggedIds:
    """Row ids of one field for n rows: row i owns ``ids[offsets[i]:offsets[i+1]]``."""
    ids: np.ndarray      # int64 [total]
    offsets: np.ndarray  # int64 [n + 1]

    @property
    def n(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @staticmethod
    def concat(parts: Sequence["RaggedIds"]) -> "RaggedIds":
        ids = np.concatenate([p.ids for p in parts]) if parts else np.zeros(0, np.int64)
        lengths = np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0, np.int64)
        return RaggedIds(ids, _offsets(lengths))

    def padded(self, max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, L] int64, mask [n, L] float32); values past ``max_len`` are dropped."""
        lengths = self.lengths
        L = int(lengths.max(initial=0)) if max_len is None else max_len
        L = max(L, 1)
        col = np.arange(L)[None, :]
        mask = col < lengths[:, None]
        idx = np.minimum(self.offsets[:-1, None] + col, max(len(self.ids) - 1, 0))
        ids = np.where(mask, self.ids[idx] if len(self.ids) else 0, 0).astype(np.int64)
        return ids, mask.astype(np.float32)


@dataclass(frozen=True)
class FGBatch:
    """FG output for n rows: one RaggedIds per field, in spec order.

    ``broadcast[f]`` is True for request-scope fields computed once (their
    RaggedIds has n == 1) and shared by all n candidates.
    """
    n: int
    fields: tuple[RaggedIds, ...]
    broadcast: tuple[bool, ...]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _freeze(v: Any):
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return ("__dict__",)  # invalid anyway: FG reports it on a miss
    if isinstance(v, float) and v != v:
        return None
    return v


class FeatureGenerator:
    """Runs a spec's FG. ``item_cache_size`` > 0 caches item-scope results per item."""

    def __init__(self, spec: FeatureSpec, item_cache_size: int = 0):
        self.spec = spec
        self.hash = spec.model.hash
        self._fields = spec.fields
        self._request = [f for f in spec.fields if f.scope == "request"]
        self._item = [f for f in spec.fields if f.scope == "item"]
        self._cross = [f for f in spec.fields if f.scope == "cross"]
        self._item_inputs = spec.raw_inputs("item")
        self._cache_size = item_cache_size
        self._cache: OrderedDict[tuple, tuple[Values, list[np.ndarray]]] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    # -- values ---------------------------------------------------------------------------
    def _values(self, fields: Sequence[FieldSpec], columns: Mapping[str, Sequence[Any]], n: int,
                known: dict[str, Values]) -> dict[str, Values]:
        """Values of ``fields`` (in order) from raw ``columns``; derived ops read ``known``."""
        for f in fields:
            try:
                if f.op in RAW_OPS:
                    col = columns.get(f.input)
                    if col is None:
                        col = [None] * n
                    vals = RAW_OPS[f.op](f.name, col, f.params)
                else:
                    vals = DERIVED_OPS[f.op](f.name, [known[x] for x in f.inputs], f.params)
            except TypeError as e:
                raise FeatureValueError(f"field '{f.name}': {e}") from None
            known[f.name] = vals
        return known

    def _ragged(self, f: FieldSpec, vals: Values) -> RaggedIds:
        lengths = np.fromiter((len(v) for v in vals), dtype=np.int64, count=len(vals))
        ids = rows_of(chain.from_iterable(vals), self.hash, f.rows)
        return RaggedIds(ids, _offsets(lengths))

    # -- training ---------------------------------------------------------------------------
    def transform_columns(self, columns: Mapping[str, Sequence[Any]], n: int) -> FGBatch:
        """Every field for n rows given column-wise raw values (training, offline checks)."""
        known = self._values(self._fields, columns, n, {})
        fields = tuple(self._ragged(f, known[f.name]) for f in self._fields)
        return FGBatch(n, fields, (False,) * len(fields))

    def values_columns(self, columns: Mapping[str, Sequence[Any]], n: int) -> dict[str, Values]:
        """Generated value strings per field (for inspection and tests)."""
        return self._values(self._fields, columns, n, {})

    # -- serving ----------------------------------------------------------------------------
    def transform(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> FGBatch:
        """One request + N candidates; request-scope fields computed once (n == 1, broadcast)."""
        n = len(candidates)
        req_cols = {f.input: [request.get(f.input)] for f in self._request}
        req_vals = self._values(self._request, req_cols, 1, {})
        out: dict[str, RaggedIds] = {f.name: self._ragged(f, req_vals[f.name]) for f in self._request}
        item_vals, item_ids = self._items(candidates)
        for j, f in enumerate(self._item):
            out[f.name] = item_ids[j]
        if self._cross:
            known = {name: v * n for name, v in req_vals.items()}
            known.update({f.name: item_vals[j] for j, f in enumerate(self._item)})
            self._values(self._cross, {}, n, known)
            for f in self._cross:
                out[f.name] = self._ragged(f, known[f.name])
        fields = tuple(out[f.name] for f in self._fields)
        return FGBatch(n, fields, tuple(f.scope == "request" for f in self._fields))

    def _items(self, candidates: Sequence[Mapping[str, Any]]) -> tuple[list[Values], list[RaggedIds]]:
        """Item-scope values and ids per item field, through the per-item cache."""
        n = len(candidates)
        if not self._item:
            return [], []
        if self._cache_size <= 0:
            cols = {c: [cand.get(c) for cand in candidates] for c in self._item_inputs}
            vals = self._values(self._item, cols, n, {})
            return ([vals[f.name] for f in self._item],
                    [self._ragged(f, vals[f.name]) for f in self._item])
        keys = [tuple(_freeze(cand.get(c)) for c in self._item_inputs) for cand in candidates]
        entries: list = [self._cache.get(k) for k in keys]
        miss_keys: dict[tuple, int] = {}
        for i, e in enumerate(entries):
            if e is None:
                miss_keys.setdefault(keys[i], i)
        self.cache_misses += len(miss_keys)
        self.cache_hits += n - len(miss_keys)
        if miss_keys:
            first = list(miss_keys.values())
            cols = {c: [candidates[i].get(c) for i in first] for c in self._item_inputs}
            vals = self._values(self._item, cols, len(first), {})
            per_field = [self._ragged(f, vals[f.name]) for f in self._item]
            for r, i in enumerate(first):
                self._cache[keys[i]] = ([vals[f.name][r] for f in self._item],
                                        [rg.ids[rg.offsets[r]:rg.offsets[r + 1]] for rg in per_field])
            entries = [e if e is not None else self._cache[k] for e, k in zip(entries, keys)]
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        item_vals = [[e[0][j] for e in entries] for j in range(len(self._item))]
        item_ids = []
        for j in range(len(self._item)):
            arrs = [e[1][j] for e in entries]
            lengths = np.fromiter((len(a) for a in arrs), dtype=np.int64, count=n)
            ids = np.concatenate(arrs) if n else np.zeros(0, np.int64)
            item_ids.append(RaggedIds(ids, _offsets(lengths)))
        return item_vals, item_ids

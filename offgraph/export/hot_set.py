"""Count the rows the training data looks up, for a version's static hot set (``offgraph.modeldir.hot_set``).

The training rows go through the shared FG (the same hashing as training and serving), a chunk of
``CHUNK_ROWS`` at a time, and every (table, row) a field looks up is counted, once per value a row
holds. The ``limit`` most counted rows, hottest first, are the hot set. A request-scope row (the
user's) is counted once per training row although a request looks it up once for all its
candidates: the count orders rows by how often training saw them, which is what the seed needs
(which rows first), not a prediction of the hit ratio (``offgraph plan`` does that).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from offgraph.features.fg import FeatureGenerator, FeatureValueError
from offgraph.features.spec import FeatureSpec
from offgraph.features.spec_columns import check_spec_columns
from offgraph.store.keys import combine_keys, split_keys

CHUNK_ROWS = 1 << 16
"""Training rows through FG at once (bounds the memory of one step)."""
_MERGE_EVERY = 16  # chunks' counts merged into the running total at once (one sort per merge)


class HotSet(NamedTuple):
    """The hot set a version records: hottest first, counted over the training rows of ``source``."""

    tables: np.ndarray
    rows: np.ndarray
    counts: np.ndarray
    lookups: int
    source: str


class KeyCounts:
    """Counts of combined keys (``offgraph.store.keys.combine_keys``), added a batch at a time."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, np.uint64)
        self._counts = np.zeros(0, np.uint64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.lookups = 0

    def add(self, keys: np.ndarray) -> None:
        """Count each of ``keys`` (uint64, repeats counted)."""
        k, c = np.unique(np.asarray(keys, dtype=np.uint64), return_counts=True)
        self._pending.append((k, c.astype(np.uint64)))
        self.lookups += int(len(keys))
        if len(self._pending) >= _MERGE_EVERY:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self._keys, *(k for k, _ in self._pending)])
        counts = np.concatenate([self._counts, *(c for _, c in self._pending)])
        self._pending = []
        self._keys, inverse = np.unique(keys, return_inverse=True)
        self._counts = np.bincount(inverse, weights=counts, minlength=len(self._keys)).astype(np.uint64)

    def top(self, limit: int, source: str) -> HotSet:
        """The ``limit`` most counted keys: by count, descending, ties by table then row (the same
        input always gives the same hot set)."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self._merge()
        order = np.lexsort((self._keys, -self._counts.astype(np.int64)))[:limit]
        t, r = split_keys(self._keys[order])
        return HotSet(t, r.astype(np.uint64), self._counts[order], self.lookups, source)


def count_lookups(
    spec: FeatureSpec,
    table: pa.Table,
    mask: np.ndarray | None = None,
    *,
    source: str = "<data>",
    progress: bool = True,
) -> KeyCounts:
    """Count the rows that the ``mask`` rows of ``table`` (all rows without one) look up through FG.
    Raises ValueError naming the column, field and row a value is refused at (as training does)."""
    from tqdm import tqdm

    check_spec_columns(spec, table.column_names, source)
    fg = FeatureGenerator(spec)
    wanted = {f.input for f in spec.fields if f.input} & set(table.column_names)
    table = table.select(sorted(wanted))
    picked = np.arange(table.num_rows) if mask is None else np.flatnonzero(np.asarray(mask, dtype=bool))
    counts = KeyCounts()
    bar = tqdm(total=len(picked), desc="hot set: counting lookups", unit="row", disable=not progress, leave=False)
    with bar:
        for s in range(0, len(picked), CHUNK_ROWS):
            idx = picked[s : s + CHUNK_ROWS]
            chunk = table.take(pa.array(idx))
            cols = {c: chunk.column(c).to_pylist() for c in chunk.column_names}
            try:
                batch = fg.transform_columns(cols, len(idx), dense=False)
            except FeatureValueError as e:
                raise ValueError(
                    f"hot set data {source}: {e} (row numbers count from data row {int(idx[0])}, the first of "
                    f"{len(idx)} counted together)"
                ) from None
            counts.add(np.concatenate([combine_keys(i, rag.ids) for i, rag in enumerate(batch.fields)]))
            bar.update(len(idx))
    return counts


def hot_set_of(
    spec: FeatureSpec,
    table: pa.Table,
    limit: int,
    mask: np.ndarray | None = None,
    *,
    source: str,
    progress: bool = True,
) -> HotSet:
    """The ``limit`` rows the ``mask`` rows of ``table`` (all without one) look up most (:func:`count_lookups`)."""
    counts = count_lookups(spec, table, mask, source=source, progress=progress)
    used = table.num_rows if mask is None else int(np.count_nonzero(mask))
    return counts.top(limit, f"{source}: {used} training rows")

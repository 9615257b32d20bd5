"""The request path's array maths: FG batch -> unique store keys -> pooled [N, F, D] / [N, F].

No per-value Python loop: keys of all fields are concatenated, de-duplicated
once, looked up once, scattered back and pooled per field with NumPy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from offgraph.features.fg import FGBatch
from offgraph.features.pooling import POOLING_MODES, recency_weights
from offgraph.store.keys import combine_keys, split_keys, unique_inverse


@dataclass(frozen=True)
class Keys:
    """All (table, row) lookups of a batch: ``unique_*`` to read, ``inverse`` to scatter back."""

    unique_tables: np.ndarray  # uint32 [U]
    unique_rows: np.ndarray  # int64 [U]
    inverse: np.ndarray  # int64 [K]: position in unique of each looked-up value
    unique_keys: np.ndarray  # uint64 [U]: combined keys (offgraph.store.keys.combine_keys), ascending
    field_bounds: np.ndarray  # int64 [F + 1]: field f owns lookups field_bounds[f]:field_bounds[f+1]


def batch_keys(batch: FGBatch) -> Keys:
    sizes = np.fromiter((len(r.ids) for r in batch.fields), dtype=np.int64, count=len(batch.fields))
    bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    tables = np.repeat(np.arange(len(sizes), dtype=np.uint32), sizes)
    rows = np.concatenate([r.ids for r in batch.fields]) if bounds[-1] else np.zeros(0, np.int64)
    uniq, inverse = unique_inverse(combine_keys(tables, rows))
    ut, ur = split_keys(uniq)
    return Keys(ut, ur, inverse.astype(np.int64, copy=False), uniq, bounds)


@dataclass(frozen=True)
class Segments:
    """A batch's pooled (field, row) segments: ``sums`` [S, D+1] (vector, then weight) and ``seg`` [N, F], the
    segment of each candidate's field (one shared segment for a broadcast request field)."""

    sums: np.ndarray
    seg: np.ndarray
    dim: int

    def whole(self) -> tuple[np.ndarray, np.ndarray]:
        """emb [N, F, D], first_order [N, F]; each gathered on its own (no [N, F, D+1] intermediate to copy apart)."""
        return np.ascontiguousarray(self.sums[self.seg, : self.dim]), np.ascontiguousarray(
            self.sums[self.seg, self.dim]
        )

    def split(self, request_fields: np.ndarray, candidate_fields: np.ndarray) -> dict[str, np.ndarray]:
        """The dense ``split`` signature's inputs: the request fields' segments once (every candidate shares
        them) as ``req_emb`` [1, F_r, D] / ``req_first_order`` [1, F_r], the other fields as ``cand_emb``
        [N, F_c, D] / ``cand_first_order`` [N, F_c]. No [N, F_r, D] broadcast copy is built."""
        req = self.seg[:1, request_fields]
        cand = self.seg[:, candidate_fields]
        d = self.dim
        return {
            "req_emb": self.sums[req, :d],
            "req_first_order": self.sums[req, d],
            "cand_emb": self.sums[cand, :d],
            "cand_first_order": self.sums[cand, d],
        }


def pool_batch(
    batch: FGBatch,
    keys: Keys,
    vectors: np.ndarray,
    first_order: np.ndarray,
    poolings: list[str],
    dim: int,
    half_lives: Sequence[float | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows' vectors [U, D] / weights [U] -> emb [N, F, D], first_order [N, F] (:func:`pool_segments`)."""
    return pool_segments(batch, keys, vectors, first_order, poolings, dim, half_lives).whole()


def pool_segments(
    batch: FGBatch,
    keys: Keys,
    vectors: np.ndarray,
    first_order: np.ndarray,
    poolings: list[str],
    dim: int,
    half_lives: Sequence[float | None] | None = None,
) -> Segments:
    """Unique rows' vectors [U, D] / weights [U] -> the pooled segments of every (field, row) (:func:`pool_rows`)."""
    table = np.empty((len(vectors), dim + 1), dtype=np.float32)
    table[:, :dim] = vectors
    table[:, dim] = first_order
    return pool_rows(batch, keys, table, poolings, half_lives)


def _value_weights(batch: FGBatch, poolings: list[str], half_lives: Sequence[float | None] | None) -> np.ndarray | None:
    """Each lookup's weight (lookups in (field, row, value) order) where some field pools by recency
    (``recency_weights`` of its rows' lengths; 1 for the other fields' values); None where none does."""
    recency = {f: None if half_lives is None else half_lives[f] for f, p in enumerate(poolings) if p == "recency"}
    if not recency:
        return None
    sizes = np.fromiter((int(r.offsets[-1]) for r in batch.fields), dtype=np.int64, count=len(batch.fields))
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    out = np.ones(int(starts[-1]), dtype=np.float32)
    for f, half_life in recency.items():  # a loop over fields, not values
        if half_life is None:
            raise ValueError(f"field {f}: recency pooling needs its half_life")
        out[starts[f] : starts[f + 1]] = recency_weights(batch.fields[f].lengths, half_life)
    return out


def pool_rows(
    batch: FGBatch,
    keys: Keys,
    table: np.ndarray,
    poolings: list[str],
    half_lives: Sequence[float | None] | None = None,
) -> Segments:
    """Unique rows [U, D+1] (each vector, then its weight: ``read_through_cache``) -> the pooled
    segments of every (field, row).

    All fields at once, vectors and weights together as [U, D+1]. The lookups are in
    (field, row) order, so each (field, row) segment is contiguous: the segments' first
    values are gathered in one go, then the j-th values added for the segments longer
    than j (a loop over positions, not values: as many steps as the longest segment;
    the same summation order as ``offgraph.features.pooling.pool_numpy``). Mean divides by the
    count. Recency (``half_lives[f]``, the spec's ``half_life``) weighs each value by
    ``offgraph.features.pooling.recency_weights`` as it is added (the weights sum to 1: nothing to divide).
    A broadcast request field has one segment, pooled once; a grouped field (``FGBatch.segment_of``) one
    per distinct value list.
    """
    n, F = batch.n, len(batch.fields)
    if len(poolings) != F:
        raise ValueError(f"{len(poolings)} poolings for {F} fields")
    bad = set(poolings) - set(POOLING_MODES)
    if bad:
        raise ValueError(f"unknown pooling {sorted(bad)[0]!r}: expected one of {list(POOLING_MODES)}")
    weights = _value_weights(batch, poolings, half_lives)
    dim = table.shape[1] - 1
    inverse = keys.inverse  # lookup k's row of ``table``: gathered straight into the sums, no [K, D+1] copy
    if F:
        lengths = np.concatenate([r.offsets[1:] - r.offsets[:-1] for r in batch.fields])
    else:
        lengths = np.zeros(0, np.int64)
    nseg = np.fromiter((r.n for r in batch.fields), dtype=np.int64, count=F)
    first_seg = np.zeros(F, dtype=np.int64)
    np.cumsum(nseg[:-1], out=first_seg[1:])
    bcast = np.array(batch.broadcast, dtype=bool)
    seg = first_seg[None, :] + np.where(bcast, 0, np.arange(n)[:, None])  # [N, F] segment of each output
    if batch.segment_of is not None:  # grouped fields: each candidate's distinct value list
        for f, of in enumerate(batch.segment_of):
            if of is not None:
                seg[:, f] = first_seg[f] + of
    if len(lengths) == len(inverse) and (lengths == 1).all():
        sums = table[inverse]
    else:
        # segments by length, longest first: those longer than j are a prefix
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        # a stable sort of narrow integers is a radix sort: the same order as on int64, in linear time
        narrow = np.int16 if len(lengths) and int(lengths.max()) < 2**15 else np.int64
        order = np.argsort(np.negative(lengths, dtype=narrow), kind="stable")
        sl, st = lengths[order], starts[order]
        longer = np.searchsorted(-sl, -np.arange(int(sl[0]) if len(sl) else 0), side="left")  # #segments > j
        sums = np.zeros((len(lengths), dim + 1), dtype=np.float32)
        if weights is None:
            if len(longer):
                sums[: longer[0]] = table[inverse[st[: longer[0]]]]
            for j in range(1, len(longer)):
                c = longer[j]
                sums[:c] += table[inverse[st[:c] + j]]
        else:  # the same walk, each value times its weight
            for j in range(len(longer)):
                at = st[: longer[j]] + j
                sums[: longer[j]] += table[inverse[at]] * weights[at][:, None]
        mean = np.repeat(np.array([p == "mean" for p in poolings]), nseg)[order] & (sl > 1)
        if mean.any():  # one pass over all segments (dividing by 1 is exact): cheaper than a masked gather+scatter
            np.divide(sums, np.where(mean, sl, 1).astype(np.float32)[:, None], out=sums)
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        seg = rank[seg]
    return Segments(sums, seg, dim)


def read_through_cache(
    cache,
    store,
    tables: np.ndarray,
    rows: np.ndarray,
    feed=None,
    keys=None,
    parallel: bool = True,
    timing: dict | None = None,
):
    """Rows ``(tables, rows)`` (unique): the write feed's fresh rows first (``feed``: the follower, if
    any; ``keys``: their combined keys, computed when not given), then the row
    cache, then a store read of the misses, inserted into the cache with the epoch
    taken BEFORE the feed lookup (so a row the writer puts in the feed
    meanwhile can never be cached at its older store value). Returns ``(rows float32 [U, D+1]: each
    vector then its weight, as :func:`pool_rows` takes them; cache hits, rows read from the store, of which
    found)``. ``parallel``: see ``EmbeddingStore.read_unique``. ``timing``: a dict that gets
    ``store_read_seconds``, the wall time of the store read, when there was one."""
    epoch = cache.epoch if cache is not None else 0
    found = None
    if feed is not None:
        keys = combine_keys(tables, rows) if keys is None else keys
        found = feed.lookup(keys)
    if found is None:
        return _cache_then_store(cache, store, tables, rows, keys, epoch, parallel, timing)
    idx, ov_vec, ov_w = found
    d = ov_vec.shape[1]
    out = np.empty((len(rows), d + 1), dtype=np.float32)
    out[idx, :d], out[idx, d] = ov_vec, ov_w
    if len(idx) == len(rows):
        return out, 0, 0, 0
    rest = np.ones(len(rows), dtype=bool)
    rest[idx] = False
    rest = np.flatnonzero(rest)
    got, hits, read, n_found = _cache_then_store(
        cache, store, tables[rest], rows[rest], keys[rest], epoch, parallel, timing
    )
    out[rest] = got
    return out, hits, read, n_found


def _timed_read(
    store, tables: np.ndarray, rows: np.ndarray, parallel: bool, timing: dict | None, records: bool = False
):
    t0 = time.perf_counter()
    out = (store.read_unique_records if records else store.read_unique)(tables, rows, parallel)
    if timing is not None:
        timing["store_read_seconds"] = time.perf_counter() - t0
    return out


def _cache_then_store(
    cache,
    store,
    tables: np.ndarray,
    rows: np.ndarray,
    keys: np.ndarray | None,
    epoch: int,
    parallel: bool = True,
    timing: dict | None = None,
):
    if cache is None:
        vec, w, found = _timed_read(store, tables, rows, parallel, timing)
        out = np.empty((len(rows), vec.shape[1] + 1), dtype=np.float32)
        out[:, :-1], out[:, -1] = vec, w
        return out, 0, len(rows), int(found.sum())
    # the cache holds the store's records: hits and the misses' records are decoded together, once
    hit, hit_records, _ = cache.lookup_records(tables, rows, keys)
    miss = np.flatnonzero(~hit)
    if len(miss) == 0:
        return store.codec.decode_rows(hit_records), len(rows), 0, 0
    mt, mr = tables[miss], rows[miss]
    miss_records, found = _timed_read(store, mt, mr, parallel, timing, records=True)
    records = np.empty((len(rows), store.codec.record_bytes), dtype=np.uint8)
    records[hit] = hit_records
    records[miss] = miss_records  # an absent row's record is all zeros: it decodes to zeros, as read_unique's
    cache.insert(mt, mr, miss_records, epoch)
    return store.codec.decode_rows(records), len(rows) - len(miss), len(miss), int(found.sum())

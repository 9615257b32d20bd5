"""In-process hot-row cache of a server: ``(table, row) -> the row's store record``.

    cache = RowCache(capacity_mb=200, codec=store.codec)
    hit, recs, epoch = cache.lookup_records(tids, rows)         # vectorized over the batch
    mrecs, found = store.read_unique_records(tids[~hit], rows[~hit])   # misses only
    cache.insert(tids[~hit], rows[~hit], mrecs, epoch)          # skipped if invalidated since
    cache.invalidate(changed_tids, changed_rows)                # rows the write feed held (the follower)
    hit, vec, w, epoch = cache.lookup(tids, rows)               # or decoded: float32 [U, D], [U]

It holds the quantized records the store holds (int8 D=16: 21 bytes, not 68 decoded), in one fixed
uint8 arena sized from ``capacity_mb`` (``stats()["bytes"]`` never exceeds it; ``bytes_per_row``
is what a planner divides by), no Python object per row. A hit decodes with the store's codec, so
it is bit-identical to a store read. Set-associative (``ways`` slots per set); the policy
(``_row_cache``: TinyLFU admission over a set-associative LFU by default, LRU for comparison)
was chosen on the bench's traces (``bench/cache_policy.py``). One lock around each operation (they
take microseconds). See ``_row_cache`` for how the epoch keeps a row read before an update
from being cached after it. Table ids must be < 0xFFFF and rows < 2**48.
"""

from __future__ import annotations

import threading

import numpy as np

from offgraph.store._row_cache import (
    POLICIES,
    SKETCH_BYTES_PER_ROW,
    CacheArrays,
    bytes_per_row,
    hot_keys,
    layout,
    scores,
    state_bytes,
)
from offgraph.store.keys import MAX_TABLE_ID, ROW_LIMIT, combine_keys, split_keys
from offgraph.store.quant import Codec, check_records

DEFAULT_WAYS = 8


class RowCache:
    def __init__(
        self,
        capacity_mb: float,
        codec: Codec,
        ways: int = DEFAULT_WAYS,
        policy: str = "tinylfu",
        sketch_bytes: float = SKETCH_BYTES_PER_ROW,
    ) -> None:
        if not isinstance(codec, Codec):
            raise ValueError(f"codec must be a store codec (offgraph.store.quant), got {codec!r}")
        if isinstance(ways, bool) or not isinstance(ways, int) or ways < 1:
            raise ValueError(f"ways must be an int >= 1, got {ways!r}")
        if isinstance(capacity_mb, bool) or not isinstance(capacity_mb, (int, float)) or not capacity_mb > 0:
            raise ValueError(f"capacity_mb must be a number > 0, got {capacity_mb!r}")
        rb = codec.record_bytes
        budget = float(capacity_mb) * (1 << 20)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if isinstance(sketch_bytes, bool) or not isinstance(sketch_bytes, (int, float)) or not sketch_bytes > 0:
            raise ValueError(f"sketch_bytes must be a number > 0, got {sketch_bytes!r}")
        self.bytes_per_row = bytes_per_row(ways, rb, policy, sketch_bytes)  # arena bytes per cached row: a planner's
        sets, sketch = layout(budget, ways, rb, policy, sketch_bytes)
        if sets < 1:
            raise ValueError(f"capacity_mb={capacity_mb} cannot hold one set of {ways} rows of {rb} bytes")
        self.capacity_mb = float(capacity_mb)
        self.codec, self.dim, self.ways, self.policy = codec, codec.dim, ways, policy
        self._sketch_bytes, self._max_ways = float(sketch_bytes), ways
        self._a = CacheArrays(sets, ways, rb, policy, sketch)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def capacity_rows(self) -> int:
        return self._a.sets * self.ways

    def lookup_records(self, table_ids, rows, keys=None) -> tuple[np.ndarray, np.ndarray, int]:
        """``(hit bool [U], records uint8 [H, rb] of the hits in order, epoch)``. Pass ``epoch`` to the
        :meth:`insert` of the rows read after. ``keys``: the rows' combined keys, when the caller has them."""
        k = combine_keys(table_ids, rows) if keys is None else keys
        with self._lock:
            hit, recs = self._a.lookup(k)
            self.hits += len(recs)
            self.misses += len(k) - len(recs)
            return hit, recs, self._a.epoch

    def lookup(self, table_ids, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(hit bool [U], vectors float32 [U, D], first_order float32 [U], epoch)``, decoded with the
        store's codec; misses read as zeros."""
        hit, recs, epoch = self.lookup_records(table_ids, rows)
        vec = np.zeros((len(hit), self.dim), dtype=np.float32)
        w = np.zeros(len(hit), dtype=np.float32)
        if len(recs):
            vec[hit], w[hit] = self.codec.decode(recs)
        return hit, vec, w, epoch

    def insert(self, table_ids, rows, records, epoch: int) -> int:
        """Cache the store records of rows read after the lookup that returned ``epoch``; keys
        invalidated since then are skipped, and the policy may decline some (see ``_row_cache``).
        Returns the number of rows stored."""
        k = combine_keys(table_ids, rows)
        recs = check_records(records, self.codec.record_bytes)
        if len(recs) != len(k):
            raise ValueError(
                f"insert of {len(k)} rows needs records [{len(k)}, {self.codec.record_bytes}], got {recs.shape}"
            )
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
            raise ValueError(f"epoch must be the int returned by lookup, got {epoch!r}")
        with self._lock:
            return self._a.insert(k, recs, int(epoch))

    def invalidate(self, table_ids, rows) -> int:
        """Drop these keys if cached (and refuse inserts of rows read before now).
        Keys the cache cannot hold (table > 0xFFFE, row outside [0, 2**48)) are never
        cached and are ignored. Returns the number of cached rows dropped."""
        t, r = np.asarray(table_ids), np.asarray(rows)
        t = np.broadcast_to(t, r.shape)
        if r.size and (t.max() > MAX_TABLE_ID or r.max() >= ROW_LIMIT or r.min() < 0):
            ok = (t <= MAX_TABLE_ID) & (r < ROW_LIMIT) & (r >= 0)
            t, r = t[ok], r[ok]
        k = combine_keys(t, r)
        with self._lock:
            return self._a.invalidate(k)

    def hot_keys(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """``(table_ids uint32, rows int64)`` of up to ``limit`` cached rows, the most frequently (LRU:
        recently) used first: what a freshly loaded version of the same model warms its caches with."""
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        if not limit:
            return split_keys(np.zeros(0, np.uint64))
        with self._lock:  # two copies (memcpy) under the lock; the scores and the selection without it
            keys, state = self._a.snapshot()
        return split_keys(hot_keys(keys, scores(keys, state), int(limit)))

    def resize(self, capacity_mb: float) -> int:
        """Hold at most ``capacity_mb`` from now on: the same sets with as many ways as fit, up to the
        ways it was made with (each set keeps its most used rows when it shrinks), or, below one way a
        set, an empty cache laid out afresh.
        For a model that starts or stops serving a second version (labels) out of the same share.
        The old arrays are freed once the new ones are built (for a moment both exist). Returns the
        rows it can hold now."""
        if isinstance(capacity_mb, bool) or not isinstance(capacity_mb, (int, float)) or not capacity_mb > 0:
            raise ValueError(f"capacity_mb must be a number > 0, got {capacity_mb!r}")
        budget = float(capacity_mb) * (1 << 20)
        rb = self.codec.record_bytes
        with self._lock:
            a = self._a
            per_way = a.sets * (8 + rb + state_bytes(self.policy))
            # never more ways than it was made with: each lookup compares a key with a whole set
            ways = min(int((budget - len(a.sketch) - a.sets * 8) // per_way), self._max_ways)
            if ways >= 1:
                self._a = a.with_ways(ways)
            else:
                sets, sketch = layout(budget, self.ways, rb, self.policy, self._sketch_bytes)
                if sets < 1:
                    raise ValueError(f"capacity_mb={capacity_mb} cannot hold one set of {self.ways} rows of {rb} bytes")
                fresh = CacheArrays(sets, self.ways, rb, self.policy, sketch)
                fresh.epoch = a.epoch + 1  # inserts of rows looked up before now are refused
                fresh.set_epoch[:] = fresh.epoch
                self._a = fresh
            self.ways = self._a.ways
            self.capacity_mb = float(capacity_mb)
            self.bytes_per_row = bytes_per_row(self.ways, rb, self.policy, self._sketch_bytes)
            return self.capacity_rows

    def clear(self) -> None:
        with self._lock:
            self._a.clear()

    @property
    def epoch(self) -> int:
        return self._a.epoch

    def stats(self) -> dict:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "entries": self._a.entries,
                "capacity_rows": self.capacity_rows,
                "bytes": self._a.nbytes,
            }

    def __repr__(self) -> str:
        return (
            f"RowCache(capacity_mb={self.capacity_mb}, codec={self.codec.name}, ways={self.ways}, "
            f"policy={self.policy}, rows={self.capacity_rows})"
        )

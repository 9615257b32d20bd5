"""In-process hot-row cache of a server: ``(table, row) -> (vector, first-order weight)``.

    cache = RowCache(capacity_mb=64, dim=16)
    hit, vec, w, epoch = cache.lookup(tids, rows)          # vectorized over the batch
    mv, mw, _ = store.read_unique(tids[~hit], rows[~hit])   # misses only
    cache.insert(tids[~hit], rows[~hit], mv, mw, epoch)     # skipped if invalidated since
    cache.invalidate(changed_tids, changed_rows)            # rows the write feed held (the follower)

Fixed NumPy arrays sized from ``capacity_mb`` (``stats()["bytes"]`` never exceeds it),
set-associative (``ways`` slots per set, LRU within a set). One lock around each
operation (they take microseconds). See ``row_cache_impl`` for the layout and for how
the epoch keeps a row read before an update from being cached after it.
Table ids must be < 0xFFFF and rows < 2**48.
"""
from __future__ import annotations

import threading

import numpy as np

from .keys import MAX_TABLE_ID, ROW_LIMIT, combine_keys, split_keys
from .row_cache_impl import CacheArrays, hot_keys, slot_bytes


class RowCache:
    def __init__(self, capacity_mb: float, dim: int, ways: int = 4) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if isinstance(ways, bool) or not isinstance(ways, int) or ways < 1:
            raise ValueError(f"ways must be an int >= 1, got {ways!r}")
        if isinstance(capacity_mb, bool) or not isinstance(capacity_mb, (int, float)) or not capacity_mb > 0:
            raise ValueError(f"capacity_mb must be a number > 0, got {capacity_mb!r}")
        budget = float(capacity_mb) * (1 << 20)
        sets = int(budget // (slot_bytes(dim, ways) * ways))
        while sets > 0 and _arrays_bytes(sets, ways, dim) > budget:
            sets -= 1
        if sets < 1:
            raise ValueError(f"capacity_mb={capacity_mb} cannot hold one set of {ways} rows of dim {dim}")
        self.capacity_mb = float(capacity_mb)
        self.dim, self.ways = dim, ways
        self._a = CacheArrays(sets, ways, dim)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def capacity_rows(self) -> int:
        return self._a.sets * self.ways

    def lookup(self, table_ids, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(hit bool [U], vectors float32 [U, D], first_order float32 [U], epoch)``;
        misses read as zeros. Pass ``epoch`` to the :meth:`insert` of the rows read after."""
        k = combine_keys(table_ids, rows)
        with self._lock:
            hit, vec, w = self._a.lookup(k)
            n_hit = int(np.count_nonzero(hit))
            self.hits += n_hit
            self.misses += len(k) - n_hit
            return hit, vec, w, self._a.epoch

    def insert(self, table_ids, rows, vectors, first_order, epoch: int) -> int:
        """Cache rows read from the store after the lookup that returned ``epoch``; keys
        invalidated since then are skipped. Returns the number of rows stored."""
        k = combine_keys(table_ids, rows)
        vec = np.asarray(vectors, dtype=np.float32)
        w = np.asarray(first_order, dtype=np.float32)
        if vec.shape != (len(k), self.dim) or w.shape != (len(k),):
            raise ValueError(f"insert of {len(k)} rows needs vectors [{len(k)}, {self.dim}] and first_order "
                             f"[{len(k)}], got {vec.shape} and {w.shape}")
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
            raise ValueError(f"epoch must be the int returned by lookup, got {epoch!r}")
        with self._lock:
            return self._a.insert(k, vec, w, int(epoch))

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
        """``(table_ids uint32, rows int64)`` of up to ``limit`` cached rows, the most recently used
        first: what a freshly loaded version of the same model warms its caches with."""
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        if not limit:
            return split_keys(np.zeros(0, np.uint64))
        with self._lock:  # two copies (memcpy) under the lock; the selection (sorts) without it
            keys, clock = self._a.snapshot()
        return split_keys(hot_keys(keys, clock, int(limit)))

    def clear(self) -> None:
        with self._lock:
            self._a.clear()

    @property
    def epoch(self) -> int:
        return self._a.epoch

    def stats(self) -> dict:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "entries": self._a.entries,
                    "capacity_rows": self.capacity_rows, "bytes": self._a.nbytes}

    def __repr__(self) -> str:
        return f"RowCache(capacity_mb={self.capacity_mb}, dim={self.dim}, ways={self.ways}, rows={self.capacity_rows})"


def _arrays_bytes(sets: int, ways: int, dim: int) -> int:
    C = sets * ways
    return C * (8 + 4 * dim + 4 + 8) + sets * 8

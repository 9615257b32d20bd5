"""Array maths of the row cache: a set-associative table in fixed NumPy arrays.

Slot layout: ``C = sets * ways`` slots; set ``s`` owns slots ``s*ways .. s*ways+ways-1``.
A combined key (``keys.combine_keys``) lives in set ``splitmix64(key) mod sets``. Every operation
is vectorized over the batch (no per-row Python loop).

Replacement: each slot carries the clock of its last insert or hit; a new key takes
the set's empty slots first, then the least recently used ones.

Invalidation epochs: ``invalidate`` bumps the epoch and writes it into the
invalidated keys' SETS (``set_epoch``; a set, not a slot, because an invalidated key
may not be cached at all while a reader is fetching it from the store). ``insert``
with the epoch of the lookup that preceded the store read skips every key whose set
was invalidated after that epoch, so a row read before an update can never be
cached after the update's invalidation. A skip may also hit an innocent key of the
same set: it only costs a later miss.
"""
from __future__ import annotations

import numpy as np

from .keys import splitmix64

EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)  # no combined key is all ones (keys.MAX_TABLE_ID)


def slot_bytes(dim: int, ways: int) -> float:
    """Bytes of cache arrays per slot: key u64, vector f32[D], weight f32, clock i64,
    plus the set's epoch i64 shared by ``ways`` slots."""
    return 8 + 4 * dim + 4 + 8 + 8 / ways


class CacheArrays:
    """The arrays and the vectorized operations (no locking: see ``row_cache.RowCache``)."""

    def __init__(self, sets: int, ways: int, dim: int) -> None:
        self.sets, self.ways, self.dim = sets, ways, dim
        C = sets * ways
        self.keys = np.full(C, EMPTY, dtype=np.uint64)
        self.vectors = np.zeros((C, dim), dtype=np.float32)
        self.first_order = np.zeros(C, dtype=np.float32)
        self.clock = np.full(C, -1, dtype=np.int64)  # last insert/hit; -1 = empty
        self.set_epoch = np.zeros(sets, dtype=np.int64)
        self.epoch = 0
        self.tick = 0
        self.entries = 0
        self._way = np.arange(ways, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.vectors, self.first_order, self.clock, self.set_epoch))

    def _find(self, k: np.ndarray):
        """(set [K], slots [K, W], hit bool [K], slot of the hit [K] (garbage where miss))."""
        s = (splitmix64(k) % np.uint64(self.sets)).astype(np.int64)
        slots = s[:, None] * self.ways + self._way
        m = self.keys[slots] == k[:, None]
        hit = m.any(axis=1)
        slot = slots[np.arange(len(k)), m.argmax(axis=1)]
        return s, slots, hit, slot

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of ``(keys, clock)``: what :func:`hot_keys` selects from, outside the cache's lock."""
        return self.keys.copy(), self.clock.copy()


    def lookup(self, k: np.ndarray):
        n = len(k)
        vec = np.zeros((n, self.dim), dtype=np.float32)
        w = np.zeros(n, dtype=np.float32)
        if n == 0:
            return np.zeros(0, bool), vec, w
        _, _, hit, slot = self._find(k)
        hs = slot[hit]
        vec[hit] = self.vectors[hs]
        w[hit] = self.first_order[hs]
        self.tick += 1
        self.clock[hs] = self.tick
        return hit, vec, w

    def insert(self, k: np.ndarray, vectors: np.ndarray, first_order: np.ndarray, epoch: int) -> int:
        """Put rows unless their set was invalidated after ``epoch``; returns rows stored."""
        if len(k) == 0:
            return 0
        k, first = np.unique(k, return_index=True)
        s, slots, hit, slot = self._find(k)
        ok = self.set_epoch[s] <= epoch
        self.tick += 1
        # keys already cached: overwrite in place
        h = ok & hit
        hs = slot[h]
        src = first[h]
        self.vectors[hs] = vectors[src]
        self.first_order[hs] = first_order[src]
        self.clock[hs] = self.tick
        stored = len(hs)
        new = np.flatnonzero(ok & ~hit)
        if len(new) == 0:
            return stored
        ns = s[new]
        order = np.argsort(ns, kind="stable")
        new, ns = new[order], ns[order]
        useti, start, count = np.unique(ns, return_index=True, return_counts=True)
        g = np.repeat(np.arange(len(useti)), count)
        rank = np.arange(len(new)) - start[g]
        # victims of each touched set: empty slots first, then least recently used;
        # the slots just overwritten above carry the newest clock and come last
        set_slots = useti[:, None] * self.ways + self._way
        victims = np.take_along_axis(set_slots, np.argsort(self.clock[set_slots], axis=1, kind="stable"), axis=1)
        room = self.ways - np.count_nonzero(self.clock[set_slots] == self.tick, axis=1)
        keep = rank < room[g]
        new, g, rank = new[keep], g[keep], rank[keep]
        dst = victims[g, rank]
        self.entries += int(np.count_nonzero(self.keys[dst] == EMPTY))
        src = first[new]
        self.keys[dst] = k[new]
        self.vectors[dst] = vectors[src]
        self.first_order[dst] = first_order[src]
        self.clock[dst] = self.tick
        return stored + len(dst)

    def invalidate(self, k: np.ndarray) -> int:
        """Drop the keys if cached and mark their sets invalidated now; returns rows dropped."""
        self.epoch += 1
        if len(k) == 0:
            return 0
        s, _, hit, slot = self._find(k)
        self.set_epoch[s] = self.epoch
        hs = np.unique(slot[hit])
        self.keys[hs] = EMPTY
        self.clock[hs] = -1
        self.entries -= len(hs)
        return len(hs)

    def clear(self) -> None:
        self.epoch += 1
        self.keys[:] = EMPTY
        self.clock[:] = -1
        self.set_epoch[:] = self.epoch
        self.entries = 0


def hot_keys(keys: np.ndarray, clock: np.ndarray, limit: int) -> np.ndarray:
    """Up to ``limit`` of a :meth:`CacheArrays.snapshot`'s keys, the most recently used first.

    It runs while another version serves, on a CPU the requests need: one partition of the clocks
    finds the ``limit``-th newest clock, one comparison keeps the slots at or above it, and only
    those are sorted (a third of the work of partitioning the used slots' clocks)."""
    n = len(clock)
    if 0 < limit < n:
        threshold = max(int(np.partition(clock, n - limit)[n - limit]), 0)  # empty slots are -1
    else:
        threshold = 0
    used = np.flatnonzero(clock >= threshold)  # limit of them, or more where clocks tie at the threshold
    return keys[used[np.argsort(-clock[used], kind="stable")[:limit]]]

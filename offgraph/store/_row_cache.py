"""Array maths of the row cache: a set-associative table of store records in fixed NumPy arrays.

Slot layout: ``C = sets * ways`` slots; set ``s`` owns slots ``s*ways .. s*ways+ways-1``. A slot holds
a combined key (``keys.combine_keys``) u64, the row's store record (the exact bytes the store holds,
``codec.record_bytes``, in one uint8 arena ``[C, rb]``) and one byte of policy state. A key lives in
set ``splitmix64(key) mod sets``. Every operation is vectorized over the batch (no per-row loop).

Policy ``"tinylfu"`` (the default, chosen by measurement: ``bench/cache_policy.py``): a set-associative
LFU with TinyLFU admission (Einziger, Friedman, Manes 2017). A count-min sketch (``SKETCH_DEPTH`` rows
of uint8 counters, conservative update) counts every key looked up, cached or not. A slot's state is
its key's frequency (the sketch estimate when it came in, plus one per hit). A missed key is admitted
into its set only into an empty slot or over the set's least frequent slot, and only if its sketch
frequency is HIGHER than that slot's: a key seen once cannot push out a key seen twice, so one-off
tail keys (most of a Zipf trace's distinct keys) never churn the hot set. Counters age: every
``AGE_FACTOR * C`` lookups all counters (sketch and slots) are halved, a slice per call (no stall),
so a key that was hot once fades out. Policy ``"lru"`` (the old one, for comparison): the state is the
clock of the last use, a miss always takes the set's oldest slot.

Invalidation epochs: ``invalidate`` bumps the epoch and writes it into the invalidated keys' SETS
(``set_epoch``; a set, not a slot, because an invalidated key may not be cached at all while a reader
is fetching it from the store). ``insert`` with the epoch of the lookup that preceded the store read
skips every key whose set was invalidated after that epoch, so a row read before an update can never
be cached after the update's invalidation. A skip may also hit an innocent key of the same set: it only
costs a later miss.
"""

from __future__ import annotations

import numpy as np

from offgraph.store.keys import EMPTY, splitmix64

POLICIES = ("tinylfu", "lru")
SKETCH_DEPTH = 4
BLOCK = 64  # bytes of sketch a key's counters share (a cache line)
SKETCH_BYTES_PER_ROW = 6.0  # sketch counters (bytes) per cached row, all depths together: bench/cache_policy
AGE_FACTOR = 100  # halve every counter once per AGE_FACTOR * C lookups (TinyLFU's sample size W = 10 C)
_SAT = 255


def state_bytes(policy: str) -> int:
    """Bytes of per-slot policy state: a uint8 frequency, or an int64 clock (LRU)."""
    return 1 if policy == "tinylfu" else 8


def bytes_per_row(ways: int, record_bytes: int, policy: str, sketch_bytes: float = SKETCH_BYTES_PER_ROW) -> float:
    """Arrays' bytes per cached row, the sketch's share included (the planner's figure; :func:`layout`
    is exact)."""
    sk = sketch_bytes if policy == "tinylfu" else 0.0
    return 8 + record_bytes + state_bytes(policy) + 8 / ways + sk


def layout(
    budget: float, ways: int, record_bytes: int, policy: str, sketch_bytes: float = SKETCH_BYTES_PER_ROW
) -> tuple[int, int]:
    """``(sets, sketch counters)`` of the largest cache whose arrays fit in ``budget`` bytes: the sketch
    about ``sketch_bytes`` per row in whole blocks (one at least; none for LRU), the
    slots (key, record, state, and a set epoch per set) the rest."""
    sketch = 0
    if policy == "tinylfu":
        want = int(sketch_bytes * budget / bytes_per_row(ways, record_bytes, policy, sketch_bytes))
        sketch = max(want // BLOCK, 1) * BLOCK
    per_set = ways * (8 + record_bytes + state_bytes(policy)) + 8
    return max(int((budget - sketch) // per_set), 0), sketch


class CacheArrays:
    """The arrays and the vectorized operations (no locking: see ``row_cache.RowCache``)."""

    def __init__(self, sets: int, ways: int, record_bytes: int, policy: str = "tinylfu", sketch: int = BLOCK) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.sets, self.ways, self.record_bytes, self.policy = sets, ways, record_bytes, policy
        C = sets * ways
        self.keys = np.full(C, EMPTY, dtype=np.uint64)
        # one fixed-size opaque item per slot: a gather or scatter of whole records is one memcpy each
        # (fancy indexing of a uint8 [C, rb] array copies them byte by byte)
        # (zero pages mapped on first write: a version's load does not fault in its whole arena)
        self.records = np.zeros(C, dtype=np.dtype((np.void, record_bytes)))
        self.lfu = policy == "tinylfu"
        # tinylfu: the key's frequency; lru: the clock of the last insert/hit
        self.state = np.zeros(C, dtype=np.uint8 if self.lfu else np.int64)
        self.set_epoch = np.zeros(sets, dtype=np.int64)
        # flat: blocks of BLOCK counters
        self.sketch = np.zeros(sketch if self.lfu else 0, dtype=np.uint8)
        self._blocks = np.uint64(max(len(self.sketch) // BLOCK, 1))
        self._lanes = (np.arange(SKETCH_DEPTH, dtype=np.int64) * (BLOCK // SKETCH_DEPTH))[:, None]
        self._shifts = (np.arange(SKETCH_DEPTH, dtype=np.uint64) * np.uint64(4))[:, None]
        self._age_period = AGE_FACTOR * C
        self._age_debt = 0.0  # counters owed a halving (fractions of a pass)
        self._age_pos = 0  # next counter of the flattened [sketch, state] to halve
        self.epoch = 0
        self.tick = 0
        self.entries = 0
        self._way = np.arange(ways, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.records, self.state, self.set_epoch, self.sketch))

    def _find(self, k: np.ndarray):
        """(set [K], hit bool [K], slot of the hit [K] (garbage where miss), hash [K])."""
        h = splitmix64(k)
        s = (h % np.uint64(self.sets)).astype(np.int64)
        # each key's set as one row of a [sets, ways] view: a row gather, no [K, W] slot index to build
        way = (np.take(self.keys.reshape(self.sets, self.ways), s, axis=0) == k[:, None]).argmax(axis=1)
        slot = s * self.ways + way
        return s, self.keys[slot] == k, slot, h

    # -- the frequency sketch ---------------------------------------------------------------------------
    def _cells(self, h: np.ndarray) -> np.ndarray:
        """Sketch counters of each key [depth, K], flat: the ``depth`` counters of a key lie in one 64-byte
        block (one cache miss per key, as in Caffeine's sketch), the block from the hash's high bits, the
        offsets in it from its low ones (the set index, ``h mod sets``, mixes all bits)."""
        block = ((h >> np.uint64(32)) % self._blocks).astype(np.int64) * BLOCK
        off = ((h[None, :] >> self._shifts) & np.uint64(BLOCK // SKETCH_DEPTH - 1)).astype(np.int64)
        return block[None, :] + self._lanes + off

    def _estimate(self, cells: np.ndarray) -> np.ndarray:
        return self.sketch[cells].min(axis=0)

    def _count(self, h: np.ndarray) -> None:
        """One more sighting of each key (conservative update: only counters at the minimum grow)."""
        cells = self._cells(h)
        cur = self.sketch[cells]
        est = cur.min(axis=0)
        self.sketch[cells] = np.maximum(cur, est + (est < _SAT))
        self._age(len(h))

    def _age(self, n: int) -> None:
        """Halve ``n / (AGE_FACTOR * C)`` of all counters, the next ones in a round robin over the sketch
        then the slot states: one whole pass per period, a few hundred counters a call."""
        total = self.sketch.size + self.state.size
        self._age_debt += n * total / self._age_period
        todo = int(self._age_debt)
        if todo == 0:
            return
        self._age_debt -= todo
        flat_sketch = self.sketch
        while todo > 0:
            p = self._age_pos
            step = min(todo, total - p)
            a, b = p, p + step
            if a < flat_sketch.size:
                flat_sketch[a : min(b, flat_sketch.size)] >>= 1
            if b > flat_sketch.size:
                self.state[max(a - flat_sketch.size, 0) : b - flat_sketch.size] >>= 1
            self._age_pos = b % total
            todo -= step

    # -- operations -------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of ``(keys, state)``: two memcpys under the cache's lock; :func:`scores` and
        :func:`hot_keys` work on them outside it."""
        return self.keys.copy(), self.state.copy()

    def lookup(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(hit bool [K], records uint8 [H, rb] of the hits)``; counts the sighting of every key."""
        if len(k) == 0:
            return np.zeros(0, bool), np.zeros((0, self.record_bytes), np.uint8)
        _, hit, slot, h = self._find(k)
        hs = slot[hit]
        self.tick += 1
        if self.lfu:
            self._count(h)
            st = self.state[hs]
            self.state[hs] = st + (st < _SAT)
        else:
            self.state[hs] = self.tick
        return hit, self.records[hs].view(np.uint8).reshape(len(hs), self.record_bytes)

    def insert(self, k: np.ndarray, records: np.ndarray, epoch: int) -> int:
        """Put rows unless their set was invalidated after ``epoch`` (or the policy does not admit
        them); returns rows stored."""
        if len(k) == 0:
            return 0
        k, first = np.unique(k, return_index=True)
        s, hit, slot, hash_ = self._find(k)
        ok = self.set_epoch[s] <= epoch
        self.tick += 1
        # keys already cached: overwrite in place (a newer read of the same row)
        h = ok & hit
        hs = slot[h]
        records = np.ascontiguousarray(records).view(self.records.dtype).reshape(-1)
        self.records[hs] = records[first[h]]
        if not self.lfu:
            self.state[hs] = self.tick
        new = np.flatnonzero(ok & ~hit)
        if len(new) == 0:
            return len(hs)
        ns = s[new]
        if self.lfu:  # the most frequent candidates of a set take its least frequent slots
            cand = self._estimate(self._cells(hash_[new])).astype(np.int64)
            order = np.lexsort((-cand, ns))
        else:
            cand = np.zeros(len(new), np.int64)
            order = np.argsort(ns, kind="stable")
        new, ns, cand = new[order], ns[order], cand[order]
        useti, start, count = np.unique(ns, return_index=True, return_counts=True)
        g = np.repeat(np.arange(len(useti)), count)
        rank = np.arange(len(new)) - start[g]
        # victims of each touched set: empty slots first, then the least frequent (or oldest); the
        # slots just overwritten above are never victims
        keep = rank < self.ways
        new, g, rank, cand = new[keep], g[keep], rank[keep], cand[keep]
        set_slots = useti[:, None] * self.ways + self._way
        score = self.state[set_slots].astype(np.int64)
        score[self.keys[set_slots] == EMPTY] = -1
        big = np.iinfo(np.int64).max
        if len(hs):
            score[np.isin(set_slots, hs)] = big
        way = np.argsort(score, axis=1, kind="stable")[g, rank]  # the rank-th victim of the set
        vs = score[g, way]
        admit = (vs < 0) | ((cand > vs) & (vs != big)) if self.lfu else vs != big
        new, cand = new[admit], cand[admit]
        dst = useti[g[admit]] * self.ways + way[admit]
        self.entries += int(np.count_nonzero(self.keys[dst] == EMPTY))
        self.keys[dst] = k[new]
        self.records[dst] = records[first[new]]
        self.state[dst] = np.minimum(cand, _SAT) if self.lfu else self.tick
        return len(hs) + len(dst)

    def invalidate(self, k: np.ndarray) -> int:
        """Drop the keys if cached and mark their sets invalidated now; returns rows dropped."""
        self.epoch += 1
        if len(k) == 0:
            return 0
        s, hit, slot, _ = self._find(k)
        self.set_epoch[s] = self.epoch
        hs = np.unique(slot[hit])
        self.keys[hs] = EMPTY
        self.state[hs] = 0
        self.entries -= len(hs)
        return len(hs)

    def with_ways(self, ways: int) -> CacheArrays:
        """A copy with ``ways`` slots a set. The sets stay (so every key stays in its set), and so do the
        sketch, the epochs and the clocks; with fewer ways, each set keeps its highest-scored slots
        (the most frequent, or most recent)."""
        new = CacheArrays(self.sets, ways, self.record_bytes, self.policy, max(len(self.sketch), BLOCK))
        new.sketch[:] = self.sketch
        new.set_epoch[:] = self.set_epoch
        new.epoch, new.tick = self.epoch, self.tick
        keep = min(ways, self.ways)
        score = scores(self.keys, self.state).reshape(self.sets, self.ways)
        first = np.arange(self.sets, dtype=np.int64)[:, None]
        src = (first * self.ways + np.argsort(-score, axis=1, kind="stable")[:, :keep]).reshape(-1)
        dst = (first * ways + np.arange(keep, dtype=np.int64)).reshape(-1)
        new.keys[dst] = self.keys[src]
        new.records[dst] = self.records[src]
        new.state[dst] = self.state[src]
        new.entries = int(np.count_nonzero(new.keys != EMPTY))
        return new

    def clear(self) -> None:
        """Drop every row (the frequencies seen stay: they describe the traffic, not the rows)."""
        self.epoch += 1
        self.keys[:] = EMPTY
        self.state[:] = 0
        self.set_epoch[:] = self.epoch
        self.entries = 0


def scores(keys: np.ndarray, state: np.ndarray) -> np.ndarray:
    """A :meth:`CacheArrays.snapshot`'s slot scores for :func:`hot_keys`: the frequency (or clock), -1
    where the slot is empty."""
    score = state.astype(np.int64)
    score[keys == EMPTY] = -1
    return score


def hot_keys(keys: np.ndarray, score: np.ndarray, limit: int) -> np.ndarray:
    """Up to ``limit`` of a :meth:`CacheArrays.snapshot`'s keys, the highest score (most frequent, or
    most recent) first.

    It runs while another version serves, on a CPU the requests need: one partition of the scores
    finds the ``limit``-th highest, one comparison keeps the slots at or above it, and only
    those are sorted (a third of the work of partitioning the used slots' scores)."""
    n = len(score)
    if 0 < limit < n:
        threshold = max(int(np.partition(score, n - limit)[n - limit]), 0)  # empty slots are -1
    else:
        threshold = 0
    used = np.flatnonzero(score >= threshold)  # limit of them, or more where scores tie at the threshold
    return keys[used[np.argsort(-score[used], kind="stable")[:limit]]]

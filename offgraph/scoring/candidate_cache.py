"""The candidate cache: what a version computes of one candidate, keyed by the candidate's JSON as sent.

A ranking request carries hundreds to thousands of candidates, and the same items come back request
after request, serialized the same way by the same client. Decoding each into a dict, merging its
feature-table row into it and building its item-cache key from its values costs Python work per
candidate on every request (``bench/results/serve-latency-candidate-cache/``). A candidate's bytes
decide all of it, so the server keeps, per candidate bytes, what ``FeatureGenerator.candidate_entries``
made of the joined candidate (its item-cache entry, the keys the spec does not read, its item-scope
numeric values), whether the join found its key unknown, whether it sent only the item key, and the stored
records the join merged into it (references: what the served log writes of it, ``RECORDS``). A
request whose candidates this cache holds decodes none of them: one dict lookup per candidate.

Exact: the bytes are the candidate, and what they give changes only with the feature tables and the keys
appended to vocabularies. A version's join (``FeatureJoin.generation``) moves its generation after every catch-up
that changed a table, the scorer after every append it read (``Scorer._read_appended``); a lookup under another generation than the cache's empties the cache first, and an entry is
stored only if the generation is still the one its request began with (what it joined may be older
than the change). Nothing of a request that fails anywhere (a value FG refuses, a stored row that cannot be
used, an undecodable or invalid candidate) is stored: the scorer's one path refuses it, or screens it
(``Scorer.score_joined``).

Bounded: an entry is counted as its key's length, its entry's bytes (the stored records it keeps included), the
values a cross reads (their objects' sizes) and ``ENTRY_OVERHEAD`` (the tuple, the dict's slot, the FG entry's other objects, which it
keeps alive after the item cache dropped them;
``tests/scoring/test_candidate_cache.py`` checks the count against tracemalloc); past ``max_bytes`` the
oldest go first (FIFO: a hit moves nothing).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

ENTRY_OVERHEAD = 512
"""Bytes counted per entry beyond its key's and its ids' lengths and the values a cross reads."""

MIN_HIT_RATIO = 0.5
"""Below this share of candidates held (decayed over the requests that looked), once the cache is full,
requests skip it (their candidates are decoded in one call, not looked up nor held): looking candidates up,
decoding the others, then holding them costs more than that when few come back (``bench/results/serve-latency-candidate-cache/``). While it has room,
every request looks (a server warming up fills it at once)."""
FULL = 0.9
"""Share of ``max_bytes`` counted from which the cache is full (for ``MIN_HIT_RATIO``)."""
PROBE_EVERY = 16
"""While requests skip the cache, one in this many still looks (and holds), so a return of repeated candidates is seen."""

LACKING, ONLY_KEY, RECORDS = 5, 6, 7
"""Positions in an entry: after ``candidate_entries``' five parts (the FG entry's three, ignored keys,
item-scope numeric bytes), the join's unknown flag, whether it holds the item key alone, then (with item tables) the
stored record the join merged into the candidate, one per item table (``Joined.records``; None: none): the served
log's source for a held candidate's joined features (``JoinedCandidates``), as they were when it was joined."""


def entry_bytes(key: bytes, entry: tuple, crossed: Sequence[int]) -> int:
    """What ``entry`` (of ``key``) is counted at; ``crossed``: the positions of its values a cross reads."""
    n = len(key) + len(entry[1]) + len(entry[2]) + len(entry[4]) + ENTRY_OVERHEAD
    for r in entry[RECORDS:]:  # the record cache's own bytes, kept alive here once it dropped them: counted
        if r is not None:
            n += len(r)
    values = entry[0]
    for j in crossed:  # the values a cross reads: a tuple of str per position
        n += sys.getsizeof(values[j]) + sum(map(sys.getsizeof, values[j]))
    return n


class CandidateCache:
    """Candidate bytes -> entry (``FeatureGenerator.candidate_entries``' tuple, then ``LACKING``, ``ONLY_KEY``),
    at most ``max_bytes`` counted, emptied when ``generation()`` moves. ``crossed``: the item fields whose
    values the entries keep (``FeatureGenerator.crossed_item_fields``)."""

    def __init__(self, max_bytes: int, generation: Callable[[], int], crossed: Sequence[int] = ()):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._generation = generation
        self._crossed = tuple(crossed)
        self._gen = generation()
        self._d: OrderedDict[bytes, tuple] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._ratio = 1.0  # decayed share of candidates held, over the lookups
        self._asked = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._d)

    def lookup(self, keys: Sequence[bytes]) -> tuple[int, list[tuple | None]]:
        """(the generation this lookup ran under, for :meth:`put`; the entry of each key or None)."""
        gen = self._generation()
        if gen != self._gen:
            self.clear(gen)
        got = list(map(self._d.get, keys))
        missed = got.count(None)
        # approximate under threads: gauges, and a heuristic (worth_it), never a correctness decision
        self.hits += len(got) - missed
        self.misses += missed
        if got:
            self._ratio = 0.5 * self._ratio + 0.5 * (1 - missed / len(got))
        return gen, got

    def worth_it(self) -> bool:
        """Whether a request should look its candidates up (``MIN_HIT_RATIO``, ``PROBE_EVERY``)."""
        if self.max_bytes <= 0:
            return False
        self._asked += 1
        return self._ratio >= MIN_HIT_RATIO or self._bytes < FULL * self.max_bytes or self._asked % PROBE_EVERY == 0

    def put(self, gen: int, keys: Sequence[bytes], entries: Sequence[tuple]) -> None:
        """Hold ``entries`` (of ``keys``), computed by a request that looked up under ``gen``; nothing if
        the tables changed since (the entries may be of their older state) or the cache holds nothing."""
        if self.max_bytes <= 0:
            return
        with self._lock:
            if gen != self._gen or self._generation() != gen:
                return
            d = self._d
            added = 0
            crossed = self._crossed
            for k, e in zip(keys, entries):
                if k not in d:
                    d[k] = e
                    added += entry_bytes(k, e, crossed)
            self._bytes += added
            self._evict()

    def clear(self, gen: int | None = None) -> None:
        with self._lock:
            self._d = OrderedDict()
            self._bytes = 0
            if gen is not None:
                self._gen = gen

    def resize(self, max_bytes: int) -> None:
        """A new bound; the oldest entries go now if it is lower."""
        with self._lock:
            self.max_bytes = int(max_bytes)
            self._evict()

    def release(self, pace: Callable[[], None], chunk: int = 4096) -> int:
        """Empty the cache ``chunk`` entries at a time, ``pace()`` between chunks (a retired version: one
        deallocation of everything would hold the GIL while the next version serves); returns the entries."""
        with self._lock:
            d, self._d, self._bytes = self._d, OrderedDict(), 0
        n = len(d)
        while d:
            for _ in range(min(chunk, len(d))):
                d.popitem()
            pace()
        return n

    def _evict(self) -> None:
        d = self._d
        while self._bytes > self.max_bytes and d:
            k, v = d.popitem(last=False)
            self._bytes -= entry_bytes(k, v, self._crossed)

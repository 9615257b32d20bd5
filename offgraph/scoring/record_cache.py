"""The feature join's record cache: an item table's stored records held in process, bounded in bytes.

Every request reads its candidates' records, even one that sends every column (the unknown count
needs to know which keys have a row), and a catalog's hot items are the same from one request to the
next: a multi_get of a thousand keys costs several times a dict lookup of each. So the join keeps
the records it read (the bytes as stored, or ``None`` for a key with no row) and reads only the keys it
does not hold.

Exact, never stale past the join's own bound: a table opened as a snapshot never changes; a followed
table is cleared by the follow thread whenever a catch-up brought anything (:meth:`FeatureJoin._follow`
compares RocksDB's sequence number and super-version number, which an ingested file moves too). A
lookup takes the cache's dict before it reads the table, so a clear that comes in between leaves what
it read in the dict the clear dropped.

Bounded: an entry is counted as its key's and value's bytes plus ``ENTRY_OVERHEAD`` (the two bytes
objects and the ordered dict's entry; ``tests/scoring/test_record_cache.py`` checks it against
tracemalloc); past ``max_bytes`` the oldest entries go first (FIFO: a hit moves nothing, so a lookup
never writes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

ENTRY_OVERHEAD = 200
"""Bytes counted per entry beyond its key's and value's lengths."""

MISS = object()
"""What :meth:`RecordCache.lookup` gives for a key it does not hold."""


def _entry_bytes(k: bytes, v: bytes | None) -> int:
    return len(k) + (0 if v is None else len(v)) + ENTRY_OVERHEAD


class RecordCache:
    """Record key -> stored record (``bytes``, or ``None``: no row), at most ``max_bytes`` counted."""

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._d: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # writers only: a lookup reads a dict that is swapped, never emptied
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._d)

    def read(self, keys: Sequence[bytes], fetch: Callable[[list[bytes]], list[bytes | None]]) -> list[bytes | None]:
        """The records of ``keys`` (no ``None`` among them): those held, and the rest from ``fetch`` (one call,
        with the keys not held, in order), which are then held."""
        d = self._d  # before fetch: a clear meanwhile swaps in a new dict, and what fetch read goes to this one
        get = d.get
        got = [get(k, MISS) for k in keys]
        todo = [i for i, v in enumerate(got) if v is MISS]
        self.hits += len(keys) - len(todo)  # approximate under threads: a gauge, never a decision
        if not todo:
            return got  # type: ignore[return-value]
        self.misses += len(todo)
        fetched = fetch([keys[i] for i in todo])
        for i, v in zip(todo, fetched):
            got[i] = v
        if self.max_bytes > 0:
            self._put(d, [keys[i] for i in todo], fetched)
        return got  # type: ignore[return-value]

    def _put(self, d: OrderedDict, keys: list[bytes], values: list[bytes | None]) -> None:
        with self._lock:
            if d is not self._d:  # cleared meanwhile: what was read may be older than the clear
                return
            added = 0
            for k, v in zip(keys, values):
                if k not in d:
                    d[k] = v
                    added += _entry_bytes(k, v)
            self._bytes += added
            self._evict()

    def clear(self) -> None:
        with self._lock:
            self._d = OrderedDict()
            self._bytes = 0

    def resize(self, max_bytes: int) -> None:
        """A new bound; the oldest entries go now if it is lower."""
        with self._lock:
            self.max_bytes = int(max_bytes)
            self._evict()

    def _evict(self) -> None:
        """The oldest entries out until the bytes counted are within ``max_bytes`` (the lock held)."""
        d = self._d
        while self._bytes > self.max_bytes and d:
            k, v = d.popitem(last=False)
            self._bytes -= _entry_bytes(k, v)

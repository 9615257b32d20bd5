"""The feature join's record cache: an item table's stored records held in process, decoded, bounded in bytes.

Every request reads its candidates' records, even one that sends every column (the unknown count
needs to know which keys have a row), and a catalog's hot items are the same from one request to the
next: a multi_get of a thousand keys, and decoding the records an ids-only request needs, cost several
times a dict lookup of each. So the join keeps what it read, as an ``Entry``: the record as stored
(``None``: the key has no row) with its row decoded once (:func:`decode_entries`), and reads only the
keys it does not hold. A held row is never handed out to be changed: the join merges it into a new dict.

Exact, never stale past the join's own bound: a table opened as a snapshot never changes; a followed
table is cleared by the follow thread whenever a catch-up brought anything (:meth:`FeatureJoin._follow`
compares RocksDB's sequence number and super-version number, which an ingested file moves too). A
lookup takes the cache's dict before it reads the table, so a clear that comes in between leaves what
it read in the dict the clear dropped.

Bounded: an entry is counted as its key's and record's bytes, its decoded row's objects
(``sys.getsizeof`` of the dict, its keys and values, and a list's items: shared strings counted again,
so an upper bound) and ``ENTRY_OVERHEAD`` (the key and record objects, the tuple, the ordered dict's entry;
``tests/scoring/test_record_cache.py`` checks the whole against tracemalloc); past ``max_bytes`` the oldest
entries go first (FIFO: a hit moves nothing, so a lookup never writes).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

ENTRY_OVERHEAD = 240
"""Bytes counted per entry beyond its key's and record's lengths and its row's objects."""

MISS = object()
"""What a lookup of the cache's dict gives for a key it does not hold."""

Entry = tuple[bytes | None, Any]
"""(the stored record or None for no row, its decoded row: a dict, or a str saying why it cannot be decoded)."""

NO_ROW: Entry = (None, None)


def decode_entries(records: Sequence[bytes | None], decode: Callable[[bytes], Any]) -> list[Entry]:
    """An ``Entry`` per record: ``decode`` (the table's row decoder) of each, or why it cannot be decoded."""
    out: list[Entry] = []
    for v in records:
        if v is None:
            out.append(NO_ROW)
            continue
        try:
            out.append((v, decode(v)))
        except msgspec.DecodeError as e:
            out.append((v, f"the stored record cannot be decoded ({e})"))
    return out


def _row_bytes(row: Any) -> int:
    if not isinstance(row, dict):
        return sys.getsizeof(row) if row is not None else 0
    size = sys.getsizeof
    n = size(row)
    for k, v in row.items():
        n += size(k) + size(v)
        if isinstance(v, list):
            n += sum(map(size, v))
    return n


def _entry_bytes(k: bytes, e: Entry) -> int:
    return len(k) + (0 if e[0] is None else len(e[0])) + _row_bytes(e[1]) + ENTRY_OVERHEAD


class RecordCache:
    """Record key -> ``Entry``, at most ``max_bytes`` counted."""

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._d: OrderedDict[bytes, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # writers only: a lookup reads a dict that is swapped, never emptied
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._d)

    def read(self, keys: Sequence[bytes], fetch: Callable[[list[bytes]], list[Entry]]) -> list[Entry]:
        """The entries of ``keys`` (no ``None`` among them): those held, and the rest from ``fetch`` (one call,
        with the keys not held, in order), which are then held."""
        d = self._d  # before fetch: a clear meanwhile swaps in a new dict, and what fetch read goes to this one
        get = d.get
        got = [get(k, MISS) for k in keys]
        todo = [i for i, e in enumerate(got) if e is MISS]
        self.hits += len(keys) - len(todo)  # approximate under threads: a gauge, never a decision
        if not todo:
            return got  # type: ignore[return-value]
        self.misses += len(todo)
        fetched = fetch([keys[i] for i in todo])
        for i, e in zip(todo, fetched):
            got[i] = e
        if self.max_bytes > 0:
            self._put(d, [keys[i] for i in todo], fetched)
        return got  # type: ignore[return-value]

    def _put(self, d: OrderedDict, keys: list[bytes], entries: list[Entry]) -> None:
        with self._lock:
            if d is not self._d:  # cleared meanwhile: what was read may be older than the clear
                return
            added = 0
            for k, e in zip(keys, entries):
                if k not in d:
                    d[k] = e
                    added += _entry_bytes(k, e)
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

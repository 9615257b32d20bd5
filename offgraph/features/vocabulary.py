"""Vocabulary lookups: the other way, beside hashing, to map a field's values to table rows.

A field that declares ``vocabulary: FILE`` maps each of its values (the canonical strings of
``offgraph.features.hashing``) to the row the vocabulary gives it: the key on line i of FILE (one
key a line, UTF-8) is row i, 1..V, and a value the vocabulary lacks goes to row 0, the field's one
unknown row. No two values share a row (no collisions); an id first seen after the vocabulary was
written waits on the unknown row for the next vocabulary. Row 0 for the unknown is what a Keras
``StringLookup`` with one OOV index (its default) gives, and what DeepCTR-style label encoders
leave free, so tables trained elsewhere import as they are.

The lookup is columnar: the keys' 64-bit xxHash, sorted once when the file is read, and a
``searchsorted`` of a batch's hashes; the candidate key found is then compared with the value (a
NumPy comparison of the two string arrays), so a value whose hash equals a key's is still unknown
unless it is that key. Two keys with one 64-bit hash (odds ~V^2 / 2^65) are refused with the file,
as are duplicate and empty keys.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from offgraph.features.hashing import hash_strings

UNKNOWN_ROW = 0
"""The row of every value a vocabulary does not hold."""

VOCABULARY_UNKNOWN = "vocabulary_unknown:"
"""Prefix of a scorer's per-field count of unknown-row values (``vocabulary_unknown:FIELD`` in its stats)."""

KEY_HASH = "xxh64"
"""The hash of the lookup's index (fixed: the rows come from the file, not from the spec's hash)."""

__all__ = [
    "AppendedKeys",
    "UNKNOWN_ROW",
    "VOCABULARY_UNKNOWN",
    "Vocabulary",
    "VocabularyError",
    "read_vocabulary",
    "vocabulary_from_keys",
    "write_vocabulary",
]


class VocabularyError(ValueError):
    """A vocabulary that cannot be used (unreadable, a duplicate or empty key); the message names the file."""


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """V keys; key ``keys[i]`` is row i + 1 (row 0: the unknown row). ``sha256``: of the file's bytes
    (what a version records and a spec's fingerprint compares)."""

    source: str
    sha256: str
    keys: np.ndarray  # object [V]: key of row i + 1
    _hashes: np.ndarray  # uint64 [V], sorted
    _sorted_keys: np.ndarray  # object [V]: the key of each sorted hash
    _sorted_rows: np.ndarray  # int64 [V]: its row

    @property
    def size(self) -> int:
        return len(self.keys)

    @property
    def rows(self) -> int:
        """Rows of the field's table: V keys and the unknown row."""
        return self.size + 1

    def rows_of(self, values: Iterable[str]) -> np.ndarray:
        """int64 rows of canonical value strings: the vocabulary's row, or ``UNKNOWN_ROW``."""
        strings = np.asarray(values if isinstance(values, list) else list(values), dtype=object)
        if not len(strings) or not self.size:
            return np.zeros(len(strings), np.int64)
        h = hash_strings(strings, KEY_HASH)
        pos = np.minimum(np.searchsorted(self._hashes, h), self.size - 1)
        hit = (self._hashes[pos] == h) & (self._sorted_keys[pos] == strings)
        return np.where(hit, self._sorted_rows[pos], UNKNOWN_ROW).astype(np.int64)


def vocabulary_from_keys(
    keys: list[str], source: str, sha256: str | None = None, rows: np.ndarray | None = None
) -> Vocabulary:
    """The vocabulary of ``keys`` (row i + 1 for ``keys[i]``, or ``rows[i]``: the keys appended to a served
    vocabulary, ``offgraph.store.vocabulary_appends``); VocabularyError naming ``source`` and the key for a
    duplicate or an empty key."""
    arr = np.asarray(keys, dtype=object)
    if len(arr):
        empty = np.flatnonzero(arr == "")
        if len(empty):
            raise VocabularyError(f"vocabulary {source}: key {int(empty[0]) + 1} is empty (an empty value is no value)")
    h = hash_strings(arr, KEY_HASH)
    order = np.argsort(h, kind="stable")
    hs, ks = h[order], arr[order]
    same = np.flatnonzero(hs[1:] == hs[:-1])
    if len(same):
        j = int(same[0])
        first, second = sorted((int(order[j]), int(order[j + 1])))
        if ks[j] == ks[j + 1]:
            r1, r2 = (first + 1, second + 1) if rows is None else (int(rows[first]), int(rows[second]))
            raise VocabularyError(
                f"vocabulary {source}: duplicate key {ks[j]!r} (rows {r1} and {r2}): each key must name one row"
            )
        raise VocabularyError(
            f"vocabulary {source}: keys {ks[j]!r} and {ks[j + 1]!r} share one 64-bit hash, which the lookup "
            "cannot tell apart; rename one"
        )
    if sha256 is None:
        sha256 = hashlib.sha256("".join(f"{k}\n" for k in keys).encode("utf-8")).hexdigest()  # as the file
    at = (order + 1) if rows is None else np.asarray(rows, np.int64)[order]
    return Vocabulary(source, sha256, arr, hs, ks, at.astype(np.int64))


class AppendedKeys:
    """The keys appended to one field's served vocabulary (``capacity: K``): key i has row ``first + i``
    (first = V + 1), at most ``capacity`` of them. Looked up only for the values the file's vocabulary
    lacks, in a second small index; an append inserts its keys' hashes into it (one ``searchsorted`` and a copy of
    the arrays, no re-hash of the keys held), and the file's index, which may hold millions of keys, is never
    touched."""

    def __init__(self, field: str, first: int, capacity: int) -> None:
        self.field, self.first, self.capacity = field, int(first), int(capacity)
        self.keys: list[str] = []
        self._index: Vocabulary | None = None

    @property
    def free(self) -> int:
        return self.capacity - len(self.keys)

    @property
    def next_row(self) -> int:
        return self.first + len(self.keys)

    def extend(self, keys: list[str]) -> None:
        """Append ``keys`` (rows ``next_row``, ...). VocabularyError: past the capacity, a duplicate."""
        if len(keys) > self.free:
            raise VocabularyError(
                f"field '{self.field}': {len(keys)} more keys, but only {self.free} of its capacity "
                f"{self.capacity} rows are free"
            )
        source = f"appended keys of field '{self.field}'"
        rows = np.arange(self.next_row, self.next_row + len(keys), dtype=np.int64)
        part = vocabulary_from_keys(list(keys), source, rows=rows)  # refuses an empty or repeated key among them
        old = self._index
        if old is not None and len(keys):
            at = np.searchsorted(old._hashes, part._hashes)
            hashes = np.insert(old._hashes, at, part._hashes)
            same = np.flatnonzero(hashes[1:] == hashes[:-1])
            if len(same):
                j = int(same[0])
                k = np.insert(old._sorted_keys, at, part._sorted_keys)
                raise VocabularyError(
                    f"{source}: key {k[j + 1]!r} is appended again (it has a row)"
                    if k[j] == k[j + 1]
                    else f"{source}: keys {k[j]!r} and {k[j + 1]!r} share one 64-bit hash; rename one"
                )
            part = Vocabulary(
                source,
                "",
                np.concatenate([old.keys, part.keys]),
                hashes,
                np.insert(old._sorted_keys, at, part._sorted_keys),
                np.insert(old._sorted_rows, at, part._sorted_rows),
            )
        self._index = part
        self.keys.extend(keys)

    def rows_of(self, keys: list[str]) -> np.ndarray:
        """int64 rows of ``keys`` among the appended ones (``UNKNOWN_ROW`` where not appended)."""
        return np.zeros(len(keys), np.int64) if self._index is None else self._index.rows_of(keys)

    def fill(self, strings: list[str], ids: np.ndarray) -> np.ndarray:
        """Positions of ``ids`` still on the unknown row after the appended keys among ``strings`` (the values of
        ``ids``, as ``Vocabulary.rows_of`` took them) were given their rows, in place."""
        lost = np.flatnonzero(ids == UNKNOWN_ROW)
        if len(lost) and self._index is not None:
            ids[lost] = self._index.rows_of([strings[i] for i in lost])
            lost = lost[ids[lost] == UNKNOWN_ROW]
        return lost


_CACHE: OrderedDict[tuple, Vocabulary] = OrderedDict()
_CACHE_SIZE = 16  # a spec is parsed again on every with_* call: its files are read once


def read_vocabulary(path: str | Path) -> Vocabulary:
    """The vocabulary in ``path`` (one key a line, UTF-8; a final newline is optional), read once per file
    state (path, size, mtime)."""
    p = Path(path)
    try:
        st = p.stat()
        key = (os.path.realpath(p), st.st_size, st.st_mtime_ns)
        got = _CACHE.get(key)
        if got is not None:
            return got
        data = p.read_bytes()
    except OSError as e:
        raise VocabularyError(f"vocabulary {p}: cannot read: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VocabularyError(f"vocabulary {p}: not UTF-8 text (byte {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [s[:-1] if s.endswith("\r") else s for s in lines]
    vocab = vocabulary_from_keys(lines, str(p), hashlib.sha256(data).hexdigest())
    _CACHE[key] = vocab
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return vocab


def write_vocabulary(path: str | Path, keys: Iterable[str]) -> None:
    """Write ``keys`` as a vocabulary file (one a line): the format :func:`read_vocabulary` reads."""
    Path(path).write_text("".join(f"{k}\n" for k in keys), encoding="utf-8")

"""Hashing of feature values to table rows: canonical strings and hash functions shared by training and serving.

Canonical string of a value (what gets hashed, as UTF-8 bytes):

- ``str``: the string itself, unchanged (no case folding, no stripping).
- ``bytes``: decoded as UTF-8.
- ``bool`` / ``numpy.bool_``: ``"true"`` or ``"false"``.
- ``int`` / numpy integers: the decimal string (``-12``, ``7``).
- ``float`` / numpy floats: an integral finite float is written as the integer
  it equals (``3.0 -> "3"``), so an id read as float from a CSV with nulls
  hashes like the same id read as int; any other finite float is Python's
  shortest round-trip ``repr`` (``0.1 -> "0.1"``); ``inf`` -> ``"inf"``,
  ``-inf`` -> ``"-inf"``. NaN is *no value* and never reaches the hash.

Hashes (``row = H(canonical) mod rows``); never Python's ``hash()``:

- ``crc32``: ``zlib.crc32`` of the UTF-8 bytes (unsigned 32-bit).
- ``xxh64``: xxHash64, seed 0 (the default).
- ``xxh3``: XXH3-64, seed 0.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable

import numpy as np
import xxhash

NO_VALUE = None
DEFAULT_HASH = "xxh64"

__all__ = ["DEFAULT_HASH", "HASHES", "canonical", "hash_strings", "rows_of", "check_hash_name", "row_of"]


def canonical(value) -> str | None:
    """Canonical string of one scalar value, or None when it is no value."""
    if value is None:
        return None
    if isinstance(value, str):
        return value if value != "" else None
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isnan(f):
            return None
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        if f.is_integer():
            return str(int(f))
        return repr(f)
    if isinstance(value, bytes):
        s = value.decode("utf-8")
        return s if s != "" else None
    raise TypeError(f"cannot canonicalize a value of type {type(value).__name__}: {value!r}")


def _crc32(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


HASHES: dict[str, Callable[[bytes], int]] = {
    "crc32": _crc32,
    "xxh64": xxhash.xxh64_intdigest,
    "xxh3": xxhash.xxh3_64_intdigest,
}


def hash_strings(strings: Iterable[str], hash_name: str) -> np.ndarray:
    """uint64 hashes of canonical strings."""
    fn = HASHES[hash_name]
    return np.fromiter((fn(s.encode("utf-8")) for s in strings), dtype=np.uint64)


def rows_of(strings: Iterable[str], hash_name: str, rows: int) -> np.ndarray:
    """Row numbers ``H(s) mod rows`` as int64."""
    h = hash_strings(strings, hash_name)
    return (h % np.uint64(rows)).astype(np.int64)


def check_hash_name(name: str) -> str:
    if name not in HASHES:
        raise ValueError(f"unknown hash {name!r}: expected one of {sorted(HASHES)}")
    return name


def row_of(value, hash_name: str, rows: int) -> int | None:
    """Row of one raw scalar value, or None when the value is no value."""
    s = canonical(value)
    if s is None:
        return None
    return int(rows_of([s], check_hash_name(hash_name), rows)[0])

"""Hashing of feature values to table rows (thin public module).

See ``_hashing`` for the canonical-string rules and the hash functions.
"""

from __future__ import annotations

from offgraph.features._hashing import HASHES, canonical, hash_strings, rows_of

DEFAULT_HASH = "xxh64"

__all__ = ["DEFAULT_HASH", "HASHES", "canonical", "hash_strings", "rows_of", "check_hash_name", "row_of"]


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

"""Keys of the store's own bookkeeping records (row sequence numbers, change log).

They live in the meta key space (``0xFF...``, see ``keys``) under a reserved
sub-prefix ``0xFF 0x00`` that user meta keys may not use (``put_meta`` / ``write(meta=)``
reject keys starting with byte 0x00), so they collide neither with rows nor with meta::

    seq of a row       0xFF 0x00 's' + 12-byte row key     -> i64 big-endian
    change record id   0xFF 0x00 'c' + u64 big-endian id   -> packed 12-byte row keys
    last change id     0xFF 0x00 'C'                       -> u64 big-endian

All of them are written in the same atomic WriteBatch as the rows they describe.
"""
from __future__ import annotations

import numpy as np

from .keys import KEY_BYTES, KEY_DTYPE, META_PREFIX

RESERVED_META = b"\x00"  # first byte of user meta keys reserved for these records
INTERNAL_PREFIX = META_PREFIX + RESERVED_META
SEQ_PREFIX = INTERNAL_PREFIX + b"s"
CHANGE_PREFIX = INTERNAL_PREFIX + b"c"
CHANGE_END = INTERNAL_PREFIX + b"d"  # exclusive upper bound of the change records
LAST_CHANGE_KEY = INTERNAL_PREFIX + b"C"

SEQ_BYTES = 8
_SEQ_KEY_DTYPE = np.dtype([("p", "V3"), ("k", f"V{KEY_BYTES}")])


def seq_key_list(keys: np.ndarray) -> list[bytes]:
    """Seq keys of a ``KEY_DTYPE`` array, as a list of 15-byte ``bytes`` (vectorized)."""
    a = np.empty(len(keys), dtype=_SEQ_KEY_DTYPE)
    a["p"] = np.frombuffer(SEQ_PREFIX, dtype="V3")[0]
    a["k"] = np.ascontiguousarray(keys).view(f"V{KEY_BYTES}")
    return a.view(np.dtype((np.void, _SEQ_KEY_DTYPE.itemsize))).tolist()


def seq_value_list(seqs: np.ndarray) -> list[bytes]:
    return np.ascontiguousarray(seqs, dtype=">i8").view("V8").tolist()


def decode_seqs(values: list[bytes | None]) -> np.ndarray:
    """Stored seq values (None where absent) -> int64, -1 where absent."""
    out = np.full(len(values), -1, dtype=np.int64)
    present = np.array(values, dtype=object) != None  # noqa: E711 (elementwise)
    buf = b"".join(v for v in values if v is not None)
    if len(buf) != SEQ_BYTES * int(present.sum()):
        raise ValueError("corrupt store: a row sequence number record is not 8 bytes")
    out[present] = np.frombuffer(buf, dtype=">i8")
    return out


def change_key(change_id: int) -> bytes:
    return CHANGE_PREFIX + int(change_id).to_bytes(8, "big")


def change_id_of(key: bytes) -> int:
    if len(key) != len(CHANGE_PREFIX) + 8 or not key.startswith(CHANGE_PREFIX):
        raise ValueError(f"corrupt store: unexpected key {key!r} in the change log")
    return int.from_bytes(key[len(CHANGE_PREFIX):], "big")


def encode_change_id(change_id: int) -> bytes:
    return int(change_id).to_bytes(8, "big")


def decode_change_id(value: bytes | None) -> int:
    if value is None:
        return 0
    if len(value) != 8:
        raise ValueError("corrupt store: the last change id record is not 8 bytes")
    return int.from_bytes(value, "big")


def decode_change_keys(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated change records -> ``(table_ids uint32, rows int64)``."""
    buf = b"".join(values)
    if len(buf) % KEY_BYTES:
        raise ValueError(f"corrupt store: a change record is not a multiple of {KEY_BYTES} bytes")
    a = np.frombuffer(buf, dtype=KEY_DTYPE)
    return a["table"].astype(np.uint32), a["row"].astype(np.int64)

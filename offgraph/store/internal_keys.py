"""Keys of the store's own bookkeeping records (row sequence numbers).

They live in the meta key space (``0xFF...``, see ``keys``) under a reserved
sub-prefix ``0xFF 0x00`` that user meta keys may not use (``put_meta`` / ``write(meta=)``
reject keys starting with byte 0x00), so they collide neither with rows nor with meta::

    seq of a row       0xFF 0x00 's' + 12-byte row key     -> i64 big-endian
    seq watermark      0xFF 0x00 'w'                        -> i64 big-endian (one per shard)
    shard created      0xFF 0x00 'r'                        -> b"1" (remote backends: the shard exists)
    write fence        0xFF 0x00 'f'                        -> the token of the shard's last batch (redis)

A seq is written in the same atomic WriteBatch as the row it describes, and so is the
shard's watermark: the highest seq the shard holds. A new seq above it cannot be stale,
so a writer whose producers number updates in increasing order (stream-train does)
never reads a stored seq back (see ``base.EmbeddingStore.write``). (Stores written
before the change log was removed may still hold records under 0xFF 0x00 'c' / 'C':
they are meta records nothing reads.)
"""

from __future__ import annotations

import numpy as np

from offgraph.store.keys import KEY_BYTES, META_PREFIX

RESERVED_META = b"\x00"  # first byte of user meta keys reserved for these records
INTERNAL_PREFIX = META_PREFIX + RESERVED_META
SEQ_PREFIX = INTERNAL_PREFIX + b"s"
SEQ_END = INTERNAL_PREFIX + b"t"  # upper bound of the seq records
SEQ_WATERMARK_KEY = INTERNAL_PREFIX + b"w"
SHARD_CREATED_KEY = INTERNAL_PREFIX + b"r"
WRITE_FENCE_KEY = INTERNAL_PREFIX + b"f"

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


def encode_seq(seq: int) -> bytes:
    return int(seq).to_bytes(SEQ_BYTES, "big", signed=True)


def decode_seq(value: bytes) -> int:
    if len(value) != SEQ_BYTES:
        raise ValueError("corrupt store: a sequence number record is not 8 bytes")
    return int.from_bytes(value, "big", signed=True)


def decode_seqs(values: list[bytes | None]) -> np.ndarray:
    """Stored seq values (None where absent) -> int64, -1 where absent."""
    out = np.full(len(values), -1, dtype=np.int64)
    present = np.array(values, dtype=object) != None  # noqa: E711 (elementwise)
    buf = b"".join(v for v in values if v is not None)
    if len(buf) != SEQ_BYTES * int(present.sum()):
        raise ValueError("corrupt store: a row sequence number record is not 8 bytes")
    out[present] = np.frombuffer(buf, dtype=">i8")
    return out

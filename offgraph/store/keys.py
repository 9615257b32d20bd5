"""Row keys and the shard function.

Key format ``u32be-table+u64be-row`` (12 bytes)::

    key = table_id as uint32 big-endian (4 bytes) + row as uint64 big-endian (8 bytes)

Big-endian makes the byte order of keys equal to the numeric order of
``(table_id, row)``, so one table's rows are contiguous and ascending in every shard.
Table ids are at most ``MAX_TABLE_ID`` (0xFFFE), so a row key starts with byte 0x00 and
never collides with the metadata key space (``META_PREFIX``, keys starting with 0xFF).

Combined key (``combine_keys`` / ``split_keys``, the ONE definition): a uint64 per
``(table, row)`` with the table id in the top ``TABLE_BITS`` (16) bits and the row in the
low ``ROW_BITS`` (48), for the NumPy code that hashes or sorts keys (the write feed, the
row cache, the request path, the stream trainer). The all-ones word marks an empty slot
in the feed and the row cache, so table 0xFFFF is not used; the store takes the same
table ids as the feed, and rows below ``ROW_LIMIT`` wherever a combined key is made.

The bias row: table ``BIAS_TABLE`` (= ``MAX_TABLE_ID``, one past any field's table: a model has at most
``BIAS_TABLE`` fields) row ``BIAS_ROW`` holds the model's streamed bias offset as its first-order weight (its
vector is zeros). The exporter does not write it (absent, it reads as zeros: offset 0); the stream trainer
moves the model's bias by writing it like any row (``offgraph.streaming``), so the updater applies it exactly
once, the feed and the row cache serve it fresh, and every request reads it with its rows
(``offgraph.scoring.scorer``) and adds it to the head's logit (``offgraph.calibration.calibrate``).

Shard function ``splitmix64-v1`` (recorded by name in store.json and model manifests;
it must never change silently: a new function gets a new name)::

    x     = ((table_id << 40) XOR row)            mod 2**64
    z     = (x + 0x9E3779B97F4A7C15)              mod 2**64
    z     = ((z XOR (z >> 30)) * 0xBF58476D1CE4E5B9) mod 2**64
    z     = ((z XOR (z >> 27)) * 0x94D049BB133111EB) mod 2**64
    z     =   z XOR (z >> 31)
    shard = z mod S

i.e. the first output of a SplitMix64 generator seeded with ``x`` (Steele, Lea,
Flood 2014; the finalizer is Stafford's Mix13), reduced mod S. Consecutive rows of one
table land on shards that look independent and uniform.
"""

from __future__ import annotations

import numpy as np

KEY_BYTES = 12
KEY_DTYPE = np.dtype([("table", ">u4"), ("row", ">u8")])
assert KEY_DTYPE.itemsize == KEY_BYTES

META_PREFIX = b"\xff"
TABLE_BITS, ROW_BITS = 16, 48  # of a combined key
MAX_TABLE_ID = (1 << TABLE_BITS) - 2  # table 0xFFFF with the last row would be the all-ones (empty) key
ROW_LIMIT = 1 << 48  # rows of a combined key are below this
BIAS_TABLE = MAX_TABLE_ID  # the streamed bias offset's table (module doc): no field's
BIAS_ROW = 0
MAX_ROW = 2**64 - 1
EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)  # an empty slot of the feed's and the row cache's tables: no combined key
_ROW_SHIFT = np.uint64(ROW_BITS)
_ROW_MASK = np.uint64(ROW_LIMIT - 1)
BIAS_KEY = np.uint64((BIAS_TABLE << ROW_BITS) | BIAS_ROW)  # the bias row's combined key: above every field's

SHARD_FN = "splitmix64-v1"

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def as_key_arrays(table_ids, rows, allow_nd: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``rows`` and broadcast ``table_ids`` (a scalar, or any array that
    broadcasts to ``rows.shape``, e.g. one table id per column) against it.

    Returns flat ``(table_ids uint32 [K], rows uint64 [K])``. ``rows`` must be 1-D
    unless ``allow_nd``. Raises ValueError for negative, non-integer, out-of-range or
    mismatched inputs.
    """
    r = np.asarray(rows)
    if r.ndim != 1 and not (allow_nd and r.ndim >= 1):
        raise ValueError(f"rows must be a 1-D array, got shape {r.shape}")
    t = np.asarray(table_ids)
    try:
        t = np.broadcast_to(t, r.shape)
    except ValueError:
        raise ValueError(
            f"table_ids (shape {t.shape}) must be a scalar or broadcast to the shape of rows {r.shape}"
        ) from None
    t, r = t.reshape(-1), r.reshape(-1)
    for name, a in (("table_ids", t), ("rows", r)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be integers, got dtype {a.dtype}")
        if a.size and np.issubdtype(a.dtype, np.signedinteger) and a.min() < 0:
            raise ValueError(f"{name} must be >= 0, got {int(a.min())}")
    if t.size and int(t.max()) > MAX_TABLE_ID:
        raise ValueError(
            f"table id {int(t.max())} > {MAX_TABLE_ID} (table ids have {TABLE_BITS} bits, the last value is reserved)"
        )
    return t.astype(np.uint32, copy=False), r.astype(np.uint64, copy=False)


def combine_keys(table_ids, rows) -> np.ndarray:
    """One uint64 per ``(table_ids[i], rows[i])``: the combined key (see module doc).
    ``table_ids`` broadcasts against 1-D ``rows`` as in :func:`as_key_arrays`; ValueError
    for a table id over ``MAX_TABLE_ID`` or a row at or over ``ROW_LIMIT``."""
    t, r = as_key_arrays(table_ids, rows)
    if r.size and int(r.max()) >= ROW_LIMIT:
        raise ValueError(
            f"row {int(r.max())} >= 2**{ROW_BITS}: combined keys (write feed, row cache, "
            f"request path) hold rows below 2**{ROW_BITS}"
        )
    return (t.astype(np.uint64) << _ROW_SHIFT) | r


def split_keys(keys) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`combine_keys`: ``(table_ids uint32, rows int64)``."""
    k = np.asarray(keys, dtype=np.uint64)
    return (k >> _ROW_SHIFT).astype(np.uint32), (k & _ROW_MASK).astype(np.int64)


def key_array(table_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Structured ``KEY_DTYPE`` array; its ``.tobytes()`` is the keys back to back."""
    a = np.empty(len(rows), dtype=KEY_DTYPE)
    a["table"] = table_ids
    a["row"] = rows
    return a


def key_list(keys: np.ndarray) -> list[bytes]:
    """Split a ``KEY_DTYPE`` array into a list of 12-byte ``bytes``.

    Viewing the records as ``V12`` and calling ``tolist()`` slices the packed buffer in C
    (no Python slicing loop); unlike ``S12`` it keeps trailing zero bytes.
    """
    return np.ascontiguousarray(keys).view(np.dtype((np.void, KEY_BYTES))).tolist()


def encode_keys(table_ids, rows) -> list[bytes]:
    """Keys of ``(table_ids[i], rows[i])`` as 12-byte big-endian ``bytes``."""
    t, r = as_key_arrays(table_ids, rows)
    return key_list(key_array(t, r))


def decode_keys(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_keys`: ``(table_ids uint32, rows uint64)``."""
    buf = b"".join(keys)
    if len(buf) != KEY_BYTES * len(keys):
        raise ValueError(f"every key must be {KEY_BYTES} bytes")
    a = np.frombuffer(buf, dtype=KEY_DTYPE)
    return a["table"].astype(np.uint32), a["row"].astype(np.uint64)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """First SplitMix64 output for each seed in ``x`` (uint64 arithmetic mod 2**64)."""
    z = np.asarray(x, dtype=np.uint64) + _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def shard_of(table_ids, rows, shards: int) -> np.ndarray:
    """Shard (int64 in ``[0, shards)``) of each key, by ``splitmix64-v1`` (see module doc)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    t = np.asarray(table_ids, dtype=np.uint64)
    r = np.asarray(rows, dtype=np.uint64)
    x = (t << np.uint64(40)) ^ r
    return (splitmix64(x) % np.uint64(shards)).astype(np.int64)


def check_shard(shard, shards: int) -> int:
    """``shard`` as an int in ``[0, shards)`` (ValueError otherwise)."""
    if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)):
        raise ValueError(f"shard must be an int, 'all' or 'touched', got {shard!r}")
    if not 0 <= int(shard) < shards:
        raise ValueError(f"shard must be in [0, {shards}), got {shard}")
    return int(shard)


def unique_inverse(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(k, return_inverse=True)`` of a 1-D array: the same two arrays, by a stable sort. A
    request's keys come field by field with the tables ascending, so they are sorted runs, which a stable
    (merging) sort takes in a few passes where ``np.unique``'s quicksort starts over."""
    if len(k) == 0:
        return k[:0].copy(), np.zeros(0, dtype=np.intp)
    order = np.argsort(k, kind="stable")
    sk = k[order]
    new = np.empty(len(sk), dtype=bool)
    new[0] = True
    np.not_equal(sk[1:], sk[:-1], out=new[1:])
    inverse = np.empty(len(sk), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return sk[new], inverse


def unique_keys(t: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """De-duplicate ``(t, r)`` pairs: ``(unique t, unique r, inverse)`` with
    ``t == ut[inverse]`` and ``r == ur[inverse]``; uniques sorted by (table, row)."""
    if len(r) == 0:
        return t[:0], r[:0], np.zeros(0, dtype=np.intp)
    if int(r.max()) < ROW_LIMIT:  # table ids always fit the combined key
        u, inv = unique_inverse(combine_keys(t, r))
        ut, ur = split_keys(u)
        return ut, ur.astype(np.uint64), inv
    u, inv = np.unique(key_array(t, r), return_inverse=True)
    return u["table"].astype(np.uint32), u["row"].astype(np.uint64), inv.reshape(-1)

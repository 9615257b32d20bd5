"""Array maths and file layout of the write feed (see ``offgraph.store.feed``).

One epoch file = a fixed-size open-addressing hash table (linear probing, no wrap)
that ONE writer process updates in place through a shared memory map while any
number of reader processes look rows up in it.

Layout (little-endian)::

    header   4096 bytes: uint64 [512], fields at the H_* indices below
    keys     uint64 [slots + PAD]      combined key (keys.combine_keys), EMPTY where free
    vers     uint64 [slots + PAD]      0: not yet readable; else the number of writes
    values   uint8  [slots + PAD, 2, rb]  two copies: write k goes to copy k % 2

A key's probe sequence starts at ``splitmix64(key) mod slots`` and runs forward into
``PAD`` extra slots whose last ``WINDOW`` always stay empty. At most half the
slots are used (the writer starts a bigger epoch first).

Readers never lock. A writer stores a row's new record into the copy that readers
are NOT told to read, then publishes it by storing ``vers[slot] + 1`` (one aligned
8-byte store). A reader loads the version, the copy it names, and the version
again; a changed version means the row was rewritten meanwhile and the reader
reads it again (a seqlock per row). The protocol has no memory barriers: it relies on
the CPU keeping stores, and loads, in program order, which x86-64 (TSO) does and
weakly ordered CPUs (aarch64, POWER, RISC-V) do not, where a reader could accept a
torn row; so the feed refuses to run on any other CPU (``feed.check_machine``). A
new key is claimed (its key stored) before its first version: readers see version 0
and take it as absent.

A write is two steps (``stage_rows``, then ``publish``): the writer stages a batch's
records into the unread copies BEFORE it writes the batch to RocksDB and publishes
their versions only AFTER that write: a writer killed in between leaves staged
records that no reader ever sees.
"""

from __future__ import annotations

import numpy as np

from offgraph.store.keys import EMPTY, splitmix64

MAGIC = 0x3130_4C56_4F46_474F  # b"OGFOVL01" little-endian
HEADER_WORDS = 512
H_MAGIC, H_RB, H_SLOTS, H_EPOCH, H_FIRST_BATCH, H_BEGUN, H_COUNT, H_COPY_OF = range(8)
WINDOW = 8  # = the bytes of a uint64: a window's 8 bools are tested as one word
PAD = 64
_WAYS = np.arange(WINDOW, dtype=np.int64)
TORN_RETRIES = 100  # re-reads of rows that keep changing before a lookup gives up (FeedTornRead)


class FeedTornRead(RuntimeError):
    """Rows kept being rewritten while a lookup read them (``TORN_RETRIES`` re-reads): the
    lookup cannot return a consistent copy now; retry later (the server answers 503)."""


def file_bytes(slots: int, rb: int) -> int:
    return HEADER_WORDS * 8 + (slots + PAD) * (16 + 2 * rb)


def views(buf, slots: int, rb: int):
    """``(header, keys, vers, values)`` NumPy views of a mapped epoch file."""
    n = slots + PAD
    off = HEADER_WORDS * 8
    header = np.frombuffer(buf, dtype=np.uint64, count=HEADER_WORDS)
    keys = np.frombuffer(buf, dtype=np.uint64, count=n, offset=off)
    vers = np.frombuffer(buf, dtype=np.uint64, count=n, offset=off + 8 * n)
    values = np.frombuffer(buf, dtype=np.uint8, count=n * 2 * rb, offset=off + 16 * n).reshape(n, 2, rb)
    return header, keys, vers, values


def find(keys: np.ndarray, slots: int, k: np.ndarray) -> np.ndarray:
    """Slot of each key (-1 where absent). Each round compares a window of ``WINDOW``
    slots per unresolved key (one gather): at most half full, nearly every probe
    sequence ends in the first window."""
    out = np.full(len(k), -1, dtype=np.int64)
    if len(k) == 0:
        return out
    start = (splitmix64(k) & np.uint64(slots - 1)).astype(np.int64)
    todo = None  # the first round covers every key without gathering by index
    while todo is None or len(todo):
        s, kt = (start, k) if todo is None else (start[todo], k[todo])
        win = np.add.outer(s, _WAYS)  # never past the end: the last WINDOW slots stay empty
        cur = keys[win]
        m = np.flatnonzero(cur == kt[:, None])  # keys are unique: one match per found key
        row = m >> 3
        more = (cur == EMPTY).view(np.uint64).ravel() == 0  # full window without the key
        more[row] = False
        if todo is None:
            out[row] = win.ravel()[m]
            todo = np.flatnonzero(more)
        else:
            out[todo[row]] = win.ravel()[m]
            todo = todo[more]
        start[todo] += WINDOW
    return out


def find_or_claim(keys: np.ndarray, slots: int, k: np.ndarray) -> tuple[np.ndarray, int]:
    """Slot of each key (unique), claiming the first empty slot of its probe sequence
    for a key not there yet. Several keys claiming one slot all scatter into it; the
    one whose store stuck wins, the others look on from the same place. Returns
    ``(slots int64 [K], keys claimed)``; a slot of -1: no room before the padding's
    end (the writer must start a bigger epoch)."""
    limit = slots + PAD - WINDOW
    out = np.full(len(k), -1, dtype=np.int64)
    claimed = 0
    start = (splitmix64(k) & np.uint64(slots - 1)).astype(np.int64)
    todo = np.arange(len(k))
    while len(todo):
        s, kt = start[todo], k[todo]
        win = np.add.outer(s, _WAYS)
        cur = keys[win]
        done = np.zeros(len(todo), dtype=bool)
        m = np.flatnonzero(cur == kt[:, None])
        out[todo[m >> 3]] = win.ravel()[m]
        done[m >> 3] = True
        empty = (cur == EMPTY).view(np.uint64).ravel()  # 8 bools as one little-endian word
        cand = np.flatnonzero((empty != 0) & ~done)
        if len(cand):
            w = empty[cand]
            lowest = (w & (~w + np.uint64(1))).astype(np.float64)  # 2**(8 j): slot j is the first empty
            pos = s[cand] + (np.log2(lowest).astype(np.int64) >> 3)
            room = pos < limit
            if not room.all():
                done[cand[~room]] = True  # out of room: left at -1
                cand, pos = cand[room], pos[room]
            ck = kt[cand]
            keys[pos] = ck
            won = keys[pos] == ck
            out[todo[cand[won]]] = pos[won]
            claimed += int(np.count_nonzero(won))
            done[cand[won]] = True
        full = np.flatnonzero(empty == 0)
        start[todo[full]] += WINDOW
        todo = todo[~done]
    return out, claimed


def stage_rows(vers: np.ndarray, values: np.ndarray, slot: np.ndarray, records: np.ndarray) -> np.ndarray:
    """Store each row in the copy readers do not read; returns the versions that
    :func:`publish` makes readers see (nothing changes for readers until then)."""
    nv = vers[slot] + np.uint64(1)
    values[slot, (nv & np.uint64(1)).astype(np.int64)] = records
    return nv


def publish(vers: np.ndarray, slot: np.ndarray, nv: np.ndarray) -> None:
    """Make staged rows visible: one aligned 8-byte store per row."""
    vers[slot] = nv


def write_rows(vers: np.ndarray, values: np.ndarray, slot: np.ndarray, records: np.ndarray) -> None:
    """Stage and publish at once (an epoch being built, which no reader maps yet)."""
    publish(vers, slot, stage_rows(vers, values, slot, records))


def read_rows(
    keys: np.ndarray, vers: np.ndarray, values: np.ndarray, slots: int, k: np.ndarray, retries: int = TORN_RETRIES
):
    """``(positions int64 [H] of the keys found, records uint8 [H, rb])``; rows being
    rewritten while read are read again, up to ``retries`` times (then ``FeedTornRead``)."""
    slot = find(keys, slots, k)
    pos = np.flatnonzero(slot >= 0)
    slot = slot[pos]
    v1 = vers[slot]
    ok = v1 > 0
    pos, slot, v1 = pos[ok], slot[ok], v1[ok]
    recs = values[slot, (v1 & np.uint64(1)).astype(np.int64)]
    for _ in range(retries):
        torn = np.flatnonzero(vers[slot] != v1)
        if len(torn) == 0:
            return pos, recs
        v1[torn] = vers[slot[torn]]
        recs[torn] = values[slot[torn], (v1[torn] & np.uint64(1)).astype(np.int64)]
    torn = np.flatnonzero(vers[slot] != v1)
    if len(torn) == 0:
        return pos, recs
    raise FeedTornRead(f"{len(torn)} feed rows kept changing while being read ({retries} re-reads)")

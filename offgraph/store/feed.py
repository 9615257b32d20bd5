"""The store's write feed: the rows a writer applies, in shared memory, for followers.

A RocksDB secondary only sees new writes through ``try_catch_up_with_primary``, which
holds the follower's GIL while it opens new SST files, at every catch-up
(``bench/results/update-freshness/README.md``): a server catching up several times a second pays
that in its request latency, and copying every fresh row into the server process
costs it CPU in proportion to the write rate. So the writer also puts each row it
writes into a hash table in a memory-mapped file (an *epoch*), and followers map
that file and look rows up in it before their row cache and their RocksDB view:
zero work per written row on the serving side, fresh the moment the writer has
written. Followers catch their RocksDB view up only every few tens of seconds, then
let go of the epochs it covers (``offgraph.store.follower``).

Files: ``<feed dir>/<epoch:016d>.feed``, epochs numbered consecutively, in memory-backed
files, never on the store's disk (where the feed directory is, and how a store points to
it: ``feed_dirs``). Layout and the lock-free read protocol: ``_feed``; it needs an
x86-64 CPU (``check_machine``).

Batches are numbered across epochs; an epoch's header records its first batch and the
last batch BEGUN. Order of writes: the writer records "batch b begun", stages the
batch's rows in the epoch (invisible), writes them to the store, and only then
publishes them (shard by shard, each after its RocksDB batch; with
``durability="flush"`` after its flush, before the next shard is written): a row is
never served before it is durable, and a writer killed before the store write leaves
staged rows that are never served.
So when a follower reads "begun = b" before catching up, every batch before b is in
its store view, and an epoch whose batches all come before b can go. A writer starts a
new epoch when it opens the store, after ``epoch_seconds``, and when the table would
be over half full. It deletes epochs superseded more than ``keep_seconds`` ago (a
follower that mapped one keeps its mapping). Rows must be < 2**48.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import platform
import time
from pathlib import Path

import numpy as np

from offgraph.store import _feed as fi

# re-exported: the torn read the server answers with a 503, an epoch file's size (a scorer's memory report)
from offgraph.store._feed import FeedTornRead, file_bytes  # noqa: F401

# re-exported (tests, the server): where epochs live, and the errors of the feed
from offgraph.store.feed_dirs import POINTER, SHM_ENV, FeedUnsupported, feed_dir, open_feed_dir, shm_root  # noqa: F401
from offgraph.store.keys import KEY_DTYPE, combine_keys

log = logging.getLogger("offgraph.feed")

SUFFIX = ".feed"
MIN_SLOTS = 1 << 16
# CPUs that keep loads and stores in program order (TSO), as the lock-free reads need
X86_64 = frozenset({"x86_64", "amd64", "x64"})


def check_machine(machine: str | None = None) -> None:
    """Refuse a CPU other than x86-64 (``machine``: ``platform.machine()`` by default)."""
    m = platform.machine() if machine is None else machine
    if m.lower() not in X86_64:
        raise FeedUnsupported(
            errno.ENOTSUP,
            f"the write feed needs an x86-64 CPU, this machine is {m!r}: its "
            "lock-free shared-memory reads rely on x86-64 keeping loads and stores in order, "
            "and could return torn rows here. Run the streaming updater and the servers that "
            "follow it on x86-64 hosts (a store read without following, e.g. a Scorer with "
            "store_mode='r', does not use the feed)",
        )


def epoch_name(epoch: int) -> str:
    return f"{epoch:016d}{SUFFIX}"


def epoch_ids(feed_dir: str | Path) -> list[int]:
    """Epoch ids in ``feed_dir``, ascending ([] if it does not exist)."""
    out = []
    try:
        with os.scandir(feed_dir) as it:
            for e in it:
                stem = e.name[: -len(SUFFIX)]
                if e.name.endswith(SUFFIX) and stem.isdigit():
                    out.append(int(stem))
    except FileNotFoundError:
        return []
    return sorted(out)


def combined_from_store_keys(keys: bytes) -> np.ndarray:
    """Combined keys (``keys.combine_keys``) of concatenated 12-byte row keys."""
    a = np.frombuffer(keys, dtype=KEY_DTYPE)
    return combine_keys(a["table"].astype(np.uint32), a["row"].astype(np.uint64))


def allocate(f, path: Path, size: int) -> None:
    """Give open file ``f`` ``size`` bytes of disk before it is mapped: a store into a
    mapped page the file system cannot back (disk full, a sparse file) is a SIGBUS that
    kills the process; a failed allocation here is an OSError naming the file, and the
    file is removed."""
    try:
        os.posix_fallocate(f.fileno(), 0, size)
    except OSError as e:
        f.close()
        path.unlink(missing_ok=True)
        raise OSError(
            e.errno,
            f"write feed: cannot allocate {size} bytes for {path} ({os.strerror(e.errno)}); "
            f"free space in {path.parent.parent} (memory-backed), then restart (the batch "
            "that needed it was not written)",
        ) from None


class Epoch:
    """One mapped epoch file (writable for the writer, read-only for followers)."""

    def __init__(self, path: Path, writable: bool) -> None:
        self.path = path
        with open(path, "r+b" if writable else "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        head = np.frombuffer(self._mm, dtype=np.uint64, count=fi.HEADER_WORDS)
        if int(head[fi.H_MAGIC]) != fi.MAGIC:
            self.close()
            raise ValueError(f"{path}: not a feed epoch file")
        self.rb, self.slots = int(head[fi.H_RB]), int(head[fi.H_SLOTS])
        if len(self._mm) != fi.file_bytes(self.slots, self.rb):
            self.close()
            raise ValueError(f"{path}: {len(self._mm)} bytes, expected {fi.file_bytes(self.slots, self.rb)}")
        self.header, self.keys, self.vers, self.values = fi.views(self._mm, self.slots, self.rb)
        self.epoch = int(self.header[fi.H_EPOCH])
        self.first_batch = int(self.header[fi.H_FIRST_BATCH])
        self.copy_of = int(self.header[fi.H_COPY_OF])  # 0: none

    @classmethod
    def create(
        cls, path: Path, epoch: int, slots: int, rb: int, first_batch: int, copy_of: Epoch | None = None
    ) -> Epoch:
        """A new epoch file, published whole by a rename. ``copy_of``: start with all of
        that epoch's rows (the epoch outgrew its table): followers then let go of it at
        once, without waiting for their store to cover it."""
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w+b") as f:  # read and write: a shared writable mapping needs both
            allocate(f, tmp, fi.file_bytes(slots, rb))
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE)
        h, k, v, vals = fi.views(mm, slots, rb)
        k[:] = fi.EMPTY
        h[fi.H_RB], h[fi.H_SLOTS], h[fi.H_EPOCH] = rb, slots, epoch
        h[fi.H_FIRST_BATCH], h[fi.H_BEGUN] = first_batch, first_batch - 1
        if copy_of is not None:
            used = np.flatnonzero((copy_of.keys != fi.EMPTY) & (copy_of.vers > 0))
            ok, ov = copy_of.keys[used], copy_of.vers[used]
            recs = copy_of.values[used, (ov & np.uint64(1)).astype(np.int64)]
            slot, claimed = fi.find_or_claim(k, slots, ok)
            if (slot < 0).any():
                raise RuntimeError(f"feed: {len(ok)} rows do not fit a table of {slots} slots")
            fi.write_rows(v, vals, slot, recs)
            h[fi.H_COUNT] = claimed
            h[fi.H_FIRST_BATCH] = copy_of.first_batch
            h[fi.H_COPY_OF] = copy_of.epoch
        h[fi.H_MAGIC] = fi.MAGIC
        del h, k, v, vals
        mm.close()
        os.replace(tmp, path)  # whole or absent
        return cls(path, writable=True)

    @property
    def begun(self) -> int:
        return int(self.header[fi.H_BEGUN])

    @property
    def count(self) -> int:
        return int(self.header[fi.H_COUNT])

    def used_keys(self) -> np.ndarray:
        return self.keys[self.keys != fi.EMPTY].copy()

    def close(self) -> None:
        """Writer: unmap now. (Followers just drop an epoch: a request thread may still
        be reading its arrays, and the mapping lives as long as they do.)"""
        self.header = self.keys = self.vers = self.values = None
        self._mm.close()


class Staged:
    """A batch's rows, in the feed but not yet visible: :meth:`publish` shows rows
    ``lo:hi`` of the batch (call it once they are durable in the store)."""

    def __init__(self, epoch: Epoch, slot: np.ndarray, versions: np.ndarray, batch: int) -> None:
        self._epoch, self._slot, self._versions, self.batch = epoch, slot, versions, batch

    def publish(self, lo: int = 0, hi: int | None = None) -> None:
        if self._epoch.vers is None:  # the writer closed meanwhile
            return
        fi.publish(self._epoch.vers, self._slot[lo:hi], self._versions[lo:hi])


class FeedWriter:
    """The writer's side; one per store opened for writing (the store's write lock
    serializes :meth:`stage` and the publishing of what it staged). Opening starts a
    new epoch."""

    def __init__(
        self,
        store_path: str | Path,
        record_bytes: int,
        *,
        epoch_seconds: float = 30.0,
        keep_seconds: float = 120.0,
        min_slots: int = MIN_SLOTS,
    ) -> None:
        check_machine()
        self.dir = open_feed_dir(store_path)
        self.rb = int(record_bytes)
        self.epoch_seconds, self.keep_seconds, self.min_slots = float(epoch_seconds), float(keep_seconds), min_slots
        ids = epoch_ids(self.dir)
        last, batch = 0, 0
        if ids:
            last = ids[-1]
            try:
                prev = Epoch(self.dir / epoch_name(last), writable=False)
                batch = prev.begun
                prev.close()
            except (OSError, ValueError) as e:
                log.warning("feed: newest epoch %s unreadable (%s); batches restart", last, e)
        self.batch = batch
        self.cur: Epoch | None = None
        self._superseded: list[tuple[float, int]] = [(time.monotonic(), i) for i in ids]
        self._next_epoch = last + 1
        self._started = 0.0
        self._new_epoch(self.min_slots)

    def _new_epoch(self, slots: int, copy: bool = False) -> None:
        """Start the next epoch; ``copy``: with all rows of the current one (growth)."""
        ep = self._next_epoch
        old = self.cur
        new = Epoch.create(self.dir / epoch_name(ep), ep, slots, self.rb, self.batch + 1, copy_of=old if copy else None)
        if old is not None:
            self._superseded.append((time.monotonic(), old.epoch))
            old.close()
        self.cur = new
        self._next_epoch = ep + 1
        if not copy:
            self._started = time.monotonic()
        self._trim()

    def append(self, keys: bytes, records: np.ndarray) -> int:
        """:meth:`stage` and publish at once; returns the batch number."""
        staged = self.stage(keys, records)
        staged.publish()
        return staged.batch

    def stage(self, keys: bytes, records: np.ndarray) -> Staged:
        """Put one batch of rows (``keys``: the 12-byte row keys, concatenated, unique)
        into the feed, invisible to readers until published. Call it BEFORE writing them
        to the store, and publish each part once the store holds it."""
        k = combined_from_store_keys(keys)
        recs = np.ascontiguousarray(records, dtype=np.uint8)
        if recs.shape != (len(k), self.rb):
            raise ValueError(f"feed batch of {len(k)} rows needs records [{len(k)}, {self.rb}], got {recs.shape}")
        cur = self.cur
        if time.monotonic() - self._started >= self.epoch_seconds:  # bound memory: followers let old go
            need = max(self.min_slots, 2 * cur.count, 2 * len(k))
            self._new_epoch(1 << (need - 1).bit_length())
            cur = self.cur
        elif (cur.count + len(k)) * 2 > cur.slots:  # outgrown: a bigger table with the same rows
            self._new_epoch(1 << (2 * (cur.count + len(k)) - 1).bit_length(), copy=True)
            cur = self.cur
        b = self.batch + 1
        for _ in range(8):
            cur.header[fi.H_BEGUN] = b  # before any row of the batch is visible
            slot, claimed = fi.find_or_claim(cur.keys, cur.slots, k)
            cur.header[fi.H_COUNT] = cur.count + claimed
            if (slot >= 0).all():
                break
            # a probe ran out of room (keys claimed here stay at version 0: invisible):
            # the whole batch again in a bigger copy of this epoch
            self._new_epoch(2 * cur.slots, copy=True)
            cur = self.cur
        else:
            raise RuntimeError(f"feed: no room for a batch of {len(k)} rows")
        self.batch = b
        return Staged(cur, slot, fi.stage_rows(cur.vers, cur.values, slot, recs), b)

    def _trim(self) -> None:
        """Delete epochs superseded more than ``keep_seconds`` ago."""
        now = time.monotonic()
        keep = []
        for t, ep in self._superseded:
            if now - t >= self.keep_seconds:
                try:
                    (self.dir / epoch_name(ep)).unlink()
                except FileNotFoundError:
                    pass
            else:
                keep.append((t, ep))
        self._superseded = keep

    def close(self) -> None:
        if self.cur is not None:
            self.cur.close()
            self.cur = None


class FeedReader:
    """A follower's side: the mapped epochs, newest first, and lookups in them."""

    def __init__(self, store_path: str | Path, record_bytes: int, *, torn_retries: int = fi.TORN_RETRIES) -> None:
        check_machine()
        shm_root()  # a clear error now, not at every refresh
        self.store = Path(store_path)
        self.dir: Path | None = None
        self.rb = int(record_bytes)
        self.torn_retries = int(torn_retries)
        self.epochs: list[Epoch] = []  # newest first

    def refresh(self) -> tuple[list[Epoch], bool]:
        """Map epochs that appeared, and let go of those that a new one copied; returns
        ``(epochs added, gap)``: ``gap`` when the ids jump past one never mapped, or go
        back, or the store points to another feed directory (a new feed): rows may be
        missing."""
        d = feed_dir(self.store)
        moved = d != self.dir and self.dir is not None
        self.dir = d
        if d is None:
            return [], moved and bool(self.epochs)
        ids = epoch_ids(d)
        have = self.epochs[0].epoch if self.epochs else None
        if moved:
            have = None
        new = [i for i in ids if have is None or i > have]
        gap = bool(have is not None and ((new and new[0] != have + 1) or (ids and ids[-1] < have)))
        gap = gap or (moved and bool(self.epochs))
        added: list[Epoch] = []
        for i in new:
            try:
                ep = Epoch(self.dir / epoch_name(i), writable=False)
            except FileNotFoundError:
                gap = gap or have is not None
                continue
            if ep.rb != self.rb:
                ep.close()
                raise ValueError(f"{self.dir / epoch_name(i)}: records of {ep.rb} bytes, the store's are {self.rb}")
            # one assignment each: request threads read the list
            self.epochs = [ep, *(e for e in self.epochs if e.epoch != ep.copy_of or e.path.parent != ep.path.parent)]
            added.append(ep)
        return added, gap

    def begun(self) -> int:
        """The newest epoch's last batch begun (0 if none)."""
        return self.epochs[0].begun if self.epochs else 0

    def covered(self, begun: int) -> list[Epoch]:
        """Epochs (never the newest) whose batches all come before ``begun``."""
        out = []
        for newer, ep in zip(self.epochs, self.epochs[1:]):
            if newer.first_batch <= begun:
                out.append(ep)
        return out

    def release(self, epochs: list[Epoch]) -> None:
        """Stop using these epochs (their mappings go once no request reads them)."""
        ids = {id(e) for e in epochs}
        self.epochs = [e for e in self.epochs if id(e) not in ids]

    def lookup(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(positions int64 [H] of the keys found, records uint8 [H, rb])``, each key
        from the newest epoch that holds it."""
        epochs = self.epochs
        if not epochs or len(k) == 0:
            return np.zeros(0, np.int64), np.zeros((0, self.rb), np.uint8)
        pos, recs = fi.read_rows(
            epochs[0].keys, epochs[0].vers, epochs[0].values, epochs[0].slots, k, self.torn_retries
        )
        for ep in epochs[1:]:
            rest = np.ones(len(k), dtype=bool)
            rest[pos] = False
            rest = np.flatnonzero(rest)
            if len(rest) == 0:
                break
            p2, r2 = fi.read_rows(ep.keys, ep.vers, ep.values, ep.slots, k[rest], self.torn_retries)
            pos, recs = np.concatenate([pos, rest[p2]]), np.concatenate([recs, r2])
        return pos, recs

    def rows(self) -> int:
        return sum(e.count for e in self.epochs)

    def close(self) -> None:
        self.release(list(self.epochs))

"""The embedding store: ``EmbeddingStore`` HOLDS a backend (``storage``, a ``backend.StoreBackend``:
``rocksdb_store.RocksDBBackend`` or ``redis_store.RedisBackend``, one shard at a time, bytes in, bytes
out) and does everything else over its primitives: modes and lifecycle, reads (rows, seqs, meta records,
verification, stats), the write plan (which rows win, seqs, the feed, one atomic batch per shard, meta
records), and bulk load (the SST pipeline: ``bulk_load.load_tables``).

Read top to bottom: the store's state and the backend it holds, reads, writes, bulk load, admin and
lifecycle, then the NumPy helpers of a write (which input rows win).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from offgraph.store.backend import StoreBackend
from offgraph.store.bulk_load import load_tables
from offgraph.store.config import StoreConfig
from offgraph.store.errors import StoreReadError
from offgraph.store.feed import FeedReader, FeedWriter
from offgraph.store.internal_keys import (
    RESERVED_META,
    SEQ_END,
    SEQ_PREFIX,
    SEQ_WATERMARK_KEY,
    decode_seq,
    decode_seqs,
    encode_seq,
    seq_key_list,
    seq_value_list,
)
from offgraph.store.keys import (
    KEY_BYTES,
    META_PREFIX,
    as_key_arrays,
    check_shard,
    key_array,
    key_list,
    shard_of,
    unique_keys,
)
from offgraph.store.quant import get_codec
from offgraph.store.verify import expect_rows_in_every_shard, seek_rows

__all__ = ["EmbeddingStore", "ReadResult", "WriteResult", "MODES", "DURABILITY", "MIN_CHUNK_KEYS"]

MODES = ("r", "w", "follow")
DURABILITY = ("wal", "flush")

MIN_CHUNK_KEYS = 16
"""The fewest keys one ``multi_get`` of a parallel read gets: splitting a small read further costs
more in calls and thread hand-offs than the reads in flight save."""

log = logging.getLogger("offgraph.store")


@dataclass(frozen=True)
class ReadResult:
    """What :meth:`EmbeddingStore.read_with_stats` returns (input order)."""

    vectors: np.ndarray  # float32 rows.shape + [D]
    first_order: np.ndarray  # float32 rows.shape
    rows_read: int  # rows.size
    unique_rows: int  # distinct (table, row) pairs looked up
    found_rows: int  # distinct pairs present in the store
    read_seconds: float  # wall time of the store read (all its multi_get calls, in parallel)


@dataclass(frozen=True)
class WriteResult:
    """What :meth:`EmbeddingStore.write` returns."""

    applied: int  # distinct (table, row) keys written
    skipped_stale: int  # input rows not written: a newer-or-equal seq won (stored, or in the same call)


class EmbeddingStore:
    """Sharded ``(table id, row) -> (vector, first-order weight)`` store over a backend it holds.

    Open one with :func:`offgraph.store.open_store`. Thread-safe for concurrent reads.
    """

    def __init__(
        self, path: str | os.PathLike, config: StoreConfig, mode: str, backend: type[StoreBackend], **options: Any
    ) -> None:
        """Open the store at ``path`` on a new ``backend`` (a ``StoreBackend`` class); ``options`` go to
        its ``_open`` (``open_store`` passes them: RocksDB's ``secondary_dir``)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.path = os.fspath(path)
        self.config = config
        self.mode = mode
        self.codec = get_codec(config.quant, config.dim)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._feed: FeedWriter | None = None  # writer: opened by the first write with feed=True
        self._seq_watermarks: dict[int, int] = {}  # writer: shard -> highest seq it holds
        self._closed = False
        storage = backend(self.path, config, mode)  # a backend missing a primitive: TypeError, nothing opened
        storage._open(**options)
        self.storage: StoreBackend = storage
        """Where the rows live: every read and write of this store goes through its primitives."""

    # ------------------------------------------------------------------ the backend
    @property
    def backend(self) -> str:
        """The backend's name (``"rocksdb"``, ``"redis"``), as ``StoreConfig.backend`` records it."""
        return self.storage.backend

    @property
    def io_mode(self) -> str:
        """How the backend reads (``"direct"``: O_DIRECT, past the page cache; ``"buffered"``; ``"remote"``)."""
        return self.storage.io_mode

    def cache_usage(self) -> int:
        """Bytes now held by the backend's own read cache (RocksDB's block cache; 0 if none)."""
        return self.storage.cache_usage()

    def set_cache_mb(self, mb: int) -> None:
        """Bound the backend's own read cache to ``mb`` MiB from now on."""
        self.storage.set_cache_mb(mb)

    def block_cache_stats(self) -> dict[str, int] | None:
        """``{"hits", "misses"}`` of the backend's read cache since the store opened (None: not counted)."""
        return self.storage.block_cache_stats()

    def watch_changes(self, on_rows: Callable[[np.ndarray, np.ndarray], None], on_lost: Callable[[], None]) -> bool:
        """Have the backend tell of rows other processes write (``StoreBackend.watch_changes``)."""
        return self.storage.watch_changes(on_rows, on_lost)

    def __getattr__(self, name: str) -> Any:
        """What one backend adds and the store does not wrap (RocksDB's ``property_value``, Redis's
        ``url`` and ``delete_rows``) is read from :attr:`storage`."""
        if name == "storage":  # not set yet: __init__ failed before it
            raise AttributeError(name)
        return getattr(self.storage, name)

    # ------------------------------------------------------------------ reads (any mode; thread-safe)
    def read(self, table_ids, rows) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``(table_ids[i], rows[i])`` in input order.

        ``rows``: int array of any shape ``R`` (e.g. ``[K]`` or ``[N, F]``);
        ``table_ids``: a scalar or an array broadcasting to ``R`` (e.g. ``[F]``).
        Returns ``(vectors float32 R + [D], first_order float32 R)``; rows absent
        from the store read as zeros. Duplicates are looked up once.
        """
        res = self.read_with_stats(table_ids, rows)
        return res.vectors, res.first_order

    def read_with_stats(self, table_ids, rows) -> ReadResult:
        """Like :meth:`read`, plus counts for metrics (rows, unique rows, rows found) and the read's wall time."""
        self._check_open()
        shape = np.shape(rows)
        t, r = as_key_arrays(table_ids, rows, allow_nd=True)
        ut, ur, inv = unique_keys(t, r)
        t0 = time.perf_counter()
        vec, w, found = self._read_keys(ut, ur)
        return ReadResult(
            vec[inv].reshape(shape + (self.config.dim,)),
            w[inv].reshape(shape),
            len(r),
            len(ur),
            int(found.sum()),
            time.perf_counter() - t0,
        )

    def read_unique(self, table_ids, rows, parallel: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """No de-duplication (for callers that already did it): ``(vectors,
        first_order, found bool [K])`` in input order. ``parallel=False``: the shards are read one
        after another on the calling thread, not by the read pool (a background job that must not
        take every CPU while requests are served)."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        return self._read_keys(t, r, parallel)

    def read_unique_records(self, table_ids, rows, parallel: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The stored records of ``(table_ids[i], rows[i])``, not decoded: ``(records uint8
        [K, codec.record_bytes], found bool [K])`` in input order; a row absent from the store has
        an all-zero record. No de-duplication. ``parallel``: as in :meth:`read_unique` (for a cache
        that keeps rows in the store's quantized form)."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        return self._read_records(t, r, parallel)

    def _read_keys(self, t: np.ndarray, r: np.ndarray, parallel: bool = True):
        """``(vectors, first_order, found)`` of validated keys: the records, then ``codec.decode``."""
        records, found = self._read_records(t, r, parallel)
        n = len(r)
        if found.all():
            vec, w = self.codec.decode(records)
            return vec, w, found
        vec = np.zeros((n, self.config.dim), dtype=np.float32)
        w = np.zeros(n, dtype=np.float32)
        if found.any():
            vec[found], w[found] = self.codec.decode(records[found])
        return vec, w, found

    def _read_records(self, t: np.ndarray, r: np.ndarray, parallel: bool = True):
        rb = self.codec.record_bytes
        records = np.zeros((len(r), rb), dtype=np.uint8)
        found = np.zeros(len(r), dtype=bool)
        if len(r) == 0:
            return records, found

        def read(chunk: tuple[int, np.ndarray]) -> None:  # fills its own positions of the outputs
            s, pos = chunk
            values = self.storage._multi_get(s, key_list(key_array(t[pos], r[pos])))
            if values.count(None):
                hit = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
                pos = pos[hit]
                values = [v for v in values if v is not None]
            if not values:
                return
            buf = b"".join(values)
            if len(buf) != rb * len(values):
                raise StoreReadError(
                    f"store {self.path!r} holds records whose size is not {rb} bytes "
                    f"({self.config.quant}, dim {self.config.dim}): wrong config or corrupt store",
                    "bad record size",
                )
            records[pos] = np.frombuffer(buf, dtype=np.uint8).reshape(-1, rb)
            found[pos] = True

        chunks = self._read_chunks(t, r, parallel)
        if len(chunks) == 1 or not parallel or self.config.read_threads == 1:
            deque(map(read, chunks), maxlen=0)
        else:
            deque(self._executor().map(read, chunks), maxlen=0)
        return records, found

    def _read_chunks(self, t: np.ndarray, r: np.ndarray, parallel: bool) -> list[tuple[int, np.ndarray]]:
        """``[(shard, positions)]``: the keys grouped by shard, each shard's keys in key order and
        split into pieces of about ``MIN_CHUNK_KEYS`` or more so that a read has about ``read_threads``
        ``multi_get`` calls in flight (one call reads its keys one after another, and a disk serves
        several random reads at once). Not ``parallel`` (or one read thread): one call per shard."""
        ways = self.config.read_threads if parallel else 1
        size = max(MIN_CHUNK_KEYS, -(-len(r) // ways)) if ways > 1 else len(r)
        chunks = []
        for s, idx in self._group_by_shard(shard_of(t, r, self.config.shards)):
            idx = idx[np.lexsort((r[idx], t[idx]))]  # key order: neighbouring keys share blocks
            chunks.extend((s, piece) for piece in np.array_split(idx, max(1, round(len(idx) / size))))
        return chunks

    def verify_sample(
        self, table_rows: dict[int, int], max_reads: int = 4096, between: Callable[[], None] | None = None
    ) -> dict[str, int]:
        """Read real rows of every table from every shard, spread so that a small store has every
        data block read and a big one a sample of at most ~``max_reads`` seeks (``offgraph.store.verify``);
        the block cache is left as it was. ``table_rows``: table id -> rows (all of ``0..rows-1``
        are in the store, as after an export). Raises StoreReadError on a read that fails (RocksDB
        checks each block's checksum), a record of the wrong size or with a non-finite value, or a
        shard that holds no row of a table it must hold rows of. ``between`` is called after each
        (shard, table) chunk of seeks (a server loading a version while another serves paces itself
        there: seeks hold the GIL). Returns ``{"seeks", "rows_read"}``."""
        self._check_open()
        rb, shards = self.codec.record_bytes, self.config.shards
        plan = seek_rows(table_rows, shards, rb, self.config.block_size_kb << 10, max_reads)
        seeks = rows_read = 0
        for s in range(shards):
            for t, rows in plan.items():
                upper = key_list(key_array(np.array([t], np.int64), np.array([table_rows[t]], np.int64)))[0]
                found = self.storage._seek_first(s, key_list(key_array(np.full(len(rows), t, np.int64), rows)))
                seeks += len(rows)
                values = [v for kv in found if kv is not None and kv[0] < upper for v in kv[1:]]
                if not values:
                    if expect_rows_in_every_shard(int(table_rows[t]), shards):
                        raise StoreReadError(
                            f"store {self.path!r}: shard {s} holds no row of table {t} "
                            f"({table_rows[t]} rows over {shards} shards): missing data",
                            f"shard {s} misses table {t}",
                        )
                    continue
                if any(len(v) != rb for v in values):
                    raise StoreReadError(
                        f"store {self.path!r}: shard {s}, table {t}: a record is not "
                        f"{rb} bytes ({self.config.quant}, dim {self.config.dim})",
                        "bad record size",
                    )
                vec, w = self.codec.decode(np.frombuffer(b"".join(values), np.uint8).reshape(-1, rb))
                if not (np.isfinite(vec).all() and np.isfinite(w).all()):
                    raise StoreReadError(
                        f"store {self.path!r}: shard {s}, table {t}: non-finite values", "non-finite values"
                    )
                rows_read += len(values)
                if between is not None:
                    between()
        return {"seeks": seeks, "rows_read": rows_read}

    def row_seqs(self, table_ids, rows) -> np.ndarray:
        """Stored sequence numbers of ``(table_ids[i], rows[i])`` (int64 [K]; -1 where
        none is stored). One ``multi_get`` per shard."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        out = np.full(len(r), -1, dtype=np.int64)
        if len(r) == 0:
            return out
        for s, idx in self._group_by_shard(shard_of(t, r, self.config.shards)):
            out[idx] = decode_seqs(self.storage._multi_get(s, seq_key_list(key_array(t[idx], r[idx]))))
        return out

    def get_meta(self, key: bytes, shard: int = 0) -> bytes | None:
        """The meta record ``key`` of ``shard`` (None if absent)."""
        self._check_open()
        ((k, _),) = self._meta_items({key: b""})
        return self.storage._multi_get(self._check_shard(shard), [k])[0]

    def get_metas(self, keys: list[bytes], shard: int = 0) -> list[bytes | None]:
        """The meta records ``keys`` of ``shard`` (None where absent), in one read."""
        self._check_open()
        items = self._meta_items(dict.fromkeys(keys, b""))
        got = dict(zip((k for k, _ in items), self.storage._multi_get(self._check_shard(shard), [k for k, _ in items])))
        return [got[META_PREFIX + k] for k in keys]

    def get_meta_per_shard(self, key: bytes) -> list[bytes | None]:
        """The meta record ``key`` of every shard, by shard index."""
        self._check_open()
        ((k, _),) = self._meta_items({key: b""})
        return [self.storage._multi_get(s, [k])[0] for s in range(self.config.shards)]

    def stats(self, exact: bool = False) -> dict[str, Any]:
        """Sizes and counts. ``rows_per_table`` (table id -> rows) is exact and scans
        every key when ``exact``; otherwise only the backend's estimate of keys is given."""
        self._check_open()
        shards = [{"shard": s, **self.storage._shard_info(s)} for s in range(self.config.shards)]
        out: dict[str, Any] = {
            "backend": self.backend,
            "path": self.path,
            "mode": self.mode,
            "io_mode": self.io_mode,
            "config": self.config.to_dict(),
            "record": self.codec.describe(),
            "shards": shards,
            "bytes_on_disk": sum(x["bytes_on_disk"] for x in shards),
            "estimated_keys": sum(x["estimated_keys"] for x in shards),
            "rows_per_table": None,
        }
        if exact:
            counts: dict[int, int] = {}
            for s in range(self.config.shards):
                for tid, c in _count_tables(self.storage._iter_row_keys(s)).items():
                    counts[tid] = counts.get(tid, 0) + c
            out["rows_per_table"] = dict(sorted(counts.items()))
        return out

    # ------------------------------------------------------------------ writes (mode "w")
    def write(
        self,
        table_ids,
        rows,
        vectors,
        first_order,
        *,
        seqs=None,
        meta: dict[bytes, bytes] | None = None,
        meta_shards: str | int = "all",
        feed: bool = False,
        sync: bool = False,
        durability: str = "wal",
    ) -> WriteResult:
        """Quantize and put rows; ONE atomic batch per shard.

        ``seqs`` (int >= 0 per row, optional): per-row sequence numbers, kept in the
        store (same shard, same atomic batch as the row). Last write wins by seq: a row
        whose stored seq is >= its new seq is skipped (``skipped_stale``), and of
        duplicates of one key in a call the highest seq wins (equal: the first one, as
        across calls).
        Without ``seqs`` the stored seqs are neither read nor changed and a later
        duplicate in the call wins. The read-compare-write of seqs assumes ONE writer
        (one process, writes serialized by a lock), which is what mode ``"w"`` gives.
        Stored seqs are read only for rows whose new seq is at or below the shard's
        watermark (the highest seq it holds, kept in the same atomic batch): producers
        that number updates in increasing order cost no reads.

        ``feed``: feed the followers: the applied rows of all shards go, as ONE batch,
        to the store's write feed (``offgraph.store.feed``) before the first shard batch is
        written, each shard's rows made visible there once the store holds them;
        followers serve fresh rows from the feed, so a writer with followers must set it
        on every write.

        ``meta`` records (small ``bytes -> bytes``, kept in the meta key space, see
        :meth:`get_meta`) go into the SAME atomic batch of the shards named by
        ``meta_shards``: ``"all"`` (every shard, even one without rows: each shard
        then records how far it got), ``"touched"`` (shards that got rows) or a shard
        index.

        A ``ValueError`` (bad arguments or values, e.g. one the record format cannot hold)
        is raised before anything is written; an ``OSError`` (disk full, I/O) may come after
        some shards' batches were written (each shard's batch is atomic).

        ``durability``: ``"wal"`` (default) logs each batch to the write-ahead log
        (``sync`` fsyncs it). ``"flush"`` skips the WAL and flushes each written shard's
        memtable into an SST file before the next shard is written: as durable and as
        atomic per shard (a flush installs its SST in one MANIFEST edit; a crash before it
        loses that shard's batch, its meta records included; a shard that gets meta records
        only is written through the WAL, not flushed), and far cheaper for followers: a
        RocksDB secondary then picks up new SST files instead of replaying the WAL in
        ``try_catch_up_with_primary``, which holds the follower's GIL (the two measured
        against each other: ``bench/results/update-freshness/README.md``).
        """
        self._check_writable()
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {durability!r}")
        wal = durability == "wal"
        t, r = as_key_arrays(table_ids, rows)
        records = self.codec.encode(vectors, first_order)
        if len(records) != len(r):
            raise ValueError(f"got {len(r)} rows but {len(records)} vectors")
        sq = None if seqs is None else check_seqs(seqs, len(r))
        if not isinstance(feed, bool):
            raise ValueError(f"feed must be a bool, got {feed!r}")
        meta_items = self._meta_items(meta)
        S = self.config.shards
        win = winners(t, r, sq)
        skipped = len(r) - len(win) if sq is not None else 0
        t, r, records = t[win], r[win], records[win]
        if sq is not None:
            sq = sq[win]
        groups = self._group_by_shard(shard_of(t, r, S)) if len(r) else []
        if not meta_items:
            meta_targets: set[int] = set()
        elif meta_shards == "all":
            meta_targets = set(range(S))
        elif meta_shards == "touched":
            meta_targets = {s for s, _ in groups}
        else:
            meta_targets = {self._check_shard(meta_shards)}
        rows_by_shard = dict(groups)
        applied = 0
        with self._write_lock:
            # plan every shard's batch first (seq checks included), so that the feed batch
            # holding exactly these rows is staged BEFORE any of them is written (and each
            # shard's rows published once the store holds them: offgraph.store.feed)
            plans: list[tuple[int, list[bytes], list[bytes], int]] = []
            fed_keys: list[bytes] = []
            fed_records: list[np.ndarray] = []
            fed_span: dict[int, tuple[int, int]] = {}  # shard -> its rows in the feed batch
            fed_rows = 0
            new_watermarks: dict[int, int] = {}  # taken in memory once the shard's batch is written
            for s in sorted(set(rows_by_shard) | meta_targets):
                keys: list[bytes] = []
                values: list[bytes] = []
                idx = rows_by_shard.get(s)
                if idx is not None:
                    ka = key_array(t[idx], r[idx])
                    if sq is not None:
                        wm = self._seq_watermark(s)
                        fresh = self._fresh(s, ka, sq[idx], wm)
                        skipped += len(idx) - int(fresh.sum())
                        if not fresh.all():
                            idx, ka = idx[fresh], ka[fresh]
                        if len(idx):
                            keys += seq_key_list(ka)
                            values += seq_value_list(sq[idx])
                            top = max(wm, int(sq[idx].max()))
                            if top > wm:
                                keys.append(SEQ_WATERMARK_KEY)
                                values.append(encode_seq(top))
                                new_watermarks[s] = top
                    if len(idx):
                        keys += key_list(ka)
                        values += _record_list(records[idx])
                        if feed:
                            fed_keys.append(ka.tobytes())
                            fed_records.append(records[idx])
                            fed_span[s] = (fed_rows, fed_rows + len(idx))
                            fed_rows += len(idx)
                if s in meta_targets:
                    keys += [k for k, _ in meta_items]
                    values += [v for _, v in meta_items]
                if keys:
                    plans.append((s, keys, values, 0 if idx is None else len(idx)))
            staged = self._feed_writer().stage(b"".join(fed_keys), np.concatenate(fed_records)) if fed_keys else None
            plans.sort(key=lambda p: p[3] == 0)  # shards with rows first: their rows are published sooner
            for s, keys, values, n_rows in plans:
                # each shard written, flushed and published before the next one is written: a
                # fed row waits for its own shard only, not for every shard's write and the
                # flushes before its own. A shard that gets meta records only (the updater's
                # position in every shard) goes through the WAL instead of a flush: as durable
                # against a crash of this process, and without the flush's fsyncs (else a batch
                # of a few rows would pay one flush per shard)
                meta_only = n_rows == 0
                logged = wal or meta_only
                self.storage._write_batch(s, keys, values, sync and logged, logged)
                applied += n_rows
                if s in new_watermarks:
                    self._seq_watermarks[s] = new_watermarks[s]
                if not logged:
                    self.storage._flush(s)
                if staged is not None and s in fed_span:
                    staged.publish(*fed_span[s])  # in the WAL (survives a crash of this process) or an SST
        return WriteResult(applied, skipped)

    def _fresh(self, s: int, ka: np.ndarray, new: np.ndarray, watermark: int) -> np.ndarray:
        """Which rows of shard ``s`` (keys ``ka``) hold an older seq than ``new``: reads the
        stored seqs of those at or below the watermark only (above it none can be stale)."""
        fresh = new > watermark
        if not fresh.all():
            maybe = np.flatnonzero(~fresh)
            stored = decode_seqs(self.storage._multi_get(s, seq_key_list(ka[maybe])))
            fresh[maybe] = new[maybe] > stored
        return fresh

    def _seq_watermark(self, s: int) -> int:
        """The highest seq shard ``s`` holds (-1: none): its watermark record, or, in a store
        written before the record existed, the maximum over its seq records (read once)."""
        wm = self._seq_watermarks.get(s)
        if wm is None:
            raw = self.storage._multi_get(s, [SEQ_WATERMARK_KEY])[0]
            if raw is not None:
                wm = decode_seq(raw)
            else:
                seqs = decode_seqs(list(self.storage._iter_values(s, SEQ_PREFIX, SEQ_END)))
                wm = int(seqs.max()) if len(seqs) else -1
                if len(seqs):
                    log.info(
                        "%s shard %d: seq watermark %d from %d seq records (a store written before "
                        "watermarks were kept)",
                        self.path,
                        s,
                        wm,
                        len(seqs),
                    )
            self._seq_watermarks[s] = wm
        return wm

    def _feed_writer(self) -> FeedWriter:
        if self._feed is None:
            self._feed = FeedWriter(self.path, self.codec.record_bytes)
        return self._feed

    def feed_reader(self) -> FeedReader:
        """The write feed of this store, for a follower (see ``offgraph.store.feed``)."""
        self._check_open()
        return FeedReader(self.path, self.codec.record_bytes)

    def put_meta(self, key: bytes, value: bytes, shard: int | None = None) -> None:
        """Put one meta record in ``shard`` (every shard if None)."""
        self._check_writable()
        ((k, v),) = self._meta_items({key: value})
        shards = range(self.config.shards) if shard is None else [self._check_shard(shard)]
        for s in shards:
            self.storage._write_batch(s, [k], [v], False)

    def _meta_items(self, meta: dict[bytes, bytes] | None) -> list[tuple[bytes, bytes]]:
        items = []
        for k, v in (meta or {}).items():
            if not isinstance(k, bytes) or not k:
                raise ValueError(f"meta keys must be non-empty bytes, got {k!r}")
            if k.startswith(RESERVED_META):
                raise ValueError(f"meta keys starting with byte 0x00 are reserved for the store, got {k!r}")
            if not isinstance(v, bytes):
                raise ValueError(f"meta values must be bytes, got {type(v).__name__} for {k!r}")
            items.append((META_PREFIX + k, v))
        return items

    # ------------------------------------------------------------------ bulk load (mode "w")
    def bulk_load(
        self,
        table_id: int,
        chunks: Iterable[tuple[Any, Any, Any]],
        *,
        total_rows: int | None = None,
        progress: bool | Callable[[int], None] = False,
        tmp_dir: str | None = None,
        workers: int | None = None,
    ) -> int:
        """Load one table from chunks ``(rows int [k], vectors [k, D], first_order [k])``
        through external SST files (one per shard per run), ingested by MOVE.

        Chunks in ascending row order stream straight into S open SST writers (one
        chunk in memory at a time). A chunk that goes back in row order closes the
        current run (its files are ingested) and starts a new one, so any order works;
        later rows win over earlier ones, also within a chunk. ``progress``: True for
        a tqdm bar, or a callable given the number of rows done. ``workers``: processes
        writing SST files (None: ``min(4, CPUs, shards)`` when ``total_rows`` is at
        least 2**21, else 1 = in this process). ``tmp_dir`` must be on the store's
        filesystem for the move (default: inside the store). Returns rows loaded.
        """
        return self.bulk_load_tables(
            [(table_id, chunks)], total_rows=total_rows, progress=progress, tmp_dir=tmp_dir, workers=workers
        )[0]

    def bulk_load_tables(
        self,
        tables: Iterable[tuple[int, Iterable[tuple[Any, Any, Any]]]],
        *,
        total_rows: int | None = None,
        progress: bool | Callable[[int], None] = False,
        tmp_dir: str | None = None,
        workers: int | None = None,
    ) -> list[int]:
        """:meth:`bulk_load` of several tables ``(table_id, chunks)`` in ONE run of SST
        files per shard when table ids ascend (one file per shard instead of one per
        shard and table: less per-file overhead on disk and fewer files to open).
        ``total_rows`` counts all tables. Returns rows loaded per table."""
        self._check_writable()
        return load_tables(
            self.storage,
            self.codec,
            tables,
            total_rows=total_rows,
            progress=progress,
            tmp_dir=tmp_dir,
            workers=workers,
        )

    # ------------------------------------------------------------------ admin and lifecycle
    def catch_up(self, shard: int | None = None) -> None:
        """Follow mode: see rows the live writer process has written since the last
        call, in every shard or in ``shard`` only (about a few ms for all shards, and
        RocksDB holds the GIL meanwhile: call it from a background thread, shard by
        shard, never per request)."""
        self._check_open()
        if self.mode != "follow":
            raise ValueError(f"catch_up needs a store opened with mode='follow', not {self.mode!r}")
        for s in range(self.config.shards) if shard is None else [self._check_shard(shard)]:
            self.storage._catch_up(s)

    def flush(self) -> None:
        """Write mode: make every shard's writes durable in its table files (RocksDB: flush the
        memtables to SST files)."""
        self._check_writable()
        for s in range(self.config.shards):
            self.storage._flush(s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.storage._close()

    def __enter__(self) -> EmbeddingStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.path!r}, backend={self.backend!r}, mode={self.mode!r}, "
            f"quant={self.config.quant!r}, dim={self.config.dim}, shards={self.config.shards})"
        )

    # ------------------------------------------------------------------ helpers
    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.config.read_threads, thread_name_prefix="store-read"
                    )
        return self._pool

    def _group_by_shard(self, shard: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``[(shard, indices in input order)]`` for the shards that occur."""
        if self.config.shards == 1:
            return [(0, np.arange(len(shard)))]
        order = np.argsort(shard, kind="stable")
        counts = np.bincount(shard, minlength=self.config.shards)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return [(s, order[bounds[s] : bounds[s + 1]]) for s in range(self.config.shards) if counts[s]]

    def _check_shard(self, shard: Any) -> int:
        return check_shard(shard, self.config.shards)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self.path!r} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.mode != "w":
            raise ValueError(
                f"store {self.path!r} is open with mode={self.mode!r} (read-only); open it with mode='w' to write"
            )


# ---------------------------------------------------------------------- which rows of a write win
# Last-write-wins by sequence number: a row is replaced only by a strictly higher seq, within a call as
# across calls. Of duplicates of one (table, row) key in a call the highest seq wins, and of equal seqs the
# FIRST (as a later call with an equal seq is skipped: so how updates are grouped into calls never changes
# the result); a row whose stored seq is >= its new seq is not written. Without seqs, the later duplicate wins.


def check_seqs(seqs, n: int) -> np.ndarray:
    """``seqs`` as int64 [n]; ValueError unless integers >= 0 of the rows' length."""
    s = np.asarray(seqs)
    if s.ndim != 1 or len(s) != n:
        raise ValueError(f"seqs must be a 1-D array with one sequence number per row ({n}), got shape {s.shape}")
    if n and not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"seqs must be integers, got dtype {s.dtype}")
    if n and np.issubdtype(s.dtype, np.unsignedinteger) and int(s.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"seqs must be < 2**63, got {int(s.max())}")
    s = s.astype(np.int64, copy=False)
    if n and int(s.min()) < 0:
        raise ValueError(f"seqs must be >= 0, got {int(s.min())}")
    return s


def winners(t: np.ndarray, r: np.ndarray, seqs: np.ndarray | None) -> np.ndarray:
    """Indices of the input rows that win, one per distinct key, sorted by (table, row)."""
    n = len(r)
    if n <= 1:
        return np.arange(n)
    pos = np.arange(n)
    order = np.lexsort((pos, r, t) if seqs is None else (-pos, seqs, r, t))
    ts, rs = t[order], r[order]
    last = np.ones(n, dtype=bool)
    last[:-1] = (ts[1:] != ts[:-1]) | (rs[1:] != rs[:-1])
    return order[last]


def _record_list(records: np.ndarray) -> list[bytes]:
    rb = records.shape[1]
    return np.ascontiguousarray(records).view(np.dtype((np.void, rb))).ravel().tolist()


def _count_tables(keys: Iterable[bytes], batch: int = 1 << 20) -> dict[int, int]:
    """Row count per table id of a stream of row keys (vectorized per batch)."""
    counts: dict[int, int] = {}
    buf: list[bytes] = []

    def drain() -> None:
        tids = np.frombuffer(b"".join(k[:4] for k in buf), dtype=">u4")
        u, c = np.unique(tids, return_counts=True)
        for tid, n in zip(u.tolist(), c.tolist()):
            counts[tid] = counts.get(tid, 0) + n
        buf.clear()

    for k in keys:
        if len(k) != KEY_BYTES:
            raise ValueError(f"unexpected key {k!r} in row key space")
        buf.append(k)
        if len(buf) >= batch:
            drain()
    if buf:
        drain()
    return counts

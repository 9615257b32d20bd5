"""The backend-independent embedding store: template methods over a few primitives.

A backend implements the ``_``-prefixed abstract primitives (one shard at a time,
bytes in, bytes out); everything else (validation, de-duplication, sharding, parallel
reads, (de)quantization, atomic per-shard batches, streaming bulk load) lives here.
"""

from __future__ import annotations

import abc
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import StoreConfig
from .keys import (
    KEY_BYTES,
    MAX_TABLE_ID,
    META_PREFIX,
    as_key_arrays,
    key_array,
    key_list,
    shard_of,
    unique_keys,
)
from .internal_keys import (
    CHANGE_END,
    LAST_CHANGE_KEY,
    RESERVED_META,
    change_id_of,
    change_key,
    decode_change_id,
    decode_change_keys,
    decode_seqs,
    encode_change_id,
    seq_key_list,
    seq_value_list,
)
from .errors import StoreReadError
from .feed import FeedReader, FeedWriter
from .quant import get_codec
from .sst_run import SstRuns, WriterFactory
from .verify import expect_rows_in_every_shard, seek_rows
from .write_plan_impl import check_seqs, winners

MODES = ("r", "w", "follow")
DURABILITY = ("wal", "flush")


@dataclass(frozen=True)
class ReadResult:
    """What :meth:`EmbeddingStore.read_with_stats` returns (input order)."""

    vectors: np.ndarray  # float32 rows.shape + [D]
    first_order: np.ndarray  # float32 rows.shape
    rows_read: int  # rows.size
    unique_rows: int  # distinct (table, row) pairs looked up
    found_rows: int  # distinct pairs present in the store


@dataclass(frozen=True)
class WriteResult:
    """What :meth:`EmbeddingStore.write` returns."""

    applied: int  # distinct (table, row) keys written
    skipped_stale: int  # input rows not written: a newer-or-equal seq won (stored, or in the same call)


class EmbeddingStore(abc.ABC):
    """Sharded ``(table id, row) -> (vector, first-order weight)`` store.

    Open one with :func:`embstore.open_store`. Thread-safe for concurrent reads.
    """

    backend = ""

    def __init__(self, path: str, config: StoreConfig, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.path = os.fspath(path)
        self.config = config
        self.mode = mode
        self.codec = get_codec(config.quant, config.dim)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._last_change: dict[int, int] = {}  # writer: last change id per shard (loaded lazily)
        self._feed: FeedWriter | None = None  # writer: opened by the first changelog write
        self._closed = False

    # ------------------------------------------------------------------ primitives
    @abc.abstractmethod
    def _multi_get(self, shard: int, keys: list[bytes]) -> list[bytes | None]:
        """Values of ``keys`` in ``shard`` (None where absent), in order."""

    @abc.abstractmethod
    def _write_batch(self, shard: int, keys: list[bytes], values: list[bytes], sync: bool,
                     wal: bool = True) -> None:
        """Put all pairs into ``shard`` in ONE atomic batch."""

    @abc.abstractmethod
    def _sst_writer_factory(self) -> WriterFactory:
        """A picklable ``(shard, path) -> SstWriter`` (it may run in a worker process)."""

    @abc.abstractmethod
    def _ingest(self, shard: int, paths: list[str]) -> None:
        """Move the finished SST files at ``paths`` into ``shard``."""

    @abc.abstractmethod
    def _iter_row_keys(self, shard: int) -> Iterable[bytes]:
        """Every row key of ``shard`` (no meta keys), ascending."""

    @abc.abstractmethod
    def _shard_info(self, shard: int) -> dict[str, Any]:
        """Backend figures for ``shard`` (at least ``bytes_on_disk``, ``estimated_keys``)."""

    @abc.abstractmethod
    def _catch_up(self, shard: int) -> None:
        """Follow mode: make ``shard`` see what its primary has written."""

    @abc.abstractmethod
    def _flush(self, shard: int) -> None:
        """Persist ``shard``'s memtable."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release the backend."""

    def _iter_items(self, shard: int, lower: bytes, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """At most ``limit`` pairs of ``shard`` with ``lower <= key < upper``, ascending."""
        raise NotImplementedError(f"backend {self.backend!r} has no range iteration (change log)")

    def _delete_range(self, shard: int, begin: bytes, end: bytes) -> None:
        """Delete the keys of ``shard`` in ``[begin, end)``."""
        raise NotImplementedError(f"backend {self.backend!r} has no range deletion (change log)")

    def _seek_first(self, shard: int, lowers: list[bytes]) -> list[tuple[bytes, bytes] | None]:
        """For each key in ``lowers``: the first pair of ``shard`` with ``key >= lower`` (None past the
        end), read from the files without filling the block cache; StoreReadError if a read fails."""
        raise NotImplementedError(f"backend {self.backend!r} has no seek (verification)")

    # ------------------------------------------------------------------ reads
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
        """Like :meth:`read`, plus counts for metrics (rows, unique rows, rows found)."""
        self._check_open()
        shape = np.shape(rows)
        t, r = as_key_arrays(table_ids, rows, allow_nd=True)
        ut, ur, inv = unique_keys(t, r)
        vec, w, found = self._read_keys(ut, ur)
        return ReadResult(
            vec[inv].reshape(shape + (self.config.dim,)),
            w[inv].reshape(shape),
            len(r),
            len(ur),
            int(found.sum()),
        )

    def read_unique(self, table_ids, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """No de-duplication (for callers that already did it): ``(vectors,
        first_order, found bool [K])`` in input order."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        return self._read_keys(t, r)

    def _read_keys(self, t: np.ndarray, r: np.ndarray):
        n, dim, rb = len(r), self.config.dim, self.codec.record_bytes
        vec = np.zeros((n, dim), dtype=np.float32)
        w = np.zeros(n, dtype=np.float32)
        found = np.zeros(n, dtype=bool)
        if n == 0:
            return vec, w, found
        groups = self._group_by_shard(shard_of(t, r, self.config.shards))
        order = np.concatenate([idx for _, idx in groups])
        keys = key_list(key_array(t[order], r[order]))
        jobs, start = [], 0
        for s, idx in groups:
            jobs.append((s, keys[start : start + len(idx)]))
            start += len(idx)
        if len(jobs) == 1 or self.config.read_threads == 1:
            results = [self._multi_get(s, k) for s, k in jobs]
        else:
            results = list(self._executor().map(lambda job: self._multi_get(*job), jobs))
        values = [v for res in results for v in res]
        n_missing = values.count(None)
        if n_missing == 0:
            hit_pos = order
        else:
            hit_pos = order[np.array(values, dtype=object) != None]  # noqa: E711 (elementwise)
        if len(hit_pos) == 0:
            return vec, w, found
        buf = b"".join(v for v in values if v is not None)
        if len(buf) != rb * len(hit_pos):
            raise StoreReadError(
                f"store {self.path!r} holds records whose size is not {rb} bytes "
                f"({self.config.quant}, dim {dim}): wrong config or corrupt store", "bad record size"
            )
        dv, dw = self.codec.decode(np.frombuffer(buf, dtype=np.uint8).reshape(-1, rb))
        vec[hit_pos] = dv
        w[hit_pos] = dw
        found[hit_pos] = True
        return vec, w, found

    def verify_sample(self, table_rows: dict[int, int], max_reads: int = 4096) -> dict[str, int]:
        """Read real rows of every table from every shard, spread so that a small store has every
        data block read and a big one a sample of at most ~``max_reads`` seeks (``embstore.verify``);
        the block cache is left as it was. ``table_rows``: table id -> rows (all of ``0..rows-1``
        are in the store, as after an export). Raises StoreReadError on a read that fails (RocksDB
        checks each block's checksum), a record of the wrong size or with a non-finite value, or a
        shard that holds no row of a table it must hold rows of. Returns ``{"seeks", "rows_read"}``."""
        self._check_open()
        rb, shards = self.codec.record_bytes, self.config.shards
        plan = seek_rows(table_rows, shards, rb, self.config.block_size_kb << 10, max_reads)
        seeks = rows_read = 0
        for s in range(shards):
            for t, rows in plan.items():
                upper = key_list(key_array(np.array([t], np.int64), np.array([table_rows[t]], np.int64)))[0]
                found = self._seek_first(s, key_list(key_array(np.full(len(rows), t, np.int64), rows)))
                seeks += len(rows)
                values = [v for kv in found if kv is not None and kv[0] < upper for v in kv[1:]]
                if not values:
                    if expect_rows_in_every_shard(int(table_rows[t]), shards):
                        raise StoreReadError(f"store {self.path!r}: shard {s} holds no row of table {t} "
                                             f"({table_rows[t]} rows over {shards} shards): missing data",
                                             f"shard {s} misses table {t}")
                    continue
                if any(len(v) != rb for v in values):
                    raise StoreReadError(f"store {self.path!r}: shard {s}, table {t}: a record is not "
                                         f"{rb} bytes ({self.config.quant}, dim {self.config.dim})",
                                         "bad record size")
                vec, w = self.codec.decode(np.frombuffer(b"".join(values), np.uint8).reshape(-1, rb))
                if not (np.isfinite(vec).all() and np.isfinite(w).all()):
                    raise StoreReadError(f"store {self.path!r}: shard {s}, table {t}: non-finite values",
                                         "non-finite values")
                rows_read += len(values)
        return {"seeks": seeks, "rows_read": rows_read}

    # ------------------------------------------------------------------ writes
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
        changelog: bool = False,
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

        ``changelog``: each shard's batch also appends one change-log record listing
        the keys it applied (see :meth:`changes_since`), and the applied rows of all
        shards go, as ONE batch, to the store's write feed (``embstore.feed``) before
        the first shard batch is written, each shard's rows made visible there once the
        store holds them: followers serve fresh rows from the feed, so a writer feeding
        followers must set it on every write.

        ``meta`` records (small ``bytes -> bytes``, kept in the meta key space, see
        :meth:`get_meta`) go into the SAME atomic batch of the shards named by
        ``meta_shards``: ``"all"`` (every shard, even one without rows: each shard
        then records how far it got), ``"touched"`` (shards that got rows) or a shard
        index.

        A ``ValueError`` (bad arguments or values, e.g. one the record format cannot hold)
        is raised before anything is written; an ``OSError`` (disk full, I/O) may come after
        some shards' batches were written (each shard's batch is atomic).

        ``durability``: ``"wal"`` (default) logs each batch to the write-ahead log
        (``sync`` fsyncs it). ``"flush"`` skips the WAL and flushes the written shards'
        memtables into SST files before returning: as durable and as atomic per shard
        (a flush installs its SST in one MANIFEST edit; a crash before it loses the
        whole batch, its meta records included), and far cheaper for followers: a
        RocksDB secondary then picks up new SST files instead of replaying the WAL in
        ``try_catch_up_with_primary``, which holds the follower's GIL (measured here at
        200k rows/s: catch-up median 214 -> 25 ms, follower stalls p99 48 -> 9 ms).
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
        if not isinstance(changelog, bool):
            raise ValueError(f"changelog must be a bool, got {changelog!r}")
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
            # shard's rows published once the store holds them: embstore.feed)
            plans: list[tuple[int, list[bytes], list[bytes], int | None, int]] = []
            fed_keys: list[bytes] = []
            fed_records: list[np.ndarray] = []
            fed_span: dict[int, tuple[int, int]] = {}  # shard -> its rows in the feed batch
            fed_rows = 0
            for s in sorted(set(rows_by_shard) | meta_targets):
                keys: list[bytes] = []
                values: list[bytes] = []
                change_id = None
                idx = rows_by_shard.get(s)
                if idx is not None:
                    ka = key_array(t[idx], r[idx])
                    if sq is not None:
                        sk = seq_key_list(ka)
                        fresh = sq[idx] > decode_seqs(self._multi_get(s, sk))
                        skipped += len(idx) - int(fresh.sum())
                        if not fresh.all():
                            idx, ka = idx[fresh], ka[fresh]
                            sk = [k for k, f in zip(sk, fresh.tolist()) if f]
                        keys += sk
                        values += seq_value_list(sq[idx])
                    if len(idx):
                        keys += key_list(ka)
                        values += _record_list(records[idx])
                        if changelog:
                            change_id = self._last_change_id_w(s) + 1
                            keys += [change_key(change_id), LAST_CHANGE_KEY]
                            values += [ka.tobytes(), encode_change_id(change_id)]
                            fed_keys.append(ka.tobytes())
                            fed_records.append(records[idx])
                            fed_span[s] = (fed_rows, fed_rows + len(idx))
                            fed_rows += len(idx)
                if s in meta_targets:
                    keys += [k for k, _ in meta_items]
                    values += [v for _, v in meta_items]
                if keys:
                    plans.append((s, keys, values, change_id, 0 if idx is None else len(idx)))
            staged = self._feed_writer().stage(b"".join(fed_keys), np.concatenate(fed_records)) if fed_keys else None
            written: list[int] = []
            for s, keys, values, change_id, n_rows in plans:
                self._write_batch(s, keys, values, sync and wal, wal)
                written.append(s)
                if change_id is not None:
                    self._last_change[s] = change_id
                applied += n_rows
                if wal and staged is not None and s in fed_span:
                    staged.publish(*fed_span[s])  # in the WAL: survives a crash of this process
            if not wal:
                for s in written:
                    self._flush(s)
                    if staged is not None and s in fed_span:
                        staged.publish(*fed_span[s])  # in an SST: durable
        return WriteResult(applied, skipped)

    def row_seqs(self, table_ids, rows) -> np.ndarray:
        """Stored sequence numbers of ``(table_ids[i], rows[i])`` (int64 [K]; -1 where
        none is stored). One ``multi_get`` per shard."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        out = np.full(len(r), -1, dtype=np.int64)
        if len(r) == 0:
            return out
        for s, idx in self._group_by_shard(shard_of(t, r, self.config.shards)):
            out[idx] = decode_seqs(self._multi_get(s, seq_key_list(key_array(t[idx], r[idx]))))
        return out

    # ------------------------------------------------------------------ change log
    def last_change_id(self, shard: int) -> int:
        """Id of ``shard``'s newest change-log record (0 if none was ever written)."""
        self._check_open()
        return decode_change_id(self._multi_get(self._check_shard(shard), [LAST_CHANGE_KEY])[0])

    def oldest_change_id(self, shard: int) -> int:
        """Id of ``shard``'s oldest change-log record still kept (0 if none). A reader
        whose last seen id is below ``oldest_change_id - 1`` missed trimmed changes."""
        self._check_open()
        items = self._iter_items(self._check_shard(shard), change_key(0), CHANGE_END, 1)
        return change_id_of(items[0][0]) if items else 0

    def changes_since(self, shard: int, after: int, *, max_records: int = 100_000):
        """Keys changed in ``shard`` by change-log records with id > ``after``.

        Returns ``(newest id read, table_ids uint32 [K], rows int64 [K])``; the newest id
        is ``after`` when there is nothing newer. At most ``max_records`` records are read
        (continue from the returned id). Keys may repeat across records. Change ids of a
        shard are consecutive (1, 2, ...), so records were trimmed before they were read
        when ``oldest_change_id(shard) > after + 1``.
        """
        self._check_open()
        s = self._check_shard(shard)
        if isinstance(after, bool) or not isinstance(after, (int, np.integer)) or after < 0:
            raise ValueError(f"after must be an int >= 0, got {after!r}")
        if isinstance(max_records, bool) or not isinstance(max_records, (int, np.integer)) or max_records < 1:
            raise ValueError(f"max_records must be an int >= 1, got {max_records!r}")
        items = self._iter_items(s, change_key(int(after) + 1), CHANGE_END, int(max_records))
        if not items:
            return int(after), np.zeros(0, np.uint32), np.zeros(0, np.int64)
        tids, rows = decode_change_keys([v for _, v in items])
        return change_id_of(items[-1][0]), tids, rows

    def trim_changelog(self, keep: int = 100_000) -> None:
        """Delete each shard's change-log records but its newest ``keep`` (writer only)."""
        self._check_writable()
        if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 0:
            raise ValueError(f"keep must be an int >= 0, got {keep!r}")
        with self._write_lock:
            for s in range(self.config.shards):
                upto = self._last_change_id_w(s) - int(keep)  # delete ids <= upto
                if upto > 0:
                    self._delete_range(s, change_key(0), change_key(upto + 1))

    def _feed_writer(self) -> FeedWriter:
        if self._feed is None:
            self._feed = FeedWriter(self.path, self.codec.record_bytes)
        return self._feed

    def feed_reader(self) -> FeedReader:
        """The write feed of this store, for a follower (see ``embstore.feed``)."""
        self._check_open()
        return FeedReader(self.path, self.codec.record_bytes)

    def _last_change_id_w(self, shard: int) -> int:
        if shard not in self._last_change:
            self._last_change[shard] = self.last_change_id(shard)
        return self._last_change[shard]

    def put_meta(self, key: bytes, value: bytes, shard: int | None = None) -> None:
        """Put one meta record in ``shard`` (every shard if None)."""
        self._check_writable()
        ((k, v),) = self._meta_items({key: value})
        shards = range(self.config.shards) if shard is None else [self._check_shard(shard)]
        for s in shards:
            self._write_batch(s, [k], [v], False)

    def get_meta(self, key: bytes, shard: int = 0) -> bytes | None:
        """The meta record ``key`` of ``shard`` (None if absent)."""
        self._check_open()
        ((k, _),) = self._meta_items({key: b""})
        return self._multi_get(self._check_shard(shard), [k])[0]

    def get_meta_per_shard(self, key: bytes) -> list[bytes | None]:
        """The meta record ``key`` of every shard, by shard index."""
        self._check_open()
        ((k, _),) = self._meta_items({key: b""})
        return [self._multi_get(s, [k])[0] for s in range(self.config.shards)]

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
        return self.bulk_load_tables([(table_id, chunks)], total_rows=total_rows, progress=progress,
                                     tmp_dir=tmp_dir, workers=workers)[0]

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
        if workers is None:
            big = total_rows is not None and total_rows >= (1 << 21)
            workers = min(4, os.cpu_count() or 1, self.config.shards) if big else 1
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        S = self.config.shards
        tmp = tempfile.mkdtemp(prefix=".ingest-", dir=tmp_dir or self.path)
        bar = None
        if progress is True:
            from tqdm import tqdm

            bar = tqdm(total=total_rows, unit="rows", unit_scale=True, desc="bulk load")
        done_all, loaded = 0, []
        last_key = (-1, -1)
        runs = None
        try:
            runs = SstRuns(self._sst_writer_factory(), self._ingest, tmp, workers)
            for table_id, chunks in tables:
                if isinstance(table_id, bool) or not isinstance(table_id, (int, np.integer)):
                    raise ValueError(f"table_id must be an int, got {table_id!r}")
                if not 0 <= int(table_id) <= MAX_TABLE_ID:
                    raise ValueError(f"table_id must be in [0, {MAX_TABLE_ID}], got {table_id}")
                table_id = int(table_id)
                done = 0
                for chunk in chunks:
                    rows, records = self._prepare_chunk(chunk)
                    if len(rows) == 0:
                        continue
                    if (table_id, int(rows[0])) <= last_key:
                        runs.finish_and_ingest()
                    shard = shard_of(np.uint64(table_id), rows, S)
                    order = np.argsort(shard, kind="stable")  # rows stay ascending per shard
                    counts = np.bincount(shard, minlength=S)
                    ends = np.cumsum(counts)
                    slices = [(s, int(ends[s] - counts[s]), int(ends[s])) for s in range(S) if counts[s]]
                    keys = key_array(np.full(len(rows), table_id, dtype=np.uint32), rows[order])
                    runs.add(slices, keys, records[order])
                    last_key = (table_id, int(rows[-1]))
                    done += len(rows)
                    done_all += len(rows)
                    if bar is not None:
                        bar.update(len(rows))
                    elif callable(progress):
                        progress(done_all)
                loaded.append(done)
            runs.finish_and_ingest()
        finally:
            if runs is not None:
                runs.close()
            if bar is not None:
                bar.close()
            shutil.rmtree(tmp, ignore_errors=True)
        return loaded

    def _prepare_chunk(self, chunk) -> tuple[np.ndarray, np.ndarray]:
        try:
            rows, vectors, first_order = chunk
        except (TypeError, ValueError):
            raise ValueError("each bulk_load chunk must be (rows, vectors, first_order)") from None
        _, r = as_key_arrays(0, rows)
        records = self.codec.encode(vectors, first_order)
        if len(records) != len(r):
            raise ValueError(f"chunk has {len(r)} rows but {len(records)} vectors")
        if len(r) > 1 and not (r[1:] > r[:-1]).all():
            order = np.argsort(r, kind="stable")
            r, records = r[order], records[order]
            keep = np.append(r[1:] != r[:-1], True)  # last duplicate wins
            r, records = r[keep], records[keep]
        return r, records

    # ------------------------------------------------------------------ admin
    def catch_up(self, shard: int | None = None) -> None:
        """Follow mode: see rows the live writer process has written since the last
        call, in every shard or in ``shard`` only (about a few ms for all shards, and
        RocksDB holds the GIL meanwhile: call it from a background thread, shard by
        shard, never per request)."""
        self._check_open()
        if self.mode != "follow":
            raise ValueError(f"catch_up needs a store opened with mode='follow', not {self.mode!r}")
        for s in range(self.config.shards) if shard is None else [self._check_shard(shard)]:
            self._catch_up(s)

    def flush(self) -> None:
        """Write mode: persist memtables to SST files."""
        self._check_writable()
        for s in range(self.config.shards):
            self._flush(s)

    def stats(self, exact: bool = False) -> dict[str, Any]:
        """Sizes and counts. ``rows_per_table`` (table id -> rows) is exact and scans
        every key when ``exact``; otherwise only RocksDB's estimate of keys is given."""
        self._check_open()
        shards = [{"shard": s, **self._shard_info(s)} for s in range(self.config.shards)]
        out: dict[str, Any] = {
            "backend": self.backend,
            "path": self.path,
            "mode": self.mode,
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
                for tid, c in _count_tables(self._iter_row_keys(s)).items():
                    counts[tid] = counts.get(tid, 0) + c
            out["rows_per_table"] = dict(sorted(counts.items()))
        return out

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
        self._close()

    def __enter__(self) -> "EmbeddingStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.path!r}, mode={self.mode!r}, "
            f"quant={self.config.quant!r}, dim={self.config.dim}, shards={self.config.shards})"
        )

    # ------------------------------------------------------------------ helpers
    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.config.read_threads, thread_name_prefix="embstore-read"
                    )
        return self._pool

    def _group_by_shard(self, shard: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``[(shard, indices in input order)]`` for the shards that occur."""
        if self.config.shards == 1:
            return [(0, np.arange(len(shard)))]
        order = np.argsort(shard, kind="stable")
        counts = np.bincount(shard, minlength=self.config.shards)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return [
            (s, order[bounds[s] : bounds[s + 1]]) for s in range(self.config.shards) if counts[s]
        ]

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

    def _check_shard(self, shard: Any) -> int:
        if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)):
            raise ValueError(f"shard must be an int, 'all' or 'touched', got {shard!r}")
        if not 0 <= int(shard) < self.config.shards:
            raise ValueError(f"shard must be in [0, {self.config.shards}), got {shard}")
        return int(shard)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self.path!r} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.mode != "w":
            raise ValueError(
                f"store {self.path!r} is open with mode={self.mode!r} (read-only); "
                "open it with mode='w' to write"
            )


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

"""RocksDB backend (``backend.StoreBackend`` over rocksdict, raw mode): shard ``s`` is the DB at
``<store>/shard-<s:03d>``.

Modes: ``w`` read-write (the one writer process), ``r`` read-only (a snapshot as of
open), ``follow`` a RocksDB *secondary* instance that sees a live writer's rows after
:meth:`_catch_up` (``try_catch_up_with_primary``). This module implements the backend interface only;
the store over it is ``base.EmbeddingStore``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rocksdict import (
    AccessType,
    Cache,
    IngestExternalFileOptions,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

from offgraph.store.backend import StoreBackend
from offgraph.store.config import StoreConfig
from offgraph.store.errors import StoreReadError
from offgraph.store.keys import META_PREFIX, check_shard
from offgraph.store.rocksdb_options import direct_io_refused, make_cache, make_options, reads_direct
from offgraph.store.sst_run import SstWriter

log = logging.getLogger("offgraph.store")


def shard_dir(path: str, shard: int) -> str:
    return os.path.join(path, f"shard-{shard:03d}")


_ERRNO_WORDS = (
    ("No space left", errno.ENOSPC),
    ("Read-only file system", errno.EROFS),
    ("Permission denied", errno.EACCES),
    ("Disk quota exceeded", errno.EDQUOT),
)
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def io_error(what: str, path: str, e: Exception | str) -> OSError:
    """rocksdict's plain ``Exception`` of a failed open/write/flush/close as an OSError naming
    the shard, with the errno its message names (ENOSPC when the disk is full, EROFS on a
    read-only mount, EIO otherwise), so callers can tell it from bad input."""
    msg = str(e)
    m = _OS_ERROR.search(msg)
    code = int(m[1]) if m else next((c for words, c in _ERRNO_WORDS if words in msg), errno.EIO)
    return OSError(code, f"RocksDB {what} failed in {path}: {msg}")


# How often a flush that has not finished checks whether its shard's background work failed, and
# how long a write stalled by RocksDB (too many L0 files or memtables) waits between attempts.
FLUSH_CHECK_S = 0.25
STALL_RETRY_S = (0.001, 0.05)

# Handles of stores whose background work failed: never closed nor freed (see _abandon).
_ABANDONED: list = []


def _last_background_error(shard_path: str) -> str | None:
    """The last background error RocksDB logged in the shard's LOG (it names the file and the
    cause, e.g. "No space left on device"), or None."""
    try:
        with open(os.path.join(shard_path, "LOG"), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (256 << 10)))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    found = re.findall(r"(?:Background IO error|Compaction error:|Flush error:?) (.*?)(?:, reason \d+)?$", tail, re.M)
    return found[-1].strip() if found else None


class _RocksSstWriter(SstWriter):
    def __init__(self, options, path: str) -> None:
        self._w = SstFileWriter(options)
        self._w.open(path)
        self._options = options  # must outlive the writer

    def add(self, keys: list[bytes], values: list[bytes]) -> None:
        w = self._w
        for k, v in zip(keys, values):
            w[k] = v

    def finish(self) -> None:
        self._w.finish()


class RocksDBBackend(StoreBackend):
    """The ``"rocksdb"`` backend: one RocksDB per shard, one block cache shared by all."""

    backend = "rocksdb"

    def _open(self, *, secondary_dir: str | None = None) -> None:
        config, mode = self.config, self.mode
        self._cache = make_cache(config)
        direct = True
        if config.direct_reads or config.direct_flush_and_compaction:
            refused = direct_io_refused(self.path)
            if refused is not None:
                log.warning(
                    "store %s: its filesystem refuses O_DIRECT (%s): read and written through "
                    "the page cache (buffered)",
                    self.path,
                    refused,
                )
                direct = False
        self.io_mode = "direct" if direct and config.direct_reads else "buffered"
        """How table files are read: ``"direct"`` (O_DIRECT, past the page cache) or ``"buffered"``."""
        self._opts = make_options(config, self._cache, direct=direct)
        self._own_secondary = False
        self._secondary_dir = None
        if mode == "follow":
            if secondary_dir is None:
                secondary_dir = tempfile.mkdtemp(prefix="offgraph-store-follow-")
                self._own_secondary = True
            self._secondary_dir = os.fspath(secondary_dir)
            os.makedirs(self._secondary_dir, exist_ok=True)
        self._dbs: list[Rdict] = []
        self._failed: OSError | None = None  # mode w: the I/O error that stopped its writes (see _abandon)
        # follow mode: which primary MANIFEST each shard's secondary follows (CURRENT's
        # content), how many times it was reopened, and the instance it replaced last
        self._current: list[str | None] = []
        self._generation = [0] * config.shards
        self._retired: dict[int, Rdict] = {}
        self.reopens = 0  # follow mode: secondaries reopened after a writer restart
        self._seen: dict[int, tuple] = {}  # follow mode: the shard's files at its last catch-up
        self.catch_ups_skipped = 0
        try:
            for s in range(config.shards):
                self._current.append(self._read_current(s))
                self._dbs.append(self._open_shard(s))
        except BaseException:
            self._close()
            raise

    def _open_shard(self, s: int) -> Rdict:
        d = shard_dir(self.path, s)
        if self.mode == "w":
            access = AccessType.read_write()
        else:
            if not os.path.isdir(d):
                raise ValueError(f"store {self.path!r} has no shard directory {d!r}")
            if self.mode == "r":
                access = AccessType.read_only(False)
            else:
                access = AccessType.secondary(os.path.join(self._secondary_dir, f"shard-{s:03d}-{self._generation[s]}"))
        try:
            return Rdict(d, self._opts, column_families={"default": self._opts}, access_type=access)
        except Exception as e:  # rocksdict raises plain Exception
            # e.g. no space for a new MANIFEST or LOG, a read-only mount ("(os error 30)"): say so
            if str(e).startswith("IO error") or _OS_ERROR.search(str(e)):
                raise io_error(f"open (mode={self.mode!r})", d, e) from None
            raise RuntimeError(f"cannot open shard {d!r} with mode={self.mode!r}: {e}") from e

    # primitives
    def _multi_get(self, shard: int, keys: list[bytes]) -> list[bytes | None]:
        try:
            return self._dbs[shard].get(keys)
        except Exception as e:  # rocksdict raises plain Exception: a corrupt block, an I/O error
            raise _read_error(shard, e) from e

    def _seek_first(self, shard: int, lowers: list[bytes]) -> list[tuple[bytes, bytes] | None]:
        ro = ReadOptions()
        ro.fill_cache(False)
        out: list[tuple[bytes, bytes] | None] = []
        try:
            it = self._dbs[shard].iter(ro)
            for lower in lowers:
                it.seek(lower)
                if it.valid():
                    out.append((it.key(), it.value()))
                else:
                    it.status()  # raises if the seek stopped on an error, not at the end
                    out.append(None)
        except Exception as e:  # noqa: BLE001 - rocksdict raises plain Exception
            raise _read_error(shard, e) from e
        finally:
            it = None
        return out

    def _write_batch(self, shard: int, keys: list[bytes], values: list[bytes], sync: bool, wal: bool = True) -> None:
        self._check_healthy(shard, "write")
        wb = WriteBatch(raw_mode=True)
        deque(map(wb.put, keys, values), maxlen=0)  # rocksdict has no batched put: map runs the loop in C
        wo = WriteOptions()
        wo.sync = sync
        wo.disable_wal = not wal
        # rocksdict holds the GIL in write(): a write RocksDB stalls (too many L0 files or memtables)
        # would wait there, for good if the compaction it waits for cannot run on a full disk, with
        # no signal handled meanwhile. So it fails at once (no_slowdown) and is retried from here,
        # sleeping without the GIL, until the stall ends or the shard's background work fails.
        wo.no_slowdown = True
        pause = STALL_RETRY_S[0]
        while True:
            try:
                self._dbs[shard].write(wb, wo)
                return
            except Exception as e:  # rocksdict raises plain Exception
                if not str(e).startswith("Incomplete"):
                    raise self._fail(io_error("write", shard_dir(self.path, shard), e)) from None
            self._check_healthy(shard, "write")
            time.sleep(pause)
            pause = min(2 * pause, STALL_RETRY_S[1])
            wb = WriteBatch(raw_mode=True)  # write() consumed it
            deque(map(wb.put, keys, values), maxlen=0)

    def _check_healthy(self, shard: int, what: str) -> None:
        """Raise the OSError that stopped this store's writes, or the one its RocksDB logged if the
        shard's background work (a flush, a compaction) failed: RocksDB then retries it until space
        is freed, and a flush or a stalled write waits for that (it never came back on a full disk)."""
        if self._failed is not None:
            raise self._failed
        if self._dbs[shard].property_int_value("rocksdb.background-errors"):
            d = shard_dir(self.path, shard)
            cause = _last_background_error(d) or "a background flush or compaction failed"
            raise self._fail(io_error(what, d, f"{cause} (background work failed)"))

    def _fail(self, e: OSError) -> OSError:
        """Remember ``e``: the store takes no more writes, and its close does not flush."""
        if self.mode == "w" and self._failed is None:
            self._failed = e
        return e

    def _sst_writer_factory(self):
        return functools.partial(_make_sst_writer, self.config)

    def _ingest(self, shard: int, paths: list[str]) -> None:
        opts = IngestExternalFileOptions()
        opts.set_move_files(True)
        self._dbs[shard].ingest_external_file(paths, opts)

    def _iter_row_keys(self, shard: int) -> Iterable[bytes]:
        ro = ReadOptions()
        ro.set_iterate_upper_bound(META_PREFIX)
        return self._dbs[shard].keys(read_opt=ro)

    def _iter_values(self, shard: int, lower: bytes, upper: bytes) -> Iterable[bytes]:
        ro = ReadOptions()
        ro.fill_cache(False)
        ro.set_iterate_lower_bound(lower)
        ro.set_iterate_upper_bound(upper)
        return self._dbs[shard].values(from_key=lower, read_opt=ro)

    def _shard_info(self, shard: int) -> dict[str, Any]:
        db = self._dbs[shard]
        return {
            "bytes_on_disk": _dir_bytes(shard_dir(self.path, shard)),
            "sst_bytes": int(db.property_int_value("rocksdb.total-sst-files-size") or 0),
            "estimated_keys": int(db.property_int_value("rocksdb.estimate-num-keys") or 0),
        }

    def _read_current(self, shard: int) -> str | None:
        try:
            with open(os.path.join(shard_dir(self.path, shard), "CURRENT")) as f:
                return f.read().strip()
        except OSError:
            return None

    def _files_signature(self, shard: int) -> tuple:
        """Names, sizes and mtimes of the shard's WAL, MANIFEST and CURRENT files, and the
        number of files: every write of the primary changes it (a WAL append, or a flushed
        SST file + a MANIFEST edit), so an unchanged signature means nothing to catch up."""
        sig = []
        n = 0
        with os.scandir(shard_dir(self.path, shard)) as it:
            for e in it:
                n += 1
                if e.name.endswith(".log") or e.name.startswith(("MANIFEST", "CURRENT")):
                    st = e.stat()
                    sig.append((e.name, st.st_size, st.st_mtime_ns))
        return n, tuple(sorted(sig))

    def _catch_up(self, shard: int) -> None:
        """Follow the primary. When the primary process reopened the shard (a restarted
        writer: CURRENT names a new MANIFEST), ``try_catch_up_with_primary`` on the old
        secondary can stay behind for good (seen here: rows written after a writer
        restart never became visible), so the shard's secondary is opened afresh instead.
        The replaced instance stays open until the next reopen: readers may hold it."""
        current = self._read_current(shard)
        if self.mode == "follow" and current is not None and current != self._current[shard]:
            self._generation[shard] += 1
            fresh = self._open_shard(shard)
            old = self._retired.pop(shard, None)
            self._retired[shard], self._dbs[shard] = self._dbs[shard], fresh
            self._current[shard] = current
            if old is not None:
                old.close()
            self.reopens += 1
        # try_catch_up_with_primary holds the GIL even with nothing new (its cost:
        # bench/results/update-freshness/README.md): skip it when the primary's files did not
        # change since the last one
        try:
            sig = self._files_signature(shard)
        except OSError:
            sig = None
        if sig is not None and self._seen.get(shard) == sig:
            self.catch_ups_skipped += 1
            return
        self._dbs[shard].try_catch_up_with_primary()
        if sig is not None:
            self._seen[shard] = sig

    def _flush(self, shard: int) -> None:
        """Flush ``shard``'s memtable, in a helper thread watched from here: a flush waits while
        writes would stall, which lasts for good once a compaction failed on a full disk (the
        shard's background error is seen here within FLUSH_CHECK_S; that flush stays behind)."""
        self._check_healthy(shard, "flush")
        failed: list[Exception] = []

        def flush() -> None:
            try:
                db.flush(True)  # rocksdict releases the GIL meanwhile
            except Exception as e:  # rocksdict raises plain Exception
                failed.append(e)

        db = self._dbs[shard]
        # a daemon thread: one stuck in a flush does not hold up the interpreter's exit
        t = threading.Thread(target=flush, name=f"store-flush-{shard}", daemon=True)
        t.start()
        while t.is_alive():
            t.join(FLUSH_CHECK_S)
            if t.is_alive():
                self._check_healthy(shard, "flush")
        if failed:
            raise self._fail(io_error("flush", shard_dir(self.path, shard), failed[0])) from None

    def _close(self) -> None:
        if self._failed is None and self.mode == "w":
            for s in range(len(self._dbs)):
                try:
                    self._check_healthy(s, "close")
                except OSError:
                    break
        if self._failed is not None:
            self._abandon()
            return
        first: OSError | None = None
        for db in list(self._dbs) + list(self._retired.values()):
            try:
                db.close()
            except Exception as e:  # close every shard even if one fails (e.g. disk full)
                first = first or io_error("close", self.path, e)
        self._dbs = []
        self._retired = {}
        if self._own_secondary and self._secondary_dir:
            shutil.rmtree(self._secondary_dir, ignore_errors=True)
        if first is not None:
            raise first

    def _abandon(self) -> None:
        """Close a store whose writes failed without closing RocksDB: rocksdict flushes the memtable
        on close and when a handle is freed, and that flush waits for the failed background work
        (forever on a full disk). Its handles are kept, never freed, until the process exits; the
        shards are left as a kill -9 leaves them, which loses nothing acknowledged (each write is
        atomic per shard, and its rows are in the WAL or an SST file before it returns)."""
        for db in list(self._dbs) + list(self._retired.values()):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(db))  # not freed even at interpreter exit
            _ABANDONED.append(db)
        self._dbs = []
        self._retired = {}

    def cache_usage(self) -> int:
        """Bytes now held by the shared block cache."""
        return self._cache.get_usage()

    def set_cache_mb(self, mb: int) -> None:
        """The shared block cache's capacity (RocksDB evicts down to it as blocks are released)."""
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise ValueError(f"mb must be an int >= 1, got {mb!r}")
        self._cache.set_capacity(mb << 20)

    def block_cache_stats(self) -> dict[str, int] | None:
        """Block-cache ``hits`` and ``misses`` (data, index and filter blocks) over all shards since
        the store opened; None unless opened with ``StoreConfig.statistics``."""
        text = self._opts.get_statistics() if self.config.statistics else None
        if not text:
            return None
        got = dict(_BLOCK_CACHE_STAT.findall(text))
        return {"hits": int(got.get("hit", 0)), "misses": int(got.get("miss", 0))}

    @classmethod
    def data_files(cls, store_dir: str | os.PathLike) -> list[Path]:
        """The shards' table files (``shard-*/*.sst``)."""
        return [p for p in Path(store_dir).glob("shard-*/*.sst") if p.is_file()]

    @classmethod
    def reads_direct(cls, store_dir: str | os.PathLike, config: StoreConfig) -> bool:
        return reads_direct(os.fspath(store_dir), config)

    # backend-specific
    def property_value(self, shard: int, name: str) -> str | None:
        """A RocksDB property of ``shard`` (e.g. ``rocksdb.block-cache-capacity``)."""
        return self._dbs[check_shard(shard, self.config.shards)].property_value(name)


_BLOCK_CACHE_STAT = re.compile(r"^rocksdb\.block\.cache\.(hit|miss) COUNT : (\d+)$", re.M)


def _read_error(shard: int, e: Exception) -> StoreReadError:
    """RocksDB's status message (it names the file) as a StoreReadError; ``kind`` is its first words
    (``Corruption``, ``IO error``...), which carry no path."""
    msg = str(e)
    kind = msg.split(":", 1)[0].strip()[:40] if ":" in msg else type(e).__name__
    return StoreReadError(f"shard {shard}: {msg}", kind or "read error")


def _make_sst_writer(config: StoreConfig, shard: int, path: str) -> SstWriter:
    """An SST writer with exactly the store's table options (bloom filter, partitioned
    index, block size, compression); picklable for worker processes."""
    return _RocksSstWriter(make_options(config, Cache(1 << 20), bulk_load=True), path)


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total

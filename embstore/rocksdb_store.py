"""RocksDB backend (rocksdict, raw mode): shard ``s`` is the DB at ``<store>/shard-<s:03d>``.

Modes: ``w`` read-write (the one writer process), ``r`` read-only (a snapshot as of
open), ``follow`` a RocksDB *secondary* instance that sees a live writer's rows after
:meth:`catch_up` (``try_catch_up_with_primary``).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import tempfile
from collections import deque
from typing import Any, Iterable

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

from .base import EmbeddingStore
from .errors import StoreReadError
from .sst_run import SstWriter
from .config import StoreConfig
from .keys import META_PREFIX
from .rocksdb_options import make_cache, make_options


def shard_dir(path: str, shard: int) -> str:
    return os.path.join(path, f"shard-{shard:03d}")


def io_error(what: str, path: str, e: Exception) -> OSError:
    """rocksdict's plain ``Exception`` of a failed write/flush/close as an OSError naming
    the shard (ENOSPC when the disk is full), so callers can tell it from bad input."""
    msg = str(e)
    code = errno.ENOSPC if "No space left" in msg else errno.EIO
    return OSError(code, f"RocksDB {what} failed in {path}: {msg}")


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


class RocksDBStore(EmbeddingStore):
    backend = "rocksdb"

    def __init__(
        self, path: str, config: StoreConfig, mode: str, *, secondary_dir: str | None = None
    ) -> None:
        super().__init__(path, config, mode)
        self._cache = make_cache(config)
        self._opts = make_options(config, self._cache)
        self._own_secondary = False
        self._secondary_dir = None
        if mode == "follow":
            if secondary_dir is None:
                secondary_dir = tempfile.mkdtemp(prefix="embstore-follow-")
                self._own_secondary = True
            self._secondary_dir = os.fspath(secondary_dir)
            os.makedirs(self._secondary_dir, exist_ok=True)
        self._dbs: list[Rdict] = []
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
                access = AccessType.secondary(
                    os.path.join(self._secondary_dir, f"shard-{s:03d}-{self._generation[s]}"))
        try:
            return Rdict(d, self._opts, column_families={"default": self._opts}, access_type=access)
        except Exception as e:  # rocksdict raises plain Exception
            if str(e).startswith("IO error"):  # e.g. no space for a new MANIFEST or LOG: say so
                raise io_error(f"open (mode={self.mode!r})", d, e) from e
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

    def _write_batch(self, shard: int, keys: list[bytes], values: list[bytes], sync: bool,
                     wal: bool = True) -> None:
        wb = WriteBatch(raw_mode=True)
        deque(map(wb.put, keys, values), maxlen=0)  # rocksdict has no batched put: map runs the loop in C
        wo = WriteOptions()
        wo.sync = sync
        wo.disable_wal = not wal
        try:
            self._dbs[shard].write(wb, wo)
        except Exception as e:  # rocksdict raises plain Exception
            raise io_error("write", shard_dir(self.path, shard), e) from None

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
        # try_catch_up_with_primary holds the GIL (~0.6 ms a shard even with nothing new):
        # skip it when the primary's files did not change since the last one
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
        try:
            self._dbs[shard].flush(True)
        except Exception as e:  # rocksdict raises plain Exception
            raise io_error("flush", shard_dir(self.path, shard), e) from None

    def _close(self) -> None:
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

    # backend-specific
    def property_value(self, shard: int, name: str) -> str | None:
        """A RocksDB property of ``shard`` (e.g. ``rocksdb.block-cache-capacity``)."""
        return self._dbs[self._check_shard(shard)].property_value(name)

    def cache_usage(self) -> int:
        """Bytes now held by the shared block cache."""
        return self._cache.get_usage()

    def block_cache_stats(self) -> dict[str, int] | None:
        """Block-cache ``hits`` and ``misses`` (data, index and filter blocks) over all shards since
        the store opened; None unless opened with ``StoreConfig.statistics``."""
        text = self._opts.get_statistics() if self.config.statistics else None
        if not text:
            return None
        got = dict(_BLOCK_CACHE_STAT.findall(text))
        return {"hits": int(got.get("hit", 0)), "misses": int(got.get("miss", 0))}


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

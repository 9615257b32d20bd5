"""``StoreBackend``: the primitives an embedding store runs on; each backend is one module.

``EmbeddingStore`` (``base``) HOLDS a backend (``store.storage``) and does everything that does not
depend on where records live: key encoding, sharding, quantization, seqs, the feed, validation, modes,
reads, writes and bulk load. It reaches the storage only through the methods below; a backend is a
``StoreBackend`` subclass in its own module that implements every one of them (``rocksdb_store``:
``"rocksdb"``; ``redis_store``: ``"redis"``) and is registered by its ``backend`` name in ``open``.

Everything is per shard: ``shard`` is an int in ``[0, config.shards)``, already checked. Keys and
values are the store's encoded bytes (``keys``: 12-byte row keys, and the seq, watermark and meta
records of ``internal_keys`` and ``keys.META_PREFIX`` in the same key space); the backend stores
them as opaque bytes, each shard ordered by key bytes (meta keys sort after every row key).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from offgraph.store.config import StoreConfig
from offgraph.store.sst_run import WriterFactory


class StoreBackend(abc.ABC):
    """The storage side of an embedding store.

    Made with ``path`` (the store directory, which holds ``store.json``), ``config`` (a
    :class:`StoreConfig`) and ``mode`` (``"w"``: the one writer process; ``"r"``: read-only;
    ``"follow"``: sees a live writer's rows after :meth:`_catch_up`), already checked by the store;
    nothing is opened before :meth:`_open`. Reads may come from many threads at once; writes come
    from one thread at a time.
    """

    backend: ClassVar[str] = ""
    """The backend's name, as ``StoreConfig.backend`` records it in ``store.json``."""

    io_mode: str = "buffered"
    """How the backend reads its files (``"direct"``: O_DIRECT, past the page cache; ``"buffered"``),
    reported by ``stats()``; set by :meth:`_open`."""

    def __init__(self, path: str, config: StoreConfig, mode: str) -> None:
        self.path = path
        self.config = config
        self.mode = mode

    # ------------------------------------------------------------------ lifecycle
    @abc.abstractmethod
    def _open(self, **options: Any) -> None:
        """Open every shard for ``self.mode``, creating it in mode ``"w"`` when absent.

        Args:
            **options: backend-specific options from ``open_store`` (RocksDB: ``secondary_dir``,
                where a follower keeps its private files).

        Raises:
            ValueError: a shard the mode needs does not exist (modes ``"r"``, ``"follow"``).
            OSError: the storage refused (full disk, read-only mount...), with its errno.

        When it raises, nothing is left open.
        """

    @abc.abstractmethod
    def _close(self) -> None:
        """Release every shard; called once. A store whose writes failed must not wait on storage
        that cannot take more (e.g. a flush on a full disk).

        Raises:
            OSError: closing a shard failed (every shard is still released).
        """

    # ------------------------------------------------------------------ reads
    @abc.abstractmethod
    def _multi_get(self, shard: int, keys: list[bytes]) -> list[bytes | None]:
        """Read many keys of one shard in one call (the read path's only primitive).

        Args:
            shard: the shard index.
            keys: encoded keys, any order, no duplicates needed.

        Returns:
            The stored value of each key, in the order of ``keys``; None where absent.

        Raises:
            StoreReadError: the backend could not read rows it holds (corruption, I/O error).
        """

    @abc.abstractmethod
    def _seek_first(self, shard: int, lowers: list[bytes]) -> list[tuple[bytes, bytes] | None]:
        """For each lower bound, the first stored pair at or after it (``verify_sample``'s seeks,
        which should not fill read caches).

        Args:
            shard: the shard index.
            lowers: encoded keys.

        Returns:
            ``(key, value)`` of the smallest stored key ``>= lowers[i]``, or None past the shard's
            last key, for each ``i`` in order.

        Raises:
            StoreReadError: as :meth:`_multi_get`.
        """

    @abc.abstractmethod
    def _iter_row_keys(self, shard: int) -> Iterable[bytes]:
        """Every row key of one shard (``stats(exact=True)``).

        Args:
            shard: the shard index.

        Returns:
            The 12-byte row keys in ascending order; no meta keys (``keys.META_PREFIX`` and above).
        """

    @abc.abstractmethod
    def _iter_values(self, shard: int, lower: bytes, upper: bytes) -> Iterable[bytes]:
        """The values of one shard's keys in ``[lower, upper)`` (the seq records, once per shard).

        Args:
            shard: the shard index.
            lower: inclusive lower bound (encoded key).
            upper: exclusive upper bound.

        Returns:
            The values, in ascending key order.
        """

    # ------------------------------------------------------------------ writes (mode "w")
    @abc.abstractmethod
    def _write_batch(self, shard: int, keys: list[bytes], values: list[bytes], sync: bool, wal: bool = True) -> None:
        """Put records in one shard as ONE atomic batch: a row, its seq record, the shard's seq
        watermark and meta records written together are all seen or none (by a reader, a
        follower, and after a crash).

        Args:
            shard: the shard index.
            keys: encoded keys; a key may repeat, the last one wins.
            values: one value per key.
            sync: durable on disk (fsync) before returning.
            wal: False when the caller makes the batch durable by :meth:`_flush` right after (the
                backend may then skip its log); True: durable against a crash of this process.

        Raises:
            OSError: the storage refused the write (with its errno: ENOSPC on a full disk); the
                store then takes no more writes.
        """

    @abc.abstractmethod
    def _flush(self, shard: int) -> None:
        """Make everything written to one shard durable in its table files (``flush()``, and each
        shard of a ``durability="flush"`` write).

        Args:
            shard: the shard index.

        Raises:
            OSError: as :meth:`_write_batch`.
        """

    # ------------------------------------------------------------------ bulk load of external files
    @abc.abstractmethod
    def _sst_writer_factory(self) -> WriterFactory | None:
        """How ``bulk_load`` writes the files :meth:`_ingest` takes in.

        Returns:
            A picklable ``(shard, path) -> sst_run.SstWriter`` (it may run in a worker process),
            whose files hold exactly the store's table settings; or None where the backend takes
            no external files: ``bulk_load`` then refuses with NotImplementedError before it reads
            a chunk, and :meth:`_ingest` is never called.
        """

    @abc.abstractmethod
    def _ingest(self, shard: int, paths: list[str]) -> None:
        """Move finished files of the factory's writers into one shard, atomically; their keys win
        over stored ones.

        Args:
            shard: the shard index.
            paths: the files, on the store's filesystem (they are moved, not copied).
        """

    # ------------------------------------------------------------------ followers (mode "follow")
    @abc.abstractmethod
    def _catch_up(self, shard: int) -> None:
        """Make one shard's view show what the writer process has written since the last call,
        also after that process restarted; cheap when nothing changed (it runs periodically on a
        serving process's background thread).

        Args:
            shard: the shard index.
        """

    # ------------------------------------------------------------------ stats and files
    @abc.abstractmethod
    def _shard_info(self, shard: int) -> dict[str, Any]:
        """Sizes of one shard (``stats()``).

        Args:
            shard: the shard index.

        Returns:
            At least ``bytes_on_disk`` and ``estimated_keys`` (ints); backend-specific extras may follow.
        """

    @abc.abstractmethod
    def cache_usage(self) -> int:
        """Bytes now held by the backend's own read cache in this process (0 if it keeps none).

        Returns:
            The cache's usage in bytes (a scorer reports it with its memory).
        """

    @abc.abstractmethod
    def set_cache_mb(self, mb: int) -> None:
        """Bound the backend's own read cache in this process to ``mb`` MiB from now on (a version
        whose share of the memory budget changes: ``offgraph.scoring.memory_budget``).

        Args:
            mb: the new capacity in MiB (>= 1); a backend that keeps no cache ignores it.
        """

    @abc.abstractmethod
    def block_cache_stats(self) -> dict[str, int] | None:
        """Hits and misses of the backend's read cache since the store opened.

        Returns:
            ``{"hits": int, "misses": int}``, or None where not counted (RocksDB: unless opened with
            ``StoreConfig.statistics``).
        """

    def watch_changes(
        self,
        on_rows: Callable[[np.ndarray, np.ndarray], None],
        on_lost: Callable[[], None],
    ) -> bool:
        """Tell a reader of rows other processes write (a backend shared over machines, whose
        readers cannot follow the writer's local feed); not abstract: a local backend does not.

        Args:
            on_rows: called with ``(table_ids, rows)`` (int64 arrays) of each batch written, from a
                thread of the backend's, soon after the write.
            on_lost: called when changes may have been missed (a lost connection): forget every
                row read so far.

        Returns:
            Whether the backend will call them (False: this backend tells of no change).
        """
        return False

    @classmethod
    @abc.abstractmethod
    def data_files(cls, store_dir: str | os.PathLike) -> list[Path]:
        """The local files that hold a store's rows, without opening it (a prefetch into the page
        cache, a probe of the device they live on).

        Args:
            store_dir: the store directory.

        Returns:
            The files, any order; empty where the backend keeps no rows in local files.
        """

    @classmethod
    @abc.abstractmethod
    def reads_direct(cls, store_dir: str | os.PathLike, config: StoreConfig) -> bool:
        """Whether a store opened with ``config`` reads :meth:`data_files` past the OS page cache
        (O_DIRECT), so that reading them into the page cache ahead of requests would not help.

        Args:
            store_dir: the store directory.
            config: the settings it would be opened with.

        Returns:
            True when its reads skip the page cache (``io_mode == "direct"`` once opened).
        """

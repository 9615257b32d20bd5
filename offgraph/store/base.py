"""The embedding store: its state, modes and lifecycle; reads (``store_reads``), the write
plan (``store_writes``) and bulk load (``bulk_load``) are mixins over the primitives of
``backend.StoreBackend`` (one shard at a time, bytes in, bytes out), which each backend implements
in its own module (``rocksdb_store.RocksDBStore``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from offgraph.store.backend import StoreBackend
from offgraph.store.bulk_load import BulkLoad
from offgraph.store.config import StoreConfig
from offgraph.store.feed import FeedWriter
from offgraph.store.quant import get_codec
from offgraph.store.store_reads import ReadResult, StoreReads
from offgraph.store.store_writes import DURABILITY, StoreWrites, WriteResult

__all__ = ["EmbeddingStore", "ReadResult", "WriteResult", "MODES", "DURABILITY"]

MODES = ("r", "w", "follow")


class EmbeddingStore(StoreReads, StoreWrites, BulkLoad, StoreBackend):
    """Sharded ``(table id, row) -> (vector, first-order weight)`` store.

    Open one with :func:`offgraph.store.open_store`. Thread-safe for concurrent reads.
    """

    def __init__(self, path: str, config: StoreConfig, mode: str, **options: Any) -> None:
        """Open the store at ``path`` with the backend of ``type(self)``; ``options`` go to its
        ``_open`` (``open_store`` passes them)."""
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
        self._seq_watermarks: dict[int, int] = {}  # writer: shard -> highest seq it holds (store_writes)
        self._closed = False
        self._open(**options)

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
        """Write mode: make every shard's writes durable in its table files (RocksDB: flush the
        memtables to SST files)."""
        self._check_writable()
        for s in range(self.config.shards):
            self._flush(s)

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

    def __enter__(self) -> EmbeddingStore:
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
        return [(s, order[bounds[s] : bounds[s + 1]]) for s in range(self.config.shards) if counts[s]]

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
                f"store {self.path!r} is open with mode={self.mode!r} (read-only); open it with mode='w' to write"
            )

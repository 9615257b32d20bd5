"""Store configuration: passed explicitly, recorded in ``store.json`` and in model manifests.

Two kinds of settings:

* **layout** (``dim``, ``quant``, ``shards``, ``shard_fn``, ``key_format``, ``backend``):
  they decide what the bytes on disk mean. A store refuses to open with a layout
  that differs from the one it was created with.
* **tuning** (cache, bloom bits, threads, compression, write buffer, direct I/O): they may
  differ from one open to the next (a server may want a bigger cache than the exporter).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from offgraph.config import ConfigModel

QUANTS = ("fp32", "fp16", "int8")
COMPRESSIONS = ("none", "lz4", "lz4hc", "zstd", "snappy")
SHARD_FNS = ("splitmix64-v1",)
KEY_FORMATS = ("u32be-table+u64be-row",)

LAYOUT_FIELDS = ("dim", "quant", "shards", "shard_fn", "key_format", "backend", "namespace")

DEFAULT_READ_THREADS = 8
"""Where the gain of more threads reading a store's misses flattens (``bench.read_threads``; figures in
bench/results/read-threads/). The pool is shared by all requests, and a shard's keys are split over the
threads too, so it does not depend on the shards."""


class StoreConfig(ConfigModel, frozen=True):
    """Configuration of an embedding store.

    dim: embedding width D (every table of a store has the same D).
    quant: record format, one of ``fp32``, ``fp16``, ``int8`` (see ``offgraph.store.quant``).
    shards: number of shards S (each its own RocksDB directory).
    block_cache_mb: capacity of the ONE block cache shared by all shards (MiB).
    bloom_bits_per_key: bloom filter bits per key in SST files above the bottommost level
        (memtable flushes of live updates; see ``optimize_filters_for_hits``).
    optimize_filters_for_hits: no filter in the bottommost level's files, which hold every row
        of a table (every hashed row exists, so a filter there never saves a read, while 10
        bits a key of 10^9 keys are 1.2 GB to hold in the cache); bulk-loaded SST files are
        written without one. False: filters everywhere (stores written before this setting
        carry filters in their bulk-loaded files either way; they are read as before).
    statistics: RocksDB statistics (block-cache hits and misses: ``block_cache_stats``); a
        server's scorers turn it on, at a small cost per read.
    read_threads: threads of the pool that reads a request's keys in parallel: split by shard, then
        in key-ordered pieces of at least about ``base.MIN_CHUNK_KEYS`` keys, about this many
        ``multi_get`` calls in flight (each call reads its keys one after another); default (None)
        ``DEFAULT_READ_THREADS``, for any number of shards.
    direct_reads: table files are read with O_DIRECT, past the OS page cache (``io_mode``
        ``"direct"``): what a read finds in memory is then only what the process holds and
        accounts for (the block cache, a server's row cache), and a miss costs one device read,
        whatever the kernel kept or reclaimed. This is the mode that stays predictable beyond
        RAM, so it is the default for every open: the server's ``r``/``follow`` stores (the request
        path), the updater's primary (its seq checks read through its own block cache, and it puts
        no page-cache pages in the way of the serving processes), the exporter's and synth's bulk
        loads (their verify reads what is on the disk, not pages just written). False
        (``"buffered"``): reads go through the page cache, for a machine whose RAM holds the store.
        A filesystem that refuses O_DIRECT (ramfs; tmpfs before Linux 6.6) is read buffered,
        with one warning naming the store.
    direct_flush_and_compaction: memtable flushes and compactions (only a writer, ``w``, runs
        them: the live updater; a bulk load's SST writers and ingestion do not) read and write
        their files with O_DIRECT, so a compaction streaming a big table does not fill the page
        cache or leave gigabytes of dirty pages to write back. Off with the reads where the
        filesystem refuses O_DIRECT.
    compression: block compression of SST files above the bottommost level (memtable
        flushes of live updates).
    bottommost_compression: block compression of the bottommost level, which holds
        bulk-loaded tables (SST writers use it) and compacted data; None: as
        ``compression``. Same settings for every record format.
    compression_level: level for both (None: the library default; for lz4hc 1-12).
    write_buffer_mb: memtable size per shard (MiB); bounds write memory to about
        ``shards * write_buffer_mb * 2``.
    block_size_kb: uncompressed data block size (KiB).
    block_restart_interval: keys between restart points of a data block (delta-encoded
        keys in between).
    shard_fn / key_format / backend: named, versioned choices recorded with the store.
    url: where a remote backend's rows live (``redis``: ``redis://HOST:PORT`` of any node of the
        cluster); None for a local backend. A tuning setting: a store may be opened through another
        node of the same cluster.
    namespace: a remote backend's key prefix for this store's rows (``redis``: each shard is one hash,
        ``offgraph:{NAMESPACE/s}``), chosen when the store is created (``MODEL/VERSION/`` and a random
        suffix), so that two versions, or two exports of one, never share keys.
    remote_timeout_ms: a remote backend's bound on one call (connect, read or write); a cluster that
        does not answer in it is a ``StoreUnavailable`` error (the server's 503), never a hang.
    """

    dim: int = Field(ge=1)
    quant: Literal[QUANTS] = "fp32"
    shards: int = Field(1, ge=1)
    block_cache_mb: int = Field(64, ge=1)
    bloom_bits_per_key: int = Field(10, ge=0)
    optimize_filters_for_hits: bool = True
    statistics: bool = False
    read_threads: int | None = Field(None, ge=1, validate_default=True)
    direct_reads: bool = True
    direct_flush_and_compaction: bool = True
    compression: Literal[COMPRESSIONS] = "lz4"
    bottommost_compression: Literal[COMPRESSIONS] | None = "lz4hc"
    compression_level: int | None = Field(4, ge=-(2**20))
    write_buffer_mb: int = Field(16, ge=1)
    block_size_kb: int = Field(16, ge=1)
    block_restart_interval: int = Field(32, ge=1)
    shard_fn: Literal[SHARD_FNS] = "splitmix64-v1"
    key_format: Literal[KEY_FORMATS] = "u32be-table+u64be-row"
    backend: str = Field("rocksdb", min_length=1)
    url: str | None = None
    namespace: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._/:-]+$")
    remote_timeout_ms: int = Field(1000, ge=1)

    @field_validator("read_threads")
    @classmethod
    def _read_threads_default(cls, v: int | None) -> int:
        return DEFAULT_READ_THREADS if v is None else v

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StoreConfig:
        """The settings of ``store.json``: every key must be a setting."""
        if not isinstance(d, dict):
            raise ValueError(f"StoreConfig.from_dict needs a dict, got {type(d).__name__}")
        return cls(**d)

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> StoreConfig:
        """The settings of a manifest's ``store`` record, which also holds figures (row counts, bytes)."""
        if not isinstance(d, dict):
            raise ValueError(f"StoreConfig.from_record needs a dict, got {type(d).__name__}")
        return cls(**{k: v for k, v in d.items() if k in cls.model_fields})

    def layout(self) -> dict[str, Any]:
        """The settings that decide what the bytes on disk mean."""
        return {k: getattr(self, k) for k in LAYOUT_FIELDS}

    def check_same_layout(self, other: StoreConfig) -> None:
        """Raise ValueError naming every layout setting where ``other`` differs."""
        bad = [
            f"{k}: store has {getattr(self, k)!r}, asked for {getattr(other, k)!r}"
            for k in LAYOUT_FIELDS
            if getattr(self, k) != getattr(other, k)
        ]
        if bad:
            raise ValueError("StoreConfig conflicts with the existing store: " + "; ".join(bad))

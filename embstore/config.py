"""Store configuration: passed explicitly, recorded in ``store.json`` and in model manifests.

Two kinds of settings:

* **layout** (``dim``, ``quant``, ``shards``, ``shard_fn``, ``key_format``, ``backend``):
  they decide what the bytes on disk mean. A store refuses to open with a layout
  that differs from the one it was created with.
* **tuning** (cache, bloom bits, threads, compression, write buffer): they may differ
  from one open to the next (a server may want a bigger cache than the exporter).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

QUANTS = ("fp32", "fp16", "int8")
COMPRESSIONS = ("none", "lz4", "lz4hc", "zstd", "snappy")
SHARD_FNS = ("splitmix64-v1",)
KEY_FORMATS = ("u32be-table+u64be-row",)

LAYOUT_FIELDS = ("dim", "quant", "shards", "shard_fn", "key_format", "backend")


@dataclass(frozen=True)
class StoreConfig:
    """Configuration of an embedding store.

    dim: embedding width D (every table of a store has the same D).
    quant: record format, one of ``fp32``, ``fp16``, ``int8`` (see ``embstore.quant``).
    shards: number of shards S (each its own RocksDB directory).
    block_cache_mb: capacity of the ONE block cache shared by all shards (MiB).
    bloom_bits_per_key: bloom filter bits per key in every SST file.
    read_threads: threads reading shards in parallel; default ``min(shards, 8)``.
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
    """

    dim: int
    quant: str = "fp32"
    shards: int = 1
    block_cache_mb: int = 64
    bloom_bits_per_key: int = 10
    read_threads: int | None = None
    compression: str = "lz4"
    bottommost_compression: str | None = "lz4hc"
    compression_level: int | None = 4
    write_buffer_mb: int = 16
    block_size_kb: int = 16
    block_restart_interval: int = 32
    shard_fn: str = "splitmix64-v1"
    key_format: str = "u32be-table+u64be-row"
    backend: str = "rocksdb"

    def __post_init__(self) -> None:
        _check_int("dim", self.dim, 1)
        if self.quant not in QUANTS:
            raise ValueError(f"StoreConfig.quant must be one of {QUANTS}, got {self.quant!r}")
        _check_int("shards", self.shards, 1)
        _check_int("block_cache_mb", self.block_cache_mb, 1)
        _check_int("bloom_bits_per_key", self.bloom_bits_per_key, 0)
        if self.read_threads is None:
            object.__setattr__(self, "read_threads", min(self.shards, 8))
        _check_int("read_threads", self.read_threads, 1)
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"StoreConfig.compression must be one of {COMPRESSIONS}, got {self.compression!r}"
            )
        if self.bottommost_compression is not None and self.bottommost_compression not in COMPRESSIONS:
            raise ValueError(
                f"StoreConfig.bottommost_compression must be None or one of {COMPRESSIONS}, "
                f"got {self.bottommost_compression!r}"
            )
        if self.compression_level is not None:
            _check_int("compression_level", self.compression_level, -(2**20))
        _check_int("write_buffer_mb", self.write_buffer_mb, 1)
        _check_int("block_size_kb", self.block_size_kb, 1)
        _check_int("block_restart_interval", self.block_restart_interval, 1)
        if self.shard_fn not in SHARD_FNS:
            raise ValueError(f"StoreConfig.shard_fn must be one of {SHARD_FNS}, got {self.shard_fn!r}")
        if self.key_format not in KEY_FORMATS:
            raise ValueError(
                f"StoreConfig.key_format must be one of {KEY_FORMATS}, got {self.key_format!r}"
            )
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"StoreConfig.backend must be a non-empty string, got {self.backend!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StoreConfig":
        if not isinstance(d, dict):
            raise ValueError(f"StoreConfig.from_dict needs a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"StoreConfig: unknown setting(s) {unknown}")
        if "dim" not in d:
            raise ValueError("StoreConfig: missing setting 'dim'")
        return cls(**d)

    def layout(self) -> dict[str, Any]:
        """The settings that decide what the bytes on disk mean."""
        return {k: getattr(self, k) for k in LAYOUT_FIELDS}

    def check_same_layout(self, other: "StoreConfig") -> None:
        """Raise ValueError naming every layout setting where ``other`` differs."""
        bad = [
            f"{k}: store has {getattr(self, k)!r}, asked for {getattr(other, k)!r}"
            for k in LAYOUT_FIELDS
            if getattr(self, k) != getattr(other, k)
        ]
        if bad:
            raise ValueError("StoreConfig conflicts with the existing store: " + "; ".join(bad))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"StoreConfig.{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"StoreConfig.{name} must be >= {minimum}, got {value}")

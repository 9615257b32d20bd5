"""RocksDB options of a store, built from a :class:`StoreConfig`.

The same ``Options`` object is used for the DB, for its ``default`` column family
(rocksdict ignores ``Options`` for an existing DB's column families unless they are
passed again as ``column_families={"default": opts}``) and for the SST writers of bulk
loads, so every SST file gets the same compression, block size and bloom filter.
"""

from __future__ import annotations

import errno
import os
import tempfile

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, DBCompressionType, Options

from offgraph.store.config import StoreConfig

_COMPRESSION = {
    "none": DBCompressionType.none,
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
    "snappy": DBCompressionType.snappy,
    "lz4hc": DBCompressionType.lz4hc,
}


def make_cache(config: StoreConfig) -> Cache:
    """The ONE block cache (LRU, ``block_cache_mb`` MiB) shared by all shards."""
    return Cache(config.block_cache_mb << 20)


_PROBE_FILES = ("store.json", os.path.join("shard-000", "CURRENT"))  # one of them exists in a store


def direct_io_refused(store_dir: str) -> str | None:
    """Why the files of the store at ``store_dir`` cannot be opened with O_DIRECT (the OS error:
    EINVAL on ramfs, on tmpfs before Linux 6.6, on some FUSE mounts; RocksDB then refuses to open
    the DB at all, "Direct I/O is not supported"), or None when they can. Opens one of the store's
    files, else a temporary file made there; any other error (unreadable, read-only) is no answer,
    and RocksDB's open reports it."""
    if not hasattr(os, "O_DIRECT"):
        return "this OS has no O_DIRECT"
    probe = next((p for p in (os.path.join(store_dir, n) for n in _PROBE_FILES) if os.path.isfile(p)), None)
    made = None
    try:
        if probe is None:
            fd, made = tempfile.mkstemp(dir=store_dir, prefix=".direct-io-probe-")
            os.close(fd)
        os.close(os.open(probe or made, os.O_RDONLY | os.O_DIRECT))
    except OSError as e:
        return f"{errno.errorcode[e.errno]}: {e.strerror}" if e.errno == errno.EINVAL else None
    finally:
        if made is not None:
            os.unlink(made)
    return None


def reads_direct(store_dir: str, config: StoreConfig) -> bool:
    """Whether a store opened with ``config`` reads its table files with O_DIRECT (``io_mode``)."""
    return config.direct_reads and direct_io_refused(store_dir) is None


def make_options(config: StoreConfig, cache: Cache, *, bulk_load: bool = False, direct: bool = True) -> Options:
    """The options of a store's shards; ``bulk_load``: of the SST writers of a bulk load, whose
    files are ingested into the bottommost level (no filter there with ``optimize_filters_for_hits``).
    ``direct``: False where the filesystem refuses O_DIRECT (``direct_io_refused``): no direct I/O
    whatever the config says."""
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_block_size(config.block_size_kb << 10)
    table.set_block_restart_interval(config.block_restart_interval)
    table.set_format_version(5)
    if config.bloom_bits_per_key > 0 and not (bulk_load and config.optimize_filters_for_hits):
        # full (not block-based) filter over whole keys: no prefix extractor is set. It saves the
        # reads of a key in files that do not hold it: the live writer's flushes above the
        # bottommost level. In the bottommost level every row of a table exists, so there it is
        # only memory (optimize_filters_for_hits: none, and none in bulk-loaded files).
        table.set_bloom_filter(config.bloom_bits_per_key, False)
    # Index and filter blocks are charged to the bounded cache, not held outside it.
    # Both are partitioned (two-level) so a big table's filter is read and evicted in
    # small pieces; the small top levels stay pinned, so do L0 files' blocks. With direct
    # reads the block cache is the only cache of index partitions: they go to its high-priority
    # pool (RocksDB's defaults: cache_index_and_filter_blocks_with_high_priority, half the LRU
    # cache's capacity; rocksdict sets neither, so they stay), ahead of data blocks.
    table.set_cache_index_and_filter_blocks(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_block_based_table_factory(table)
    opts.set_optimize_filters_for_hits(config.optimize_filters_for_hits)
    opts.set_use_direct_reads(direct and config.direct_reads)
    opts.set_use_direct_io_for_flush_and_compaction(direct and config.direct_flush_and_compaction)
    if config.statistics:  # one Statistics object shared by every shard opened with these options
        opts.enable_statistics()
    opts.set_compression_type(_COMPRESSION[config.compression]())
    level = 32767 if config.compression_level is None else config.compression_level  # 32767: default
    # (window bits, level, strategy, max dictionary bytes): only the level is set
    opts.set_compression_options(-14, level, 0, 0)
    if config.bottommost_compression is not None:
        opts.set_bottommost_compression_type(_COMPRESSION[config.bottommost_compression]())
        opts.set_bottommost_compression_options(-14, level, 0, 0, True)
    opts.set_write_buffer_size(config.write_buffer_mb << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_max_background_jobs(2)
    opts.set_keep_log_file_num(2)
    opts.set_max_log_file_size(4 << 20)
    return opts

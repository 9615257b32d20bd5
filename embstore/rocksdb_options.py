"""RocksDB options of a store, built from a :class:`StoreConfig`.

The same ``Options`` object is used for the DB, for its ``default`` column family
(rocksdict ignores ``Options`` for an existing DB's column families unless they are
passed again as ``column_families={"default": opts}``) and for the SST writers of bulk
loads, so every SST file gets the same compression, block size and bloom filter.
"""

from __future__ import annotations

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, DBCompressionType, Options

from .config import StoreConfig

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


def make_options(config: StoreConfig, cache: Cache, *, bulk_load: bool = False) -> Options:
    """The options of a store's shards; ``bulk_load``: of the SST writers of a bulk load, whose
    files are ingested into the bottommost level (no filter there with ``optimize_filters_for_hits``)."""
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
    # small pieces; the small top levels stay pinned, so do L0 files' blocks.
    table.set_cache_index_and_filter_blocks(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_block_based_table_factory(table)
    opts.set_optimize_filters_for_hits(config.optimize_filters_for_hits)
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

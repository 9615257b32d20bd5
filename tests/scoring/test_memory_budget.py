"""The split of one memory budget (offgraph.scoring.memory_budget): parts within the budget, the block cache sized
by the version's index, the row cache the big share."""

from __future__ import annotations

import math

import pytest

from offgraph.scoring.memory_budget import (
    CANDIDATE_BYTES,
    FG_ITEM_BYTES,
    JOIN_RECORD_BYTES,
    MiB,
    index_mb,
    manifest_index_mb,
    split_memory,
)


@pytest.mark.parametrize("memory_mb", [4.0, 16.0, 64.0, 384.0, 1024.0, 8192.0])
@pytest.mark.parametrize("models", [1, 3])
@pytest.mark.parametrize("index", [0.0, 0.05, 60.0, 600.0])
def test_the_parts_of_every_model_sum_to_at_most_its_share(memory_mb, models, index):
    s = split_memory(memory_mb, models, index_mb=index)
    parts = s.budget_bytes()
    assert all(v >= 0 for v in parts.values()) and s.block_cache_mb >= 1
    assert sum(parts.values()) <= memory_mb / models * MiB + 1  # (rounding of the float parts)
    assert s.model_mb * models <= memory_mb + 1e-6


def test_the_row_cache_is_the_big_share_and_the_block_cache_holds_the_index():
    # 10^9 rows of int8 D=16 (21-byte records) in 16 KiB blocks: ~2.5M blocks, tens of MiB of index
    idx = index_mb(10**9, 21, 16)
    assert 30 < idx < 100
    s = split_memory(384, 1, index_mb=idx)
    assert s.block_cache_mb >= idx  # all of the index stays in memory
    assert s.row_cache_mb > max(s.block_cache_mb, s.feed_mb, s.item_cache_items * FG_ITEM_BYTES / MiB)
    # a small version's index needs little: the block cache stays at its floor
    small = split_memory(384, 1, index_mb=index_mb(10**6, 21, 16))
    assert small.block_cache_mb < s.block_cache_mb and small.row_cache_mb > s.row_cache_mb


def test_an_index_bigger_than_the_share_allows_is_bounded():
    s = split_memory(96, 1, index_mb=600.0)
    assert s.block_cache_mb <= 96 / 3 and s.row_cache_mb > 0


def test_the_row_cache_override_leaves_the_other_parts_as_they_were():
    a, b = split_memory(256, 2, index_mb=1.0), split_memory(256, 2, index_mb=1.0, row_cache_mb=7.0)
    assert b.row_cache_mb == 7.0
    assert (a.block_cache_mb, a.item_cache_items, a.feed_mb) == (b.block_cache_mb, b.item_cache_items, b.feed_mb)


def test_the_index_estimate_from_a_manifest_counts_every_table():
    m = {
        "embedding_dim": 16,
        "store": {"quant": "int8", "block_size_kb": 16, "row_counts": {"a": 600_000, "b": 400_000}},
    }
    # int8 D=16: 21-byte records (RocksDB's "raw average value size" of a synth store)
    assert math.isclose(manifest_index_mb(m), index_mb(10**6, 21, 16))
    m["store"]["block_size_kb"] = 4  # smaller blocks: four times the index entries
    assert manifest_index_mb(m) > 3.9 * index_mb(10**6, 21, 16)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "64"])
def test_a_bad_budget_is_refused(bad):
    with pytest.raises(ValueError, match="memory_mb"):
        split_memory(bad)


def test_a_bad_model_count_is_refused():
    with pytest.raises(ValueError, match="models"):
        split_memory(64, 0)


def test_items_of_a_version_with_item_tables_are_counted_with_their_join_records():
    plain, joined = split_memory(288), split_memory(288, item_tables=True)
    # every item: its FG item-cache entry and its candidate-cache entry; with item tables its join record too
    assert plain.item_bytes == FG_ITEM_BYTES + CANDIDATE_BYTES
    assert joined.item_bytes == FG_ITEM_BYTES + CANDIDATE_BYTES + JOIN_RECORD_BYTES
    # the item share is the same bytes: fewer items, each counted with its record
    assert joined.item_cache_items < plain.item_cache_items
    assert abs(joined.budget_bytes()["item_cache"] - plain.budget_bytes()["item_cache"]) <= joined.item_bytes
    assert joined.model_mb == pytest.approx(288) and plain.model_mb == pytest.approx(288)  # the rest: the row cache
    assert joined.item_tables and not plain.item_tables


def test_an_item_cache_size_given_replaces_the_item_share_and_the_row_cache_takes_the_rest():
    share, fixed = split_memory(288, item_tables=True), split_memory(288, item_tables=True, item_cache_items=40)
    assert fixed.item_cache_items == 40 and fixed.budget_bytes()["item_cache"] == 40 * fixed.item_bytes
    assert fixed.block_cache_mb == share.block_cache_mb and fixed.feed_mb == share.feed_mb
    assert fixed.row_cache_mb > share.row_cache_mb and fixed.model_mb == pytest.approx(288)


def test_a_servers_item_cache_size_holds_when_a_versions_share_is_computed_again(tmp_path):
    """ServerConfig.memory_split, which the registry calls again whenever a model's versions change."""
    from offgraph.server import ServerConfig

    cfg = ServerConfig(models_dir=tmp_path, item_cache_size=40)
    for versions in (1, 2):
        split = cfg.memory_split(1, 1.0, versions, item_tables=True)
        assert split.item_cache_items == 40 and split.item_tables
    assert ServerConfig(models_dir=tmp_path).memory_split(1, 1.0, 2).item_cache_items > 40

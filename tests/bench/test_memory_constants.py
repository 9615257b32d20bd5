"""bench.memory_constants: its measures, at a tiny size, give figures of the order of the constants they check."""

import json
import math

import numpy as np

from bench.memory_constants import measure_index, measure_items, store_index, summary, write
from offgraph.store import StoreConfig, open_store

ROWS = 40_000


def _store(path, rows=ROWS):
    """A 2-shard int8 store of ``rows`` rows bulk-loaded as the exporter does."""
    rng = np.random.default_rng(0)
    with open_store(path, StoreConfig(dim=16, quant="int8", shards=2), mode="w") as st:
        vectors = rng.standard_normal((rows, 16)).astype(np.float32)
        st.bulk_load(1, [(np.arange(rows), vectors, np.zeros(rows, np.float32))])
    return path


def test_store_index_reads_index_bytes_and_blocks_of_every_shard(tmp_path):
    got = store_index(_store(tmp_path / "s"))
    assert got["entries"] == ROWS  # both shards' tables counted
    # a 21-byte record and a 20-byte key: blocks of 16 KiB hold a few hundred rows each
    assert ROWS * 41 / (16 << 10) / 4 < got["data_blocks"] < ROWS * 41 / (16 << 10) * 4
    assert 8 < got["index_bytes_per_block"] < 200
    assert got["index_bytes"] == got["index_bytes_per_block"] * got["data_blocks"]


def test_item_bytes_are_positive_and_count_the_values_the_keys_keep():
    own = measure_items(400, batch=100)
    shared = measure_items(400, batch=100, own_values=False)
    assert own["items"] == shared["items"] == 400  # distinct items, all in the cache
    for got in (own, shared):
        assert math.isfinite(got["item_bytes"]) and 100 < got["item_bytes"] < 5000
    assert own["item_bytes"] > shared["item_bytes"]  # the raw values an item's key holds


def test_a_synth_version_gives_an_index_per_block_of_the_order_of_the_constant(tmp_path):
    index = measure_index(40_000, tmp_path)
    assert index["entries"] == 40_000
    assert 8 < index["index_bytes_per_block"] < 200
    assert index["planner_index_bytes"] > 0
    item = {"item_bytes": 700.0, "held_bytes": 7000, "items": 10}
    result = {"index": index, "item": item, "item_shared_values": item, "summary": summary(index, item)}
    write(tmp_path / "out", result)
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["summary"]["INDEX_BYTES_PER_BLOCK"]["constant"] == 24
    assert "No plot" in (tmp_path / "out" / "README.md").read_text()

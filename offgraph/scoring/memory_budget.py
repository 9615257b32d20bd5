"""One memory budget per worker process, split over its models and, per model, over its caches.

``offgraph serve --memory-mb M`` is what one worker process's caches may hold, all models together
(the process's own memory, Python, TensorFlow and the dense models, comes on top: see
``DEFAULT_MEMORY_MB``). Each of ``models`` models gets ``M / models``; a model that serves ``versions``
versions at once (labels: ``stable`` and ``canary``) gives each ``M / models / versions``. A share is split
in this order:

- **block cache** (RocksDB, one per store): the index partitions of the version's files, and little
  else. Every row-cache miss reads one data block; with its index partition in the cache that is
  one read from disk, without it two. So the block cache gets what the index needs
  (``index_mb``: estimated from the manifest, ``INDEX_BYTES_PER_BLOCK`` per data block of
  ``block_size_kb``), times ``INDEX_HEADROOM``, plus ``BLOCK_DATA_MB`` for the data blocks being
  read; at least ``BLOCK_MIN_MB``, at most ``BLOCK_MAX_SHARE`` of the model's share. (The bottommost
  level, where bulk-loaded rows live, has no filter: ``StoreConfig.optimize_filters_for_hits``.)
- **feed** (the live writer's mapped epochs): ``FEED_SHARE`` of the share, at most ``FEED_MAX_MB``.
- **item cache**: ``ITEM_SHARE`` of the share, at most ``ITEM_MAX`` items, each counted at
  ``FG_ITEM_BYTES`` for its entry in the FG item cache (its key with the raw values it keeps alive, and
  the entry: the ids and their counts; ``bench.memory_constants`` measures it:
  bench/results/memory-constants/) and, for a version with item feature tables, ``JOIN_RECORD_BYTES``
  more for its record in the feature join's record cache (``offgraph.feature_tables.record_cache``, which counts
  its entries' bytes and evicts past items x ``JOIN_RECORD_BYTES``), and ``CANDIDATE_BYTES`` for its entry in
  the candidate cache (``offgraph.scoring.candidate_cache``: a candidate's bytes as sent and what they make,
  counted and evicted the same way).
- **row cache**: the rest, the big share: it is what spares reads from disk.

Pure (no FastAPI, no TensorFlow): the planner (``offgraph plan``) imports it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from offgraph.modeldir.manifest_model import Manifest, StoreRecord

MiB = 1 << 20

DEFAULT_MEMORY_MB = 288.0
"""Default ``--memory-mb``: with a worker's own memory (Python, TensorFlow, the dense model, the stores) on
top, its total PSS stays within 1 GB, with room for a swap's second version while it loads (``bench.scale``
measures it: bench/results/scale/)."""

KEY_BYTES = 20
"""Bytes of a row's key in a data block: 12 of user key (table id + row) and 8 of RocksDB's sequence."""
INDEX_BYTES_PER_BLOCK = 24
"""Index entry per data block: a separator key and a block handle (``bench.memory_constants`` measures it
on a synthetic store: bench/results/memory-constants/)."""
INDEX_HEADROOM = 1.25
BLOCK_DATA_MB = 8.0
BLOCK_MIN_MB = 8
BLOCK_MAX_SHARE = 1 / 3
FEED_SHARE = 0.05
FEED_MAX_MB = 32.0
ITEM_SHARE = 0.10
ITEM_MAX = 100_000
FG_ITEM_BYTES = 850
JOIN_RECORD_BYTES = 1152
"""What the feature join's record cache may count per item of the item cache: a catalog record of a few
columns, as stored and decoded (the MovieLens catalog's are counted at about 1.1 KiB:
``tests/scoring/test_record_cache.py``); longer records, fewer held."""
CANDIDATE_BYTES = 1024
"""What the candidate cache may count per item: a candidate's JSON as sent (a MovieLens candidate with every
column: about 150 bytes), its ids and ``candidate_cache.ENTRY_OVERHEAD``."""
PARTS = ("row_cache", "block_cache", "item_cache", "feed")


@dataclass(frozen=True)
class MemorySplit:
    """The budget of ONE model in one worker process (MiB; items for the FG item cache)."""

    memory_mb: float  # the worker's whole budget (all models)
    models: int
    row_cache_mb: float
    block_cache_mb: int
    item_cache_items: int
    feed_mb: float
    index_mb: float  # what the version's index needs (estimated), held by the block cache
    versions: int = 1  # versions of this model served at once, sharing its share equally
    item_bytes: int = (
        FG_ITEM_BYTES + CANDIDATE_BYTES
    )  # what an item is counted at (JOIN_RECORD_BYTES more with item tables)

    @property
    def item_tables(self) -> bool:
        """Whether the version's items are counted with their join records (it has item feature tables)."""
        return self.item_bytes > FG_ITEM_BYTES + CANDIDATE_BYTES

    @property
    def model_mb(self) -> float:
        """This model's parts together (the item cache counted at ``item_bytes`` an item)."""
        return self.row_cache_mb + self.block_cache_mb + self.item_cache_items * self.item_bytes / MiB + self.feed_mb

    def budget_bytes(self) -> dict[str, int]:
        """Bytes each part may hold: ``row_cache``, ``block_cache``, ``item_cache``, ``feed``."""
        return {
            "row_cache": int(self.row_cache_mb * MiB),
            "block_cache": self.block_cache_mb * MiB,
            "item_cache": self.item_cache_items * self.item_bytes,
            "feed": int(self.feed_mb * MiB),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model_mb": self.model_mb}

    def describe(self) -> str:
        return (
            f"row cache {self.row_cache_mb:.1f} MiB, block cache {self.block_cache_mb} MiB (index "
            f"{self.index_mb:.1f} MiB), item cache {self.item_cache_items} items "
            f"(~{self.item_cache_items * self.item_bytes / MiB:.1f} MiB), feed {self.feed_mb:.1f} MiB"
        )


def index_mb(rows: int, record_bytes: int, block_size_kb: int = 16) -> float:
    """MiB of index a store of ``rows`` rows of ``record_bytes`` needs (uncompressed blocks of
    ``block_size_kb``: an over-estimate by about a fifth, blocks fill past their size)."""
    blocks = math.ceil(rows * (KEY_BYTES + record_bytes) / (block_size_kb << 10))
    return blocks * INDEX_BYTES_PER_BLOCK / MiB


def manifest_index_mb(manifest: Manifest | Mapping[str, Any]) -> float:
    """``index_mb`` of a version, from its manifest's store record (rows, quantization, block size).
    ``manifest``: a Manifest, or JSON with the ``embedding_dim`` and ``store`` of one."""
    from offgraph.store.quant import get_codec

    if isinstance(manifest, Manifest):
        store, dim = manifest.store, manifest.embedding_dim
    else:
        store, dim = StoreRecord.model_construct(**manifest["store"]), int(manifest["embedding_dim"])
    rb = get_codec(store.quant, dim).record_bytes
    return index_mb(store.total_rows, rb, int(store.block_size_kb))


def split_memory(
    memory_mb: float = DEFAULT_MEMORY_MB,
    models: int = 1,
    *,
    index_mb: float = 0.0,
    row_cache_mb: float | None = None,
    versions: int = 1,
    item_tables: bool = False,
    item_cache_items: int | None = None,
) -> MemorySplit:
    """One version's share of ``memory_mb`` (a worker's budget, MiB) over ``models`` models, its model
    serving ``versions`` versions at once; ``index_mb``: what the version's index needs
    (``manifest_index_mb``). ``row_cache_mb``: the row cache's size instead of the rest of the share
    (``--cache-mb``); the other parts are as without it. ``item_tables``: the version has item feature tables
    (its items are counted with their join records). ``item_cache_items``: the item cache's items instead of its
    share (``ServerConfig.item_cache_size``); the row cache then takes the rest of the share as before."""
    if (
        isinstance(memory_mb, bool)
        or not isinstance(memory_mb, (int, float))
        or not math.isfinite(memory_mb)
        or memory_mb <= 0
    ):
        raise ValueError(f"memory_mb must be a finite number > 0, got {memory_mb!r}")
    if isinstance(models, bool) or not isinstance(models, int) or models < 1:
        raise ValueError(f"models must be an int >= 1, got {models!r}")
    if isinstance(versions, bool) or not isinstance(versions, int) or versions < 1:
        raise ValueError(f"versions must be an int >= 1, got {versions!r}")
    share = memory_mb / models / versions
    block = min(
        max(BLOCK_MIN_MB, math.ceil(index_mb * INDEX_HEADROOM + BLOCK_DATA_MB)),
        max(1, math.floor(share * BLOCK_MAX_SHARE)),
    )
    feed = min(FEED_MAX_MB, share * FEED_SHARE)
    item_bytes = FG_ITEM_BYTES + CANDIDATE_BYTES + (JOIN_RECORD_BYTES if item_tables else 0)
    items = int(min(ITEM_MAX, share * ITEM_SHARE * MiB // item_bytes)) if item_cache_items is None else item_cache_items
    rest = share - block - feed - items * item_bytes / MiB
    if row_cache_mb is None:
        row_cache_mb = max(0.0, rest)
    return MemorySplit(
        memory_mb=float(memory_mb),
        models=models,
        row_cache_mb=float(row_cache_mb),
        block_cache_mb=int(block),
        item_cache_items=items,
        feed_mb=float(feed),
        index_mb=float(index_mb),
        versions=versions,
        item_bytes=item_bytes,
    )

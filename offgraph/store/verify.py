"""Which rows a bounded verification of a store reads (``EmbeddingStore.verify_sample``).

Every table's rows ``0..R-1`` are spread over the S shards by a uniform hash, so in each shard
a table occupies a contiguous key range holding about ``R / S`` rows, written in key order into
data blocks of ``block_size`` bytes. A seek to the first key at or after row ``r`` reads the
data block holding it (in every SST overlapping that position: bulk-loaded files and the live
writer's later flushes alike). Seeks at evenly spaced rows, two per estimated block, read every
data block of a table in a shard; beyond ``max_reads`` seeks for the whole store the spacing
grows and the verification becomes a sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

ENTRY_OVERHEAD_BYTES = 26
"""Per-row bytes in an SST besides the record: 12-byte key, 8-byte sequence trailer, varints."""

MISSING_ROWS_LOG_P = 21.0
"""A shard that holds no row of a table is an error when chance alone gives less than e**-21 (~1e-9)."""


def seek_rows(
    table_rows: Mapping[int, int], shards: int, record_bytes: int, block_bytes: int, max_reads: int
) -> dict[int, np.ndarray]:
    """Per table id: the rows (int64, ascending, unique) to seek in EVERY shard."""
    if max_reads < 1:
        raise ValueError(f"max_reads must be >= 1, got {max_reads}")
    full = {}
    for t, rows in table_rows.items():
        rows = int(rows)
        if rows <= 0:
            continue
        blocks = math.ceil(rows / shards * (record_bytes + ENTRY_OVERHEAD_BYTES) / block_bytes)
        full[int(t)] = min(rows, 2 * blocks + 1)
    total = shards * sum(full.values())
    scale = 1.0 if total <= max_reads else max_reads / total
    out = {}
    for t, n in full.items():
        n = max(1, int(n * scale))
        out[t] = np.unique(np.arange(n, dtype=np.int64) * int(table_rows[t]) // n)
    return out


def expect_rows_in_every_shard(rows: int, shards: int) -> bool:
    """Whether each shard holds at least one of ``rows`` uniformly hashed rows, but for a ~1e-9 chance."""
    if shards == 1:
        return rows > 0
    return rows * math.log(shards / (shards - 1)) > MISSING_ROWS_LOG_P

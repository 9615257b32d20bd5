"""NumPy side of the updater: checks against the manifest, batching, per-shard catch-up."""

from __future__ import annotations

import numpy as np

from offgraph.store import shard_of
from offgraph.streaming.deltas import DeltaBatch
from offgraph.streaming.model_limits import ModelLimits


def check_batch(b: DeltaBatch, lim: ModelLimits) -> str | None:
    """Why ``b`` cannot be applied to ``lim``'s version (None: it can). Model name and
    version are the caller's (they decide between refusing and waiting). Every check the
    store's write would make of these values is made here, per file and vectorized, so
    that one bad file is refused alone, before anything of its batch is written."""
    if b.dim != lim.dim:
        return f"dim {b.dim} but model {lim.model} version {lim.version} has embedding_dim {lim.dim}"
    if len(b) == 0:
        return None
    n_tables = len(lim.table_rows)
    bad_t = b.table_ids >= n_tables
    if bad_t.any():
        i = int(np.argmax(bad_t))
        return (
            f"{int(bad_t.sum())} deltas name table ids >= {n_tables} (the number of fields); "
            f"first: delta {i}, table_id {int(b.table_ids[i])}"
        )
    bad_r = b.rows >= lim.table_rows[b.table_ids.astype(np.int64)]
    if bad_r.any():
        i = int(np.argmax(bad_r))
        t = int(b.table_ids[i])
        return (
            f"{int(bad_r.sum())} deltas name rows beyond their table; first: delta {i}, table {t} row "
            f"{int(b.rows[i])} >= {int(lim.table_rows[t])} rows"
        )
    why = lim.codec.check_storable(b.vectors, b.first_order)
    if why is not None:
        return f"a value the store cannot hold ({why})"
    return None


def concat(batches: list[DeltaBatch]) -> DeltaBatch:
    """One batch of the deltas of ``batches`` (same model, version and dim), in order."""
    if len(batches) == 1:
        return batches[0]
    b0 = batches[0]
    return DeltaBatch(
        b0.model,
        b0.model_version,
        b0.dim,
        np.concatenate([b.table_ids for b in batches]),
        np.concatenate([b.rows for b in batches]),
        np.concatenate([b.vectors for b in batches]),
        np.concatenate([b.first_order for b in batches]),
        np.concatenate([b.seqs for b in batches]),
        np.concatenate([b.event_time_ms for b in batches]),
    )


def positions_from_meta(values: list[bytes | None]) -> list[str]:
    """Per-shard recorded positions ("" where none)."""
    return [v.decode("utf-8") if v is not None else "" for v in values]


def lagging_shards(positions: list[str], position: str) -> list[int]:
    """Shards whose recorded position is before ``position`` (they still need it)."""
    return [s for s, p in enumerate(positions) if p < position]


def shard_subset(b: DeltaBatch, shards: int, keep: list[int]) -> dict[int, np.ndarray]:
    """Indices of ``b``'s deltas per shard in ``keep`` (shard -> int indices)."""
    sh = shard_of(b.table_ids, b.rows, shards)
    return {s: np.flatnonzero(sh == s) for s in keep}

"""The request path's array maths: FG batch -> unique store keys -> pooled [N, F, D] / [N, F].

No per-value Python loop: keys of all fields are concatenated, de-duplicated
once, looked up once, scattered back and pooled per field with NumPy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from features.fg import FGBatch
from features.pooling import pool_numpy


@dataclass(frozen=True)
class Keys:
    """All (table, row) lookups of a batch: ``unique_*`` to read, ``inverse`` to scatter back."""
    unique_tables: np.ndarray  # uint32 [U]
    unique_rows: np.ndarray    # int64 [U]
    inverse: np.ndarray        # int64 [K]: position in unique of each looked-up value
    field_bounds: np.ndarray   # int64 [F + 1]: field f owns lookups field_bounds[f]:field_bounds[f+1]


def batch_keys(batch: FGBatch) -> Keys:
    sizes = np.fromiter((len(r.ids) for r in batch.fields), dtype=np.int64, count=len(batch.fields))
    bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    tables = np.repeat(np.arange(len(sizes), dtype=np.uint64), sizes)
    rows = np.concatenate([r.ids for r in batch.fields]) if bounds[-1] else np.zeros(0, np.int64)
    combined = (tables << np.uint64(48)) | rows.astype(np.uint64)  # rows < 2**48 checked by the scorer
    uniq, inverse = np.unique(combined, return_inverse=True)
    return Keys((uniq >> np.uint64(48)).astype(np.uint32), (uniq & np.uint64((1 << 48) - 1)).astype(np.int64),
                inverse.astype(np.int64), bounds)


def pool_batch(batch: FGBatch, keys: Keys, vectors: np.ndarray, first_order: np.ndarray, poolings: list[str],
               dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows' vectors [U, D] / weights [U] -> emb [N, F, D], first_order [N, F]."""
    n, F = batch.n, len(batch.fields)
    emb = np.empty((n, F, dim), dtype=np.float32)
    fo = np.empty((n, F), dtype=np.float32)
    for f, (rag, mode, bcast) in enumerate(zip(batch.fields, poolings, batch.broadcast)):
        idx = keys.inverse[keys.field_bounds[f]:keys.field_bounds[f + 1]]
        v = pool_numpy(vectors[idx], rag.offsets, mode)
        w = pool_numpy(first_order[idx], rag.offsets, mode)
        if bcast:
            emb[:, f, :] = v[0]
            fo[:, f] = w[0]
        else:
            emb[:, f, :] = v
            fo[:, f] = w
    return emb, fo

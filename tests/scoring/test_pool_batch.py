"""``pool_batch`` (all fields at once, by segment length) against ``pool_numpy`` field by field: the same bits."""

import numpy as np
import pytest

from offgraph.features.fg import FGBatch, RaggedIds
from offgraph.features.pooling import pool_numpy
from offgraph.scoring.batch import batch_keys, pool_batch


def ragged(rng, n: int, max_len: int, rows: int) -> RaggedIds:
    lengths = rng.integers(0, max_len + 1, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return RaggedIds(rng.integers(0, rows, size=int(offsets[-1])).astype(np.int64), offsets)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_len", [1, 3, 40])
def test_pool_batch_is_pool_numpy_per_field(seed, max_len):
    rng = np.random.default_rng(seed)
    n, dim, rows = 7, 5, 30
    broadcast = (True, False, False, True, False)
    poolings = ["mean", "sum", "mean", "sum", "mean"]
    fields = tuple(ragged(rng, 1 if b else n, max_len if f % 2 else 1, rows) for f, b in enumerate(broadcast))
    batch = FGBatch(n, fields, broadcast)
    keys = batch_keys(batch)
    vectors = rng.normal(size=(len(keys.unique_rows), dim)).astype(np.float32)
    weights = rng.normal(size=len(keys.unique_rows)).astype(np.float32)
    emb, fo = pool_batch(batch, keys, vectors, weights, poolings, dim)
    assert emb.shape == (n, len(fields), dim) and fo.shape == (n, len(fields))
    assert emb.flags.c_contiguous and fo.flags.c_contiguous
    for f, (rag, b, p) in enumerate(zip(fields, broadcast, poolings)):
        at = keys.inverse[keys.field_bounds[f] : keys.field_bounds[f + 1]]
        want_emb = pool_numpy(vectors[at], rag.offsets, p)
        want_fo = pool_numpy(weights[at], rag.offsets, p)
        rows_of = np.zeros(n, np.int64) if b else np.arange(n)
        np.testing.assert_array_equal(emb[:, f], want_emb[rows_of])
        np.testing.assert_array_equal(fo[:, f], want_fo[rows_of])


def test_pool_batch_of_no_candidates_and_no_values():
    empty = RaggedIds(np.zeros(0, np.int64), np.zeros(1, np.int64))
    batch = FGBatch(0, (empty,), (False,))
    emb, fo = pool_batch(batch, batch_keys(batch), np.zeros((0, 3), np.float32), np.zeros(0, np.float32), ["mean"], 3)
    assert emb.shape == (0, 1, 3) and fo.shape == (0, 1)
    none = RaggedIds(np.zeros(0, np.int64), np.zeros(3, np.int64))
    batch = FGBatch(2, (none,), (False,))
    emb, fo = pool_batch(batch, batch_keys(batch), np.zeros((0, 3), np.float32), np.zeros(0, np.float32), ["sum"], 3)
    assert not emb.any() and emb.shape == (2, 1, 3) and not fo.any()

"""``pool_batch`` (all fields at once, by segment length) against ``pool_numpy`` field by field: the same bits."""

import numpy as np
import pytest

from offgraph.features.fg import FGBatch, RaggedIds
from offgraph.features.pooling import pool_numpy
from offgraph.scoring.batch import batch_keys, pool_batch, pool_segments


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


@pytest.mark.parametrize("seed", range(3))
def test_split_segments_are_the_request_row_once_and_the_candidate_fields(seed):
    """``Segments.split``: the request fields' pooled values from their one segment ([1, F_r, ...]), the other
    fields for every candidate, bit for bit the slices of the whole [N, F, D] batch."""
    rng = np.random.default_rng(seed)
    n, dim, rows = 6, 4, 25
    broadcast = (True, False, True, False, False)
    fields = tuple(ragged(rng, 1 if b else n, 4, rows) for b in broadcast)
    batch = FGBatch(n, fields, broadcast)
    keys = batch_keys(batch)
    vectors = rng.normal(size=(len(keys.unique_rows), dim)).astype(np.float32)
    weights = rng.normal(size=len(keys.unique_rows)).astype(np.float32)
    segments = pool_segments(batch, keys, vectors, weights, ["mean", "sum", "sum", "mean", "sum"], dim)
    emb, fo = segments.whole()
    req, cand = np.array([0, 2]), np.array([1, 3, 4])
    parts = segments.split(req, cand)
    assert parts["req_emb"].shape == (1, 2, dim) and parts["cand_emb"].shape == (n, 3, dim)
    np.testing.assert_array_equal(parts["req_emb"][0], emb[0, req])
    np.testing.assert_array_equal(np.broadcast_to(parts["req_emb"], (n, 2, dim)), emb[:, req])
    np.testing.assert_array_equal(parts["req_first_order"][0], fo[0, req])
    np.testing.assert_array_equal(parts["cand_emb"], emb[:, cand])
    np.testing.assert_array_equal(parts["cand_first_order"], fo[:, cand])

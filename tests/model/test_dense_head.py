import itertools

import numpy as np
import pytest
import tensorflow as tf

from offgraph.features import FeatureGenerator, parse_spec
from offgraph.features.pooling import pool_numpy
from offgraph.model import head as head_impl
from offgraph.model.head import DeepFMHead
from offgraph.model.model import build_deepfm


def test_fm_term_equals_sum_of_pairwise_dot_products():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(5, 7, 4)).astype(np.float32)
    got = np.asarray(head_impl.fm_term(tf.constant(emb)))
    expect = np.array(
        [sum(float(emb[n, i] @ emb[n, j]) for i, j in itertools.combinations(range(7), 2)) for n in range(5)]
    )
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)


def test_head_logit_is_bias_first_fm_deep():
    head = DeepFMHead(num_fields=3, dim=4, mlp=(8,))
    head.build()
    rng = np.random.default_rng(2)
    emb = rng.normal(size=(6, 3, 4)).astype(np.float32)
    first = rng.normal(size=(6, 3)).astype(np.float32)
    head.bias.assign(0.25)
    logit = head((tf.constant(emb), tf.constant(first))).numpy()
    # recompute by hand from the weights
    w0, b0 = head.hidden[0].kernel.numpy(), head.hidden[0].bias.numpy()
    w1, b1 = head.out_unit.kernel.numpy(), head.out_unit.bias.numpy()
    deep = (np.maximum(emb.reshape(6, 12) @ w0 + b0, 0) @ w1 + b1)[:, 0]
    fm = np.array([sum(emb[n, i] @ emb[n, j] for i, j in itertools.combinations(range(3), 2)) for n in range(6)])
    np.testing.assert_allclose(logit, 0.25 + first.sum(1) + fm + deep, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_keras_front_pooling_equals_numpy_pooling(mode):
    spec = parse_spec(
        {
            "model": {"embedding_dim": 4, "mlp": [4], "pooling": mode},
            "label": "y",
            "fields": [
                {"name": "terms", "scope": "item", "op": "id", "input": "terms", "rows": 50},
                {"name": "cat", "scope": "item", "op": "id", "input": "cat", "rows": 20},
            ],
        }
    )
    model = build_deepfm(spec)
    cols = {"terms": [["a", "b", "c"], [], ["d"]], "cat": [1, None, 2]}
    batch = FeatureGenerator(spec).transform_columns(cols, 3)
    x = {}
    for i, rag in enumerate(batch.fields):
        ids, mask = rag.padded()
        x[f"ids_{i}"], x[f"mask_{i}"] = ids, mask
    emb, first, _ = model.front(x)
    for i, rag in enumerate(batch.fields):
        table = model.front.emb_tables[i].embeddings.numpy()
        wt = model.front.w_tables[i].embeddings.numpy()[:, 0]
        np.testing.assert_allclose(emb.numpy()[:, i], pool_numpy(table[rag.ids], rag.offsets, mode), rtol=1e-5)
        np.testing.assert_allclose(first.numpy()[:, i], pool_numpy(wt[rag.ids], rag.offsets, mode), rtol=1e-5)
    assert np.all(emb.numpy()[1] == 0)  # no value -> zero vector

"""The split head (``offgraph.model.split_head``): the request part once, the candidates' per row, the same
logit as ``DeepFMHead`` on all fields, for fields whose scopes interleave, with and without numeric inputs
and hidden layers."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from offgraph.model.head import DeepFMHead
from offgraph.model.split_head import split_fields, split_kernel, split_logit

SCOPES = ["item", "request", "cross", "request", "item", "request"]


def test_split_fields_follow_the_scopes():
    assert split_fields(SCOPES) == ([1, 3, 5], [0, 2, 4])
    assert split_fields([]) == ([], [])


@pytest.mark.parametrize(("mlp", "num_dense"), [((8, 4), 0), ((8, 4), 2), ((), 1)])
def test_split_logit_is_the_heads_logit(mlp, num_dense):
    keras.utils.set_random_seed(7)
    f, d, n = len(SCOPES), 4, 9
    head = DeepFMHead(f, d, mlp, num_dense=num_dense)
    head.build()
    rng = np.random.default_rng(1)
    for w in head.weights:  # non-zero biases and numeric weights too
        w.assign(rng.normal(0, 0.3, w.shape).astype(np.float32))
    req, cand = split_fields(SCOPES)
    emb = rng.normal(0, 0.5, (n, f, d)).astype(np.float32)
    fo = rng.normal(0, 0.5, (n, f)).astype(np.float32)
    emb[:, req], fo[:, req] = emb[:1, req], fo[:1, req]  # the candidates of one request share its fields
    dense = rng.normal(0, 1, (n, num_dense)).astype(np.float32)
    inputs = (emb, fo, dense) if num_dense else (emb, fo)
    whole = np.asarray(head(inputs, training=False))
    kernels = split_kernel(head, req, cand)
    assert [k.shape for k in kernels] == [
        (3 * d, (mlp or (1,))[0]),
        (3 * d, (mlp or (1,))[0]),
        (num_dense, (mlp or (1,))[0]),
    ]
    got = np.asarray(split_logit(head, kernels, emb[:1, req], fo[:1, req], emb[:, cand], fo[:, cand], dense))
    assert got.shape == (n,)
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5)

"""The dense head's NumPy forward (offgraph/scoring/numpy_head.py): a hand-computed head, then real exported
versions (the tiny MovieLens model, the numeric one) against their SavedModel on both signatures, real requests
and the load's probe, within 1e-6 on the CTR; the scorer scores through it as through the SavedModel; a weight
that disagrees with the SavedModel keeps the SavedModel serving."""

from __future__ import annotations

import logging
import math
import shutil

import numpy as np
import pytest
import tensorflow as tf
from scorer_parts import grouped_requests, pooled
from server_helpers import copy_version

from offgraph.export.export import export_run
from offgraph.modeldir.layout import SIGNATURE
from offgraph.modeldir.version import ModelVersion
from offgraph.scoring.numpy_head import (
    NUMPY_HEAD_MAX_ROWS,
    SINGLE_THREAD_MAX_ROWS,
    HeadWeights,
    NumpyHead,
    checked_head,
    default_max_rows,
    probe_inputs,
    read_weights,
)
from offgraph.scoring.scorer import Scorer
from offgraph.scoring.signature_call import SignatureCall

PARITY = 1e-6  # max |CTR| of the NumPy forward against the SavedModel, fp32


@pytest.fixture(scope="module")
def tiny_version(tiny_model):
    return tiny_model[0] / "ml" / "1"


@pytest.fixture(scope="module")
def numeric_version(numeric_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("numpy_head_numeric") / "num" / "1"
    export_run(numeric_run[0], out, shards=2, quant="fp32", progress=False)
    return out


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _hand_head() -> NumpyHead:
    """F = 2 fields of D = 2, one numeric field, one hidden layer of 2 units; field 1 the request's."""
    kernel1 = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [0.5, -1]], np.float32)  # rows f0d0 f0d1 f1d0 f1d1 dense
    layers = (
        (kernel1, np.array([0, -10], np.float32)),
        (np.array([[2], [3]], np.float32), np.array([0.25], np.float32)),
    )
    w = HeadWeights(layers, np.float32(-7), np.array([0.5], np.float32), num_fields=2, dim=2)
    return NumpyHead(w, request_fields=[1], candidate_fields=[0])


def test_a_hand_computed_head_whole_and_split():
    # candidate 0: v0 = [1, 0], v1 = [0.5, 2], first-order 0.1 + 0.2, dense 2:
    #   z = [1.5, 0.5] + 2 * [0.5, -1] + [0, -10] = [2.5, -11.5] -> relu [2.5, 0] -> 2 * 2.5 + 0.25 = 5.25
    #   first = 0.3 + 2 * 0.5 = 1.3, fm = <v0, v1> = 0.5, logit = -7 + 1.3 + 0.5 + 5.25 = 0.05
    # candidate 1: v0 = [0, 0], the same v1, first-order 0 + 0.2, dense 0:
    #   z = [0.5, 0.5] + [0, -10] -> relu [0.5, 0] -> 1.25; first = 0.2, fm = 0, logit = -7 + 0.2 + 1.25 = -5.55
    want = np.array([_sigmoid(0.05), _sigmoid(-5.55)])
    head = _hand_head()
    emb = np.array([[[1, 0], [0.5, 2]], [[0, 0], [0.5, 2]]], np.float32)
    fo = np.array([[0.1, 0.2], [0, 0.2]], np.float32)
    dense = np.array([[2], [0]], np.float32)
    whole = head.whole({"emb": emb, "first_order": fo, "dense": dense})
    split = head.split(
        {
            "req_emb": emb[:1, [1]],
            "req_first_order": fo[:1, [1]],
            "cand_emb": emb[:, [0]],
            "cand_first_order": fo[:, [0]],
            "dense": dense,
        }
    )
    assert whole.dtype == split.dtype == np.float32
    np.testing.assert_allclose(whole, want, atol=1e-7)
    np.testing.assert_allclose(split, want, atol=1e-7)


def _signatures(version):
    """(loaded object, whole SignatureCall, split SignatureCall, NumpyHead) of a version."""
    mv = ModelVersion.open(version)
    loaded, serve = mv.dense
    split_rec = mv.manifest.dense.split
    assert split_rec is not None
    w = read_weights(loaded, len(mv.spec.fields), mv.manifest.embedding_dim, len(mv.spec.numeric))
    assert w is not None
    head = NumpyHead(w, split_rec.request_fields, split_rec.candidate_fields)
    return (
        loaded,
        SignatureCall(serve),
        SignatureCall(loaded.signatures[split_rec.name]),
        head,
        (split_rec.request_fields, split_rec.candidate_fields),
    )


@pytest.mark.parametrize("which", ["tiny", "numeric"])
def test_numpy_head_equals_the_saved_model_on_real_requests_and_the_probe(
    which, tiny_version, numeric_version, tiny_model, numeric_run
):
    version, table = (tiny_version, tiny_model[1]) if which == "tiny" else (numeric_version, numeric_run[1])
    _loaded, whole, split, head, (req, cand) = _signatures(version)
    worst = {"whole": 0.0, "split": 0.0}
    with Scorer(version) as s:
        assert (s.num_dense > 0) == (which == "numeric")
        for request, cands in grouped_requests(s.spec, table, 30):
            emb, fo, dense = pooled(s, request, cands)
            w_in = {"emb": emb, "first_order": fo}
            s_in = {
                "req_emb": emb[:1, req],
                "req_first_order": fo[:1, req],
                "cand_emb": emb[:, cand],
                "cand_first_order": fo[:, cand],
            }
            if s.num_dense:
                w_in["dense"] = s_in["dense"] = dense
            for name, call, np_call, inputs in (
                ("whole", whole, head.whole, w_in),
                ("split", split, head.split, s_in),
            ):
                want = call(inputs)["ctr"].numpy()
                got = np_call(inputs)
                assert got.shape == want.shape == (len(cands),) and got.dtype == np.float32
                worst[name] = max(worst[name], float(np.abs(got - want).max()))
    for name, call, np_call in (("whole", whole, head.whole), ("split", split, head.split)):
        probe = probe_inputs(call.shapes, rows=500, seed=7)
        worst[name + " probe"] = float(np.abs(np_call(probe) - call(probe)["ctr"].numpy()).max())
    print(f"{which}: max |dCTR| NumPy vs SavedModel: {worst}")
    assert max(worst.values()) <= PARITY


def test_the_scorer_scores_through_numpy_as_through_the_saved_model(tiny_version, requests_):
    with Scorer(tiny_version) as fast, Scorer(tiny_version, numpy_head_max_rows=0) as tf_only:
        assert fast._numpy_dense is not None and tf_only._numpy_dense is None
        worst = 0.0
        for request, cands in requests_:
            a, b = fast.score(request, cands), tf_only.score(request, cands)
            assert a.shape == b.shape == (len(cands),)
            worst = max(worst, float(np.abs(a - b).max()))
    assert worst <= PARITY


def test_above_its_bound_the_scorer_calls_the_saved_model(tiny_version, requests_):
    request, cands = next((r, c) for r, c in requests_ if len(c) >= 3)
    with Scorer(tiny_version, numpy_head_max_rows=2) as bounded, Scorer(tiny_version, numpy_head_max_rows=0) as tf_only:
        assert bounded._numpy_dense is not None
        assert np.array_equal(bounded.score(request, cands), tf_only.score(request, cands))  # the same TF call
        assert np.abs(bounded.score(request, cands[:2]) - tf_only.score(request, cands[:2])).max() <= PARITY


def test_the_default_bound_follows_the_blas_threads():
    """The library's threads as they are now (threadpoolctl), not the environment's: 2 -> the SavedModel above 50
    candidates, 1 -> the NumPy head at every count (tests/server/test_compute_threads.py: set after load)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        assert default_max_rows() == NUMPY_HEAD_MAX_ROWS == 50
    with threadpool_limits(limits=1, user_api="blas"):
        assert default_max_rows() == SINGLE_THREAD_MAX_ROWS > 50


def test_a_weight_that_disagrees_keeps_the_saved_model(tiny_version, caplog):
    _loaded, whole, split, head, _ = _signatures(tiny_version)
    assert checked_head(head, whole, whole.shapes, split=False, source="v") is not None
    layers = list(head.w.layers)
    kernel, b = layers[-1]
    layers[-1] = (kernel, b + np.float32(1e-3))  # the out unit's bias a little off
    bad = NumpyHead(
        HeadWeights(tuple(layers), head.w.bias, head.w.dense_w, head.w.num_fields, head.w.dim),
        *_split_fields(tiny_version),
    )
    with caplog.at_level(logging.WARNING, logger="offgraph.scoring.numpy_head"):
        assert checked_head(bad, whole, whole.shapes, split=False, source="v") is None
        assert checked_head(bad, split, split.shapes, split=True, source="v") is None
        layers[-1] = (kernel[:-1], b)  # a kernel one row short: the forward raises on the probe
        short = NumpyHead(HeadWeights(tuple(layers), head.w.bias, head.w.dense_w, head.w.num_fields, head.w.dim))
        assert checked_head(short, whole, whole.shapes, split=False, source="v") is None
    assert sum("the SavedModel serves" in r.getMessage() for r in caplog.records) == 3


def _split_fields(version):
    rec = ModelVersion.open(version).manifest.dense.split
    return rec.request_fields, rec.candidate_fields


def test_a_version_whose_variables_disagree_with_its_split_graph_is_served_by_the_saved_model(
    tiny_version, requests_, tmp_path, caplog
):
    """The split signature holds the first layer's kernel as constants, the variables hold it too: a version whose
    variable differs (re-saved here with it changed) scores its split head by the constants, and the NumPy
    forward (read from the variables) must not serve it."""

    def tamper(dst):
        loaded = tf.saved_model.load(str(dst / "dense"))
        kernel = loaded.head.hidden[0]._kernel
        kernel.assign(kernel + 0.05)
        sigs = {k: loaded.signatures[k] for k in loaded.signatures}
        tf.saved_model.save(loaded, str(dst / "dense_new"), signatures=sigs)
        shutil.rmtree(dst / "dense")
        (dst / "dense_new").rename(dst / "dense")

    bad = tmp_path / "ml" / "1"
    copy_version(tiny_version, bad, tamper=tamper)
    with caplog.at_level(logging.WARNING, logger="offgraph.scoring.numpy_head"):
        with Scorer(bad, verify=False) as s, Scorer(tiny_version) as good:
            assert s._split is not None and s._numpy_dense is None
            request, cands = requests_[0]
            # served by the split graph, whose first layer is the original's: the good version's scores
            np.testing.assert_allclose(s.score(request, cands), good.score(request, cands), atol=PARITY)
    assert any("the SavedModel serves" in r.getMessage() for r in caplog.records)
    assert SIGNATURE in tf.saved_model.load(str(bad / "dense")).signatures

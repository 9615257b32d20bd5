"""SignatureCall: a real SavedModel's signatures called with their inputs as a flat list give what the keyword
call gives, and a TensorFlow without that entry takes the keyword call."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from offgraph.scoring.signature_call import SignatureCall


class _Head(tf.Module):
    """Inputs whose sorted keyword order is not their declaration order; one variable captured."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 3], tf.float32, name="z_emb"),
                tf.TensorSpec([None], tf.float32, name="a_bias"),
                tf.TensorSpec([1, 4], tf.float32, name="m_req"),
            ]
        )
        def named(z_emb, a_bias, m_req):
            y = tf.matmul(z_emb, self.w) + m_req
            return {"ctr": tf.sigmoid(tf.reduce_sum(y, axis=1) + a_bias), "logit": a_bias}

        @tf.function(
            input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x"), tf.TensorSpec([None], tf.float32)]
        )
        def renamed(emb, bias):  # its keywords are the specs' names
            return {"ctr": tf.reduce_sum(tf.matmul(emb, self.w), axis=1) + bias}

        self.named, self.renamed = named, renamed


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sig") / "m")
    head = _Head()
    tf.saved_model.save(head, path, signatures={"named": head.named, "renamed": head.renamed})
    return tf.saved_model.load(path)


def _inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "z_emb": rng.normal(size=(n, 3)).astype(np.float32),
        "a_bias": rng.normal(size=n).astype(np.float32),
        "m_req": rng.normal(size=(1, 4)).astype(np.float32),
    }


def test_flat_call_equals_the_keyword_call(loaded):
    fn = loaded.signatures["named"]
    call = SignatureCall(fn)
    assert call.flat  # this TensorFlow's signatures take the fast path
    for n in (1, 7, 300):
        x = _inputs(n, seed=n)
        got = call(x)
        want = fn(**{k: tf.constant(v) for k, v in x.items()})
        assert set(got) == {"ctr", "logit"}
        np.testing.assert_array_equal(got["ctr"].numpy(), want["ctr"].numpy())
        np.testing.assert_array_equal(got["logit"].numpy(), x["a_bias"])
        expect = 1 / (
            1 + np.exp(-((x["z_emb"] @ (np.arange(12).reshape(3, 4) / 10) + x["m_req"]).sum(1) + x["a_bias"]))
        )
        np.testing.assert_allclose(got["ctr"].numpy(), expect, rtol=1e-5)


def test_inputs_are_cast_to_the_signature_dtype(loaded):
    call = SignatureCall(loaded.signatures["named"])
    x = _inputs(5)
    got = call({k: v.astype(np.float64) for k, v in x.items()})["ctr"].numpy()
    np.testing.assert_array_equal(got, call(x)["ctr"].numpy())


def test_a_missing_or_extra_input_is_named(loaded):
    call = SignatureCall(loaded.signatures["named"])
    x = _inputs(2)
    with pytest.raises(TypeError, match=r"missing \['m_req'\]"):
        call({k: v for k, v in x.items() if k != "m_req"})
    with pytest.raises(TypeError, match=r"unexpected \['other'\]"):
        call({**x, "other": x["a_bias"]})


class _NoFlatEntry:
    """A loaded signature as a TensorFlow without ``ConcreteFunction._call_flat`` would show it."""

    def __init__(self, fn):
        self._fn = fn
        self.inputs, self.captured_inputs = fn.inputs, fn.captured_inputs
        self.structured_input_signature = fn.structured_input_signature

    def __call__(self, **kw):
        return self._fn(**kw)


def test_a_signature_named_by_its_tensor_specs_is_called_flat(loaded):
    fn = loaded.signatures["renamed"]  # a signature's keywords are its TensorSpecs' names: "x", "bias"
    call = SignatureCall(fn)
    assert call.flat
    emb, bias = np.ones((4, 3), np.float32), np.arange(4, dtype=np.float32)
    got = call({"x": emb, "bias": bias})["ctr"].numpy()
    np.testing.assert_allclose(got, (emb @ (np.arange(12).reshape(3, 4) / 10)).sum(1) + bias, rtol=1e-6)


def test_without_the_flat_entry_the_keyword_call_is_taken(loaded):
    fn = loaded.signatures["named"]
    call = SignatureCall(_NoFlatEntry(fn))
    assert not call.flat
    x = _inputs(6)
    np.testing.assert_array_equal(call(x)["ctr"].numpy(), SignatureCall(fn)(x)["ctr"].numpy())


def test_the_direct_entry_is_taken_and_equals_the_flat_call(loaded):
    fn = loaded.signatures["named"]
    call = SignatureCall(fn)
    assert call.direct  # this TensorFlow's loaded signatures pass the probe
    for n in (1, 5, 257):
        x = _inputs(n, seed=10 + n)
        got = call(x)
        want = fn._call_flat([tf.constant(x[k]) for k in sorted(x)], fn.captured_inputs)
        assert set(got) == set(want) == {"ctr", "logit"}
        for k in want:
            np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())


class _WrongOutputs:
    """A loaded signature whose inference entry answers its outputs in another order than their sorted keys."""

    def __init__(self, fn):
        self._fn = fn
        self.inputs, self.captured_inputs = fn.inputs, fn.captured_inputs
        self.structured_input_signature, self.structured_outputs = fn.structured_input_signature, fn.structured_outputs
        self._inference_function = self
        self._call_flat = fn._call_flat

    def call_flat(self, *args):
        return list(reversed(self._fn._inference_function.call_flat(*args)))


def test_a_direct_entry_that_disagrees_with_the_flat_call_is_not_taken(loaded):
    fn = loaded.signatures["named"]
    call = SignatureCall(_WrongOutputs(fn))
    assert call.flat and not call.direct
    x = _inputs(4)
    np.testing.assert_array_equal(call(x)["ctr"].numpy(), SignatureCall(fn)(x)["ctr"].numpy())

import numpy as np
import pytest
import tensorflow as tf

from offgraph.model.losses import LossKey, is_listwise, listwise_loss, make_loss_fn, pointwise_loss
from offgraph.modeldir.layout import LOSSES


def test_loss_keys_are_the_manifest_names():
    assert [k.value for k in LossKey] == list(LOSSES)
    assert all(make_loss_fn(name) is make_loss_fn(LossKey(name)) for name in LOSSES)


def batch():
    rng = np.random.default_rng(3)
    labels = tf.constant(rng.integers(0, 2, 12).astype(np.float32))
    logits = tf.constant(rng.normal(size=12).astype(np.float32))
    segments = tf.constant(np.repeat(np.arange(4, dtype=np.int32), 3))
    return labels, logits, segments


def test_each_key_is_its_loss():
    y, z, seg = batch()
    pw, lw = float(pointwise_loss(y, z)), float(listwise_loss(y, z, seg, 4))
    assert float(make_loss_fn("pointwise")(y, z, seg)) == pw
    assert float(make_loss_fn("listwise")(y, z, seg)) == lw
    assert float(make_loss_fn(LossKey.BOTH)(y, z, seg)) == pytest.approx(pw + lw, rel=1e-6)
    assert pw != lw


def test_listwise_keys_batch_by_request():
    assert [is_listwise(k) for k in LossKey] == [False, True, True]


def test_unknown_loss_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown loss 'hinge'.*pointwise"):
        make_loss_fn("hinge")

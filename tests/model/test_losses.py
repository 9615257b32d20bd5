"""Each loss against a value worked out by hand on a tiny batch (the arithmetic in the comments)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from offgraph.model.losses import (
    PAIR_ROWS_MAX,
    LossKey,
    is_listwise,
    lambdarank_loss,
    listwise_loss,
    make_loss_fn,
    pairwise_loss,
    pointwise_loss,
    uses_pairs,
)
from offgraph.modeldir.layout import LOSSES

LN2, LN1_5, INV_LOG2_3 = math.log(2.0), math.log(1.5), 1.0 / math.log2(3.0)


def test_loss_keys_are_the_manifest_names():
    assert [k.value for k in LossKey] == list(LOSSES)
    assert all(make_loss_fn(name) is make_loss_fn(LossKey(name)) for name in LOSSES)


def graded_batch():
    """Three lists in one batch:
    list 0: labels [2, 1, 0], logits [ln 2, 0, 0]   (graded, the last two scores tied)
    list 1: labels [0, 0],    logits [3, -1]        (gains of zero only)
    list 2: labels [1],       logits [5]            (one item)"""
    labels = tf.constant([2.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    logits = tf.constant([LN2, 0.0, 0.0, 3.0, -1.0, 5.0])
    segments = tf.constant([0, 0, 0, 1, 1, 2], tf.int32)
    return labels, logits, segments


# pointwise: labels binarised (> 0) -> [1, 1, 0, 0, 0, 1]; CE(y=1, z) = ln(1 + e^-z), CE(y=0, z) = ln(1 + e^z)
#   row 0: ln(1 + 1/2) = ln 1.5; row 1: ln 2; row 2: ln 2; row 3: ln(1 + e^3); row 4: ln(1 + e^-1); row 5: ln(1 + e^-5)
POINTWISE = (LN1_5 + 2 * LN2 + math.log1p(math.e**3) + math.log1p(math.e**-1) + math.log1p(math.e**-5)) / 6
# listwise: list 0's gains 2^g - 1 = [3, 1, 0] -> targets [3/4, 1/4, 0]; softmax of [ln 2, 0, 0] = [2, 1, 1] / 4
#   -> -(3/4 ln(1/2) + 1/4 ln(1/4)) = (3/4 + 2/4) ln 2 = 1.25 ln 2
#   list 1 has no gain: left out; list 2: its one item takes all the softmax: -1 * ln 1 = 0
#   mean over the two lists with a gain: 1.25 ln 2 / 2
LISTWISE = 1.25 * LN2 / 2
# pairwise: list 0's pairs with label_i > label_j: (0,1), (0,2), (1,2); list 1: equal labels, no pair; list 2: none
#   ln(1 + e^-(s_i - s_j)): (0,1): ln(1 + e^-ln2) = ln 1.5; (0,2): ln 1.5; (1,2), a tie: ln(1 + e^0) = ln 2
PAIRWISE = (2 * LN1_5 + LN2) / 3
# lambdarank: list 0 ranked by the logits, the tie in batch order: row 0 first, row 1 second, row 2 third,
#   discounts 1/log2(1 + rank) = [1, 1/log2 3, 1/2]; the ideal order by gain [3, 1, 0] is the same places:
#   IDCG = 3 * 1 + 1 * (1/log2 3) + 0 * 1/2 = 3 + 1/log2 3
#   |delta NDCG| = |G_i - G_j| * |D_i - D_j| / IDCG:
#   (0,1): 2 * (1 - 1/log2 3); (0,2): 3 * (1 - 1/2) = 1.5; (1,2): 1 * (1/log2 3 - 1/2)  (each / IDCG)
IDCG0 = 3 + INV_LOG2_3
W01, W02, W12 = 2 * (1 - INV_LOG2_3) / IDCG0, 1.5 / IDCG0, (INV_LOG2_3 - 0.5) / IDCG0
LAMBDARANK = (W01 * LN1_5 + W02 * LN1_5 + W12 * LN2) / 3


def test_each_loss_by_hand():
    y, z, seg = graded_batch()
    assert float(pointwise_loss(y, z)) == pytest.approx(POINTWISE, rel=1e-6)
    assert float(listwise_loss(y, z, seg)) == pytest.approx(LISTWISE, rel=1e-6)
    assert float(listwise_loss(y, z, seg, 3)) == pytest.approx(LISTWISE, rel=1e-6)
    assert float(pairwise_loss(y, z, seg)) == pytest.approx(PAIRWISE, rel=1e-6)
    assert float(lambdarank_loss(y, z, seg)) == pytest.approx(LAMBDARANK, rel=1e-6)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("pointwise", POINTWISE),
        ("listwise", LISTWISE),
        ("pairwise", PAIRWISE),
        ("lambdarank", LAMBDARANK),
        ("both", POINTWISE + LISTWISE),
        ("pointwise+pairwise", POINTWISE + PAIRWISE),
        ("pointwise+lambdarank", POINTWISE + LAMBDARANK),
    ],
)
def test_each_key_is_its_loss(key, expected):
    assert float(make_loss_fn(key)(*graded_batch())) == pytest.approx(expected, rel=1e-6)


def test_binary_labels_give_the_listwise_loss_as_before_grades():
    # one list labels [1, 0, 1], logits [0, 0, ln 2]: softmax [1, 1, 2] / 4; the two positives share the target
    #   -> -(1/2 ln(1/4) + 1/2 ln(1/2)) = (2 + 1) / 2 ln 2 = 1.5 ln 2  (gain 2^1 - 1 = 1: the label itself)
    y = tf.constant([1.0, 0.0, 1.0])
    z = tf.constant([0.0, 0.0, LN2])
    assert float(listwise_loss(y, z, tf.zeros(3, tf.int32))) == pytest.approx(1.5 * LN2, rel=1e-6)


def test_a_batch_without_pairs_or_gains_costs_nothing():
    y, z = tf.constant([0.0, 0.0, 1.0]), tf.constant([1.0, -2.0, 0.5])
    seg = tf.constant([0, 0, 1], tf.int32)  # list 0: gains of zero; list 1: one item
    for loss in (pairwise_loss, lambdarank_loss):
        assert float(loss(y, z, seg)) == 0.0
    # listwise: list 1 alone, softmax of one item = 1: -ln 1 = 0
    assert float(listwise_loss(y, z, seg)) == 0.0


def test_lambdarank_gradient_by_hand():
    # d/ds of the lambdarank loss is the pairwise gradient with each pair scaled by its fixed weight:
    #   d/ds_i ln(1 + e^-(s_i - s_j)) = -sigmoid(-(s_i - s_j)); for list 0 of the batch above:
    #   sigmoid(-ln 2) = 1/3 (pairs (0,1), (0,2)); sigmoid(0) = 1/2 (pair (1,2)); all over the 3 pairs
    y, z, seg = graded_batch()
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = lambdarank_loss(y, z, seg)
    grad = tape.gradient(loss, z).numpy()
    expected = np.zeros(6)
    expected[0] = -(W01 + W02) / 3 / 3
    expected[1] = (W01 / 3 - W12 / 2) / 3
    expected[2] = (W02 / 3 + W12 / 2) / 3
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)


def test_listwise_keys_batch_by_request():
    assert [is_listwise(k) for k in LossKey] == [False, True, True, True, True, True, True]
    assert [uses_pairs(k) for k in LossKey] == [False, False, False, True, True, True, True]


def test_pairwise_losses_refuse_batches_over_their_bound():
    n = PAIR_ROWS_MAX + 1
    y, z, seg = tf.zeros(n), tf.zeros(n), tf.zeros(n, tf.int32)
    for key in ("pairwise", "lambdarank"):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"at most {PAIR_ROWS_MAX} rows"):
            make_loss_fn(key)(y, z, seg)


def test_unknown_loss_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown loss 'hinge'.*pointwise"):
        make_loss_fn("hinge")

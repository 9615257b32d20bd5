"""LazyAdam (``offgraph.model.sparse_optimizer``): a sparse gradient's rows follow the LazyAdam formula written
out here in NumPy (an index repeated in a batch is one row with its gradients summed), every other row of the
table and of its m and v slots stays bit-identical, and a dense gradient gets Keras Adam's update. The
DeepFM's table gradients arrive as ``tf.IndexedSlices``, so a training step touches only the rows it looked up."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from offgraph.features import parse_spec
from offgraph.model.losses import make_loss_fn
from offgraph.model.model import build_deepfm
from offgraph.model.sparse_optimizer import LazyAdam
from offgraph.model.train import OPTIMIZER_FACTORIES, TrainConfig, training_objective

LR, B1, B2, EPS = 0.01, 0.9, 0.999, 1e-7  # Keras Adam's defaults but the learning rate


def lazy_adam_rows(var, m, v, indices, values, t):
    """One LazyAdam step at global step t (from 1) on float64 copies: the rows ``indices`` look up only, each
    with the sum of its ``values``."""
    var, m, v = var.copy(), m.copy(), v.copy()
    g = np.zeros_like(var)
    np.add.at(g, indices, values)
    rows = np.unique(indices)
    m[rows] = B1 * m[rows] + (1 - B1) * g[rows]
    v[rows] = B2 * v[rows] + (1 - B2) * g[rows] ** 2
    alpha = LR * np.sqrt(1 - B2**t) / (1 - B1**t)
    var[rows] -= alpha * m[rows] / (np.sqrt(v[rows]) + EPS)
    return var, m, v


# (indices, with repeats) per step: rows 1 and 5 have moments after step 1 and are not looked up in step 2
STEPS = ([1, 2, 2, 5], [2, 7, 7, 7], [5, 1, 1, 0])


def test_looked_up_rows_follow_lazy_adam_and_the_others_stay_bit_identical():
    rng = np.random.default_rng(3)
    table0 = rng.normal(0, 0.1, (9, 3)).astype(np.float32)
    dense0 = rng.normal(0, 0.1, 4).astype(np.float32)
    table, dense = keras.Variable(table0, name="table"), keras.Variable(dense0, name="dense")
    # Keras Adam on the same gradients, for the dense variable (and to show it moves rows not looked up)
    adam_table, adam_dense = keras.Variable(table0, name="table"), keras.Variable(dense0, name="dense")
    lazy, adam = LazyAdam(LR), keras.optimizers.Adam(LR)
    ref = (table0.astype(np.float64), np.zeros((9, 3)), np.zeros((9, 3)))
    for t, indices in enumerate(STEPS, start=1):
        values = rng.normal(0, 1, (len(indices), 3)).astype(np.float32)
        dense_grad = rng.normal(0, 1, 4).astype(np.float32)
        before = [np.array(x) for x in (table, *lazy.moments(table))] if t > 1 else None
        sparse_grad = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([9, 3]))
        lazy.apply_gradients([(sparse_grad, table), (tf.constant(dense_grad), dense)])
        adam.apply_gradients([(sparse_grad, adam_table), (tf.constant(dense_grad), adam_dense)])

        ref = lazy_adam_rows(*ref, np.array(indices), values.astype(np.float64), t)
        m, v = lazy.moments(table)
        for got, want in zip((table, m, v), ref):
            np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-7)
        untouched = np.setdiff1d(np.arange(9), indices)
        if before is not None:
            for got, prev in zip((table, m, v), before):
                np.testing.assert_array_equal(np.array(got)[untouched], prev[untouched])
        never = np.setdiff1d(np.arange(9), np.concatenate(STEPS[:t]))
        np.testing.assert_array_equal(np.array(table)[never], table0[never])
        np.testing.assert_array_equal(np.array(m)[never], 0.0)
        np.testing.assert_array_equal(np.array(v)[never], 0.0)
        np.testing.assert_allclose(np.array(dense), np.array(adam_dense), rtol=0, atol=1e-6)
        if t == 2:  # Adam proper moves row 1 by its momentum though step 2 did not look it up
            assert not np.array_equal(np.array(adam_table)[1], np.array(before[0])[1])


def test_amsgrad_is_refused():
    with pytest.raises(ValueError, match="amsgrad"):
        LazyAdam(LR, amsgrad=True)


def test_train_defaults_to_lazy_adam():
    assert TrainConfig().optimizer == "lazy_adam"
    assert isinstance(OPTIMIZER_FACTORIES[TrainConfig().optimizer](LR), LazyAdam)


SPEC = {
    "model": {"embedding_dim": 4, "mlp": [8], "l2_embedding": 1e-4},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user", "rows": 40},
        {"name": "tags", "scope": "item", "op": "id", "input": "tags", "rows": 30, "pooling": "sum"},
    ],
}


def _batch(rng, n=16):
    """Inputs of n rows: one user id each (repeats among the rows), up to 3 tags (a padded, masked slot)."""
    mask = (np.arange(3)[None, :] < rng.integers(1, 4, n)[:, None]).astype(np.float32)
    x = {
        "ids_0": rng.integers(0, 6, (n, 1)).astype(np.int32),
        "mask_0": np.ones((n, 1), np.float32),
        "ids_1": (rng.integers(10, 15, (n, 3)) * mask).astype(np.int32),  # padding is row 0, masked out
        "mask_1": mask,
    }
    return x, rng.integers(0, 2, n).astype(np.float32)


def _gradients(model, x, y):
    """The training objective's gradients (``offgraph.model.train.training_objective``, pointwise loss)."""
    with tf.GradientTape() as tape:
        seg = np.zeros(len(y), np.int32)
        _, obj = training_objective(model, make_loss_fn("pointwise"), model.spec.model.l2_embedding, x, y, seg)
    return tape.gradient(obj, model.trainable_variables)


def _stepper(model, opt):
    @tf.function
    def step(x, y):
        opt.apply_gradients(zip(_gradients(model, x, y), model.trainable_variables))

    return step


def _tables(model):
    return [t.embeddings for t in model.front.emb_tables + model.front.w_tables]


def test_deepfm_steps_touch_only_the_rows_their_batch_looked_up():
    keras.utils.set_random_seed(0)
    model = build_deepfm(parse_spec(SPEC, source="test"))
    rng = np.random.default_rng(5)
    x, y = _batch(rng)
    grads = dict(zip((v.path for v in model.trainable_variables), _gradients(model, x, y)))
    for t in _tables(model):  # the lookup keeps the table's gradient sparse: the rows of the batch, not the table
        assert isinstance(grads[t.path], tf.IndexedSlices), t.path

    lazy = LazyAdam(LR)
    step = _stepper(model, lazy)
    step(x, y)
    x2, y2 = _batch(rng)
    x2["ids_0"][:] = 5  # one user looked up by every row; users 0..4 (looked up before) now are not
    before = {t.path: [np.array(a) for a in (t, *lazy.moments(t))] for t in _tables(model)}
    step(x2, y2)
    for group in (model.front.emb_tables, model.front.w_tables):
        for f, layer in enumerate(group):
            t, ids, mask = layer.embeddings, x2[f"ids_{f}"], x2[f"mask_{f}"]
            untouched = np.setdiff1d(np.arange(t.shape[0]), ids)  # a masked slot's row 0 is gathered too
            for got, prev in zip((t, *lazy.moments(t)), before[t.path]):
                np.testing.assert_array_equal(np.array(got)[untouched], prev[untouched], err_msg=t.path)
            present = np.unique(ids[mask > 0])  # rows with a gradient: each moved
            assert np.all(np.any(np.array(t)[present] != before[t.path][0][present], axis=1)), t.path
        # users 0..4 had moments before this step, which Adam proper would have used to move them
        assert np.all(np.any(before[group[0].embeddings.path][1][:5] != 0, axis=1))


def test_deepfm_rows_looked_up_every_step_train_as_with_keras_adam():
    """Where every step looks up the same rows, each once (Keras Adam squares a repeated row's slices one by
    one before summing them, LazyAdam squares their sum, the dense gradient's), the two agree, head included."""
    keras.utils.set_random_seed(0)
    spec = parse_spec(SPEC, source="test")
    model, twin = build_deepfm(spec), build_deepfm(spec)
    twin.set_weights(model.get_weights())
    n = 12
    x = {
        "ids_0": np.arange(n, dtype=np.int32)[:, None],
        "mask_0": np.ones((n, 1), np.float32),
        "ids_1": np.arange(10, 10 + n, dtype=np.int32)[:, None],
        "mask_1": np.ones((n, 1), np.float32),
    }
    y = np.random.default_rng(2).integers(0, 2, n).astype(np.float32)
    step, twin_step = _stepper(model, LazyAdam(LR)), _stepper(twin, keras.optimizers.Adam(LR))
    head0 = [np.array(w) for w in model.head.weights]
    for _ in range(3):
        step(x, y)
        twin_step(x, y)
    for a, b in zip(model.weights, twin.weights):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6, err_msg=a.path)
    assert all(not np.array_equal(np.array(w), w0) for w, w0 in zip(model.head.weights, head0))  # it trained

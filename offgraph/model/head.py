"""The dense head of DeepFM: bias + first-order sum + FM + MLP on pooled embeddings.

It takes exactly the tensors the server feeds: ``emb`` [N, F, D] and
``first_order`` [N, F], and with numeric fields (``num_dense`` = k > 0) ``dense`` [N, k],
and returns the logit [N]. The exporter saves it unchanged as the dense-only SavedModel.

Numeric values enter as dense inputs, not as scaled embeddings (value x a field's one row,
in the FM): each gets a learned first-order weight (w_j x_j in the first-order sum) and is
concatenated to the MLP's input, which can learn a non-linear effect and its interactions
with every field. A scaled embedding makes every interaction of the field linear in the
value (and flips its sign for the half of a standardized column below the mean), and would
need a 1-row "table" in the store per field; the dense input needs no store change and is
the [N, k] signature input of the reference design.

For one candidate with pooled embeddings v_f in R^D and first-order weights w_f:
  first = sum_f w_f
  fm    = 0.5 * sum_d [ (sum_f v_fd)^2 - sum_f v_fd^2 ]   (= sum of pairwise dot products)
  logit = b + first + fm + MLP(concat_f v_f)
(the maths in Keras ops, backend-neutral: ``fm_term``, ``first_order_term``, ``masked_pool``).
"""

from __future__ import annotations

import keras
from keras import layers, ops

__all__ = ["DeepFMHead", "fm_term", "first_order_term", "masked_pool"]


def fm_term(emb):
    """emb [N, F, D] -> [N]: sum over field pairs of <v_i, v_j>, in O(F*D)."""
    s = ops.sum(emb, axis=1)
    sq = ops.sum(emb * emb, axis=1)
    return 0.5 * ops.sum(s * s - sq, axis=1)


def first_order_term(first_order):
    """first_order [N, F] -> [N]."""
    return ops.sum(first_order, axis=1)


def masked_pool(vectors, mask, mode: str):
    """vectors [N, L, K], mask [N, L] (1 = value present) -> [N, K]; no value -> zeros. A ``recency`` field's mask
    holds each value's weight (``offgraph.model.inputs``: ``recency_weights``, summing to 1 a row), so the mean's
    sum divided by max(sum of the weights, 1) is the weighted mean."""
    m = ops.expand_dims(mask, -1)
    total = ops.sum(vectors * m, axis=1)
    if mode == "sum":
        return total
    count = ops.sum(mask, axis=1, keepdims=True)
    return total / ops.maximum(count, 1.0)


class DeepFMHead(keras.Model):
    def __init__(
        self,
        num_fields: int,
        dim: int,
        mlp: tuple[int, ...],
        dropout: float = 0.0,
        l2_dense: float = 0.0,
        num_dense: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_fields, self.dim, self.num_dense = num_fields, dim, num_dense
        reg = keras.regularizers.L2(l2_dense) if l2_dense > 0 else None
        self.flatten = layers.Reshape((num_fields * dim,))
        self.hidden = [
            layers.Dense(u, activation="relu", kernel_regularizer=reg, name=f"mlp_{i}") for i, u in enumerate(mlp)
        ]
        self.drop = [layers.Dropout(dropout) for _ in mlp] if dropout > 0 else []
        self.out_unit = layers.Dense(1, kernel_regularizer=reg, name="mlp_out")
        self.bias = self.add_weight(name="bias", shape=(), initializer="zeros")
        # only with numeric fields: a model without them keeps its weights file's layout
        self.dense_w = self.add_weight(name="dense_w", shape=(num_dense,), initializer="zeros") if num_dense else None

    def build(self, input_shape=None):
        # Build sublayers eagerly so weights exist before the first call.
        x = (self.num_fields * self.dim + self.num_dense,)
        for layer in self.hidden:
            layer.build((None,) + x)
            x = (layer.units,)
        self.out_unit.build((None,) + x)
        self.built = True

    def call(self, inputs, training=False):
        emb, first_order = inputs[0], inputs[1]
        deep = self.flatten(emb)
        first = first_order_term(first_order)
        if self.num_dense:
            dense = inputs[2]
            deep = ops.concatenate([deep, dense], axis=1)
            first = first + ops.sum(dense * self.dense_w, axis=1)
        for i, layer in enumerate(self.hidden):
            deep = layer(deep)
            if self.drop:
                deep = self.drop[i](deep, training=training)
        deep = ops.squeeze(self.out_unit(deep), -1)
        return self.bias + first + fm_term(emb) + deep

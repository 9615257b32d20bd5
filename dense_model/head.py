"""The dense head of DeepFM: bias + first-order sum + FM + MLP on pooled embeddings.

It takes exactly the tensors the server feeds: ``emb`` [N, F, D] and
``first_order`` [N, F], and returns the logit [N]. The exporter saves it
unchanged as the dense-only SavedModel.
"""
from __future__ import annotations

import keras
from keras import layers, ops

from dense_model import head_impl


class DeepFMHead(keras.Model):
    def __init__(self, num_fields: int, dim: int, mlp: tuple[int, ...], dropout: float = 0.0,
                 l2_dense: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_fields, self.dim = num_fields, dim
        reg = keras.regularizers.L2(l2_dense) if l2_dense > 0 else None
        self.flatten = layers.Reshape((num_fields * dim,))
        self.hidden = [layers.Dense(u, activation="relu", kernel_regularizer=reg, name=f"mlp_{i}")
                       for i, u in enumerate(mlp)]
        self.drop = [layers.Dropout(dropout) for _ in mlp] if dropout > 0 else []
        self.out_unit = layers.Dense(1, kernel_regularizer=reg, name="mlp_out")
        self.bias = self.add_weight(name="bias", shape=(), initializer="zeros")

    def build(self, input_shape=None):
        # Build sublayers eagerly so weights exist before the first call.
        x = (self.num_fields * self.dim,)
        for layer in self.hidden:
            layer.build((None,) + x)
            x = (layer.units,)
        self.out_unit.build((None,) + x)
        self.built = True

    def call(self, inputs, training=False):
        emb, first_order = inputs
        deep = self.flatten(emb)
        for i, layer in enumerate(self.hidden):
            deep = layer(deep)
            if self.drop:
                deep = self.drop[i](deep, training=training)
        deep = ops.squeeze(self.out_unit(deep), -1)
        return (self.bias + head_impl.first_order_term(first_order)
                + head_impl.fm_term(emb) + deep)

"""The lookup-and-pool front of DeepFM: one embedding table and one 1-wide
first-order table per field, masked mean/sum pooling.

Inputs per field ``f``: ``ids_f`` [N, L_f] int and ``mask_f`` [N, L_f] float
(1 where a value is present). Outputs ``emb`` [N, F, D] and ``first_order``
[N, F] -- the dense head's inputs. The exporter reads the tables by name:
``emb_<field>`` and ``w_<field>``.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers, ops

from offgraph.features.spec import FeatureSpec
from offgraph.model.head import masked_pool


def table_names(field_name: str) -> tuple[str, str]:
    return f"emb_{field_name}", f"w_{field_name}"


def lookup(table: layers.Embedding, ids):
    """Rows ``ids`` of ``table``: a gather on its variable itself (TensorFlow's ResourceGather), whose gradient is
    a ``tf.IndexedSlices`` of those rows. Calling the ``Embedding`` would read the whole table as a tensor first,
    which TensorFlow copies whole once the variable has had scatter updates (its copy-on-read mode, as
    ``LazyAdam`` gives it), so a step would cost the table's size (``bench/results/train-step/``)."""
    return tf.gather(table.embeddings.value, ids)


class EmbeddingFront(keras.Model):
    def __init__(self, spec: FeatureSpec, init_scale: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        d = spec.model.embedding_dim
        init = keras.initializers.RandomNormal(stddev=init_scale)
        self.emb_tables = [
            layers.Embedding(f.rows, d, embeddings_initializer=init, name=table_names(f.name)[0]) for f in spec.fields
        ]
        self.w_tables = [
            layers.Embedding(f.rows, 1, embeddings_initializer="zeros", name=table_names(f.name)[1])
            for f in spec.fields
        ]
        self.poolings = [f.pooling for f in spec.fields]

    def build(self, input_shape=None):
        for t in self.emb_tables + self.w_tables:
            t.build((None,))
        self.built = True

    def call(self, inputs):
        """inputs: dict with ids_<i> and mask_<i> per field index i. Returns (emb, first, raw_rows)."""
        embs, firsts, sq = [], [], 0.0
        for i, (et, wt, mode) in enumerate(zip(self.emb_tables, self.w_tables, self.poolings)):
            ids, mask = inputs[f"ids_{i}"], inputs[f"mask_{i}"]
            v = lookup(et, ids)  # [N, L, D]
            w = lookup(wt, ids)  # [N, L, 1]
            embs.append(masked_pool(v, mask, mode))
            firsts.append(ops.squeeze(masked_pool(w, mask, mode), -1))
            sq = sq + ops.sum(ops.sum(v * v, axis=-1) * mask) + ops.sum(ops.squeeze(w * w, -1) * mask)
        return ops.stack(embs, axis=1), ops.stack(firsts, axis=1), sq

"""Save the dense head as a SavedModel with one serving signature (``server.dense`` loads it).

Signature ``serving_default``: ``emb`` float32 [None, F, D] and ``first_order``
float32 [None, F] -> ``ctr`` float32 [None] (sigmoid, before calibration) and
``logit`` float32 [None]. It holds no embedding table.
"""
from __future__ import annotations

from pathlib import Path

import tensorflow as tf

SIGNATURE = "serving_default"


class _DenseServing(tf.Module):
    def __init__(self, head, num_fields: int, dim: int):
        super().__init__(name="offgraph_dense")
        self.head = head

        @tf.function(input_signature=[tf.TensorSpec([None, num_fields, dim], tf.float32, name="emb"),
                                      tf.TensorSpec([None, num_fields], tf.float32, name="first_order")])
        def serve(emb, first_order):
            logit = self.head((emb, first_order), training=False)
            return {"ctr": tf.sigmoid(logit), "logit": logit}

        self.serve = serve


def save_dense(head, num_fields: int, dim: int, path: Path) -> dict:
    module = _DenseServing(head, num_fields, dim)
    tf.saved_model.save(module, str(path), signatures={SIGNATURE: module.serve})
    return {
        "name": SIGNATURE,
        "inputs": {"emb": {"dtype": "float32", "shape": [None, num_fields, dim]},
                   "first_order": {"dtype": "float32", "shape": [None, num_fields]}},
        "outputs": {"ctr": {"dtype": "float32", "shape": [None]}, "logit": {"dtype": "float32", "shape": [None]}},
    }


"""Save the dense head as a SavedModel with one serving signature (``offgraph.modeldir.dense`` loads it).

Signature ``serving_default``: ``emb`` float32 [None, F, D] and ``first_order``
float32 [None, F] (and ``dense`` float32 [None, k] when the model has k numeric fields) ->
``ctr`` float32 [None] (sigmoid, before calibration) and ``logit`` float32 [None]. It holds no
embedding table.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from offgraph.modeldir.layout import SIGNATURE


class _DenseServing(tf.Module):
    def __init__(self, head, num_fields: int, dim: int, num_dense: int = 0):
        super().__init__(name="offgraph_dense")
        self.head = head
        emb_spec = tf.TensorSpec([None, num_fields, dim], tf.float32, name="emb")
        fo_spec = tf.TensorSpec([None, num_fields], tf.float32, name="first_order")
        if num_dense:

            @tf.function(
                input_signature=[emb_spec, fo_spec, tf.TensorSpec([None, num_dense], tf.float32, name="dense")]
            )
            def serve(emb, first_order, dense):
                logit = self.head((emb, first_order, dense), training=False)
                return {"ctr": tf.sigmoid(logit), "logit": logit}
        else:  # the signature of models without numeric fields, unchanged

            @tf.function(input_signature=[emb_spec, fo_spec])
            def serve(emb, first_order):
                logit = self.head((emb, first_order), training=False)
                return {"ctr": tf.sigmoid(logit), "logit": logit}

        self.serve = serve


def save_dense(head, num_fields: int, dim: int, path: Path, num_dense: int = 0) -> dict:
    module = _DenseServing(head, num_fields, dim, num_dense)
    tf.saved_model.save(module, str(path), signatures={SIGNATURE: module.serve})
    inputs = {
        "emb": {"dtype": "float32", "shape": [None, num_fields, dim]},
        "first_order": {"dtype": "float32", "shape": [None, num_fields]},
    }
    if num_dense:
        inputs["dense"] = {"dtype": "float32", "shape": [None, num_dense]}
    return {
        "name": SIGNATURE,
        "inputs": inputs,
        "outputs": {"ctr": {"dtype": "float32", "shape": [None]}, "logit": {"dtype": "float32", "shape": [None]}},
    }

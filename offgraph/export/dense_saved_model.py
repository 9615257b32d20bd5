"""Save the dense head as a SavedModel (``offgraph.modeldir.dense`` loads it).

Signature ``serving_default``: ``emb`` float32 [None, F, D] and ``first_order``
float32 [None, F] (and ``dense`` float32 [None, k] when the model has k numeric fields) ->
``ctr`` float32 [None] (sigmoid, before calibration) and ``logit`` float32 [None]. It holds no
embedding table.

Signature ``split`` (written when the spec has request-scope fields, recorded as the manifest's
``dense.split``): the request part once, ``req_emb`` [1, F_r, D] and ``req_first_order`` [1, F_r],
and the candidates', ``cand_emb`` [None, F_c, D] and ``cand_first_order`` [None, F_c] (and ``dense``),
fields in spec order within each part -> the same ``ctr`` and ``logit`` (``offgraph.model.split_head``).
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from offgraph.model.split_head import split_fields, split_kernel, split_logit
from offgraph.modeldir.layout import SIGNATURE, SPLIT_SIGNATURE


def _outputs(logit) -> dict:
    return {"ctr": tf.sigmoid(logit), "logit": logit}


class _DenseServing(tf.Module):
    def __init__(self, head, num_fields: int, dim: int, num_dense: int = 0, request_fields=(), candidate_fields=()):
        super().__init__(name="offgraph_dense")
        self.head = head
        emb_spec = tf.TensorSpec([None, num_fields, dim], tf.float32, name="emb")
        fo_spec = tf.TensorSpec([None, num_fields], tf.float32, name="first_order")
        dense_spec = tf.TensorSpec([None, num_dense], tf.float32, name="dense")
        if num_dense:

            @tf.function(input_signature=[emb_spec, fo_spec, dense_spec])
            def serve(emb, first_order, dense):
                return _outputs(self.head((emb, first_order, dense), training=False))
        else:  # the signature of models without numeric fields, unchanged

            @tf.function(input_signature=[emb_spec, fo_spec])
            def serve(emb, first_order):
                return _outputs(self.head((emb, first_order), training=False))

        self.serve = serve
        self.split = None
        if not request_fields:
            return
        # the first layer's kernel split by field, gathered once here and held as constants of the split
        # graph: a version's head is never updated, and its variables stay the head's own
        kernels = split_kernel(head, request_fields, candidate_fields)

        def logit(*parts):
            return split_logit(self.head, [tf.constant(k) for k in kernels], *parts)

        fr, fc = len(request_fields), len(candidate_fields)
        part_specs = [
            tf.TensorSpec([1, fr, dim], tf.float32, name="req_emb"),
            tf.TensorSpec([1, fr], tf.float32, name="req_first_order"),
            tf.TensorSpec([None, fc, dim], tf.float32, name="cand_emb"),
            tf.TensorSpec([None, fc], tf.float32, name="cand_first_order"),
        ]
        if num_dense:

            @tf.function(input_signature=[*part_specs, dense_spec])
            def split(req_emb, req_first_order, cand_emb, cand_first_order, dense):
                parts = (req_emb, req_first_order, cand_emb, cand_first_order, dense)
                return _outputs(logit(*parts))
        else:

            @tf.function(input_signature=part_specs)
            def split(req_emb, req_first_order, cand_emb, cand_first_order):
                parts = (req_emb, req_first_order, cand_emb, cand_first_order)
                return _outputs(logit(*parts))

        self.split = split


_OUTPUTS = {"ctr": {"dtype": "float32", "shape": [None]}, "logit": {"dtype": "float32", "shape": [None]}}


def save_dense(
    head, num_fields: int, dim: int, path: Path, num_dense: int = 0, scopes: list[str] | None = None
) -> dict:
    """Save the SavedModel of ``head``; returns the manifest's ``dense`` record (without ``path``):
    ``signature``, and ``split`` when ``scopes`` (the fields', in spec order) has request fields."""
    req, cand = split_fields(scopes or [])
    module = _DenseServing(head, num_fields, dim, num_dense, req, cand)
    signatures = {SIGNATURE: module.serve}
    if module.split is not None:
        signatures[SPLIT_SIGNATURE] = module.split
    tf.saved_model.save(module, str(path), signatures=signatures)
    dense_input = {"dense": {"dtype": "float32", "shape": [None, num_dense]}} if num_dense else {}
    inputs = {
        "emb": {"dtype": "float32", "shape": [None, num_fields, dim]},
        "first_order": {"dtype": "float32", "shape": [None, num_fields]},
        **dense_input,
    }
    record: dict = {"signature": {"name": SIGNATURE, "inputs": inputs, "outputs": _OUTPUTS}}
    if module.split is not None:
        record["split"] = {
            "name": SPLIT_SIGNATURE,
            "request_fields": req,
            "candidate_fields": cand,
            "inputs": {
                "req_emb": {"dtype": "float32", "shape": [1, len(req), dim]},
                "req_first_order": {"dtype": "float32", "shape": [1, len(req)]},
                "cand_emb": {"dtype": "float32", "shape": [None, len(cand), dim]},
                "cand_first_order": {"dtype": "float32", "shape": [None, len(cand)]},
                **dense_input,
            },
            "outputs": _OUTPUTS,
        }
    return record

"""DeepFM built from a feature spec: front (tables + pooling) -> head (FM + MLP).

The full model shares the head's layers, so the exporter saves ``model.head``
unchanged and reads the tables out of ``model.front``.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
from keras import ops

from offgraph.features.spec import FeatureSpec, load_spec
from offgraph.model.front import EmbeddingFront
from offgraph.model.head import DeepFMHead

WEIGHTS_FILE = "model.weights.h5"
SPEC_FILE = "spec.yaml"
CONFIG_FILE = "train_config.json"
METRICS_FILE = "metrics.json"


class DeepFM(keras.Model):
    def __init__(self, spec: FeatureSpec, **kwargs):
        super().__init__(**kwargs)
        m = spec.model
        self.spec = spec
        self.front = EmbeddingFront(spec, name="front")
        self.head = DeepFMHead(
            len(spec.fields), m.embedding_dim, m.mlp, m.dropout, m.l2_dense, num_dense=len(spec.numeric), name="head"
        )
        self.front.build()
        self.head.build()
        self.built = True

    def call(self, inputs, training=False):
        logit, _ = self.logit_and_l2(inputs, training=training)
        return ops.sigmoid(logit)

    def logit_and_l2(self, inputs, training=False):
        """(logit [N], sum of squares of the looked-up table rows in the batch)."""
        emb, first, sq = self.front(inputs)
        head_in = (emb, first, inputs["dense"]) if self.spec.numeric else (emb, first)
        return self.head(head_in, training=training), sq


def predict_proba(model: DeepFM, x: dict, batch_size: int = 8192) -> np.ndarray:
    """Sigmoid outputs of the full Keras model on padded inputs ``x`` (ids_<i>/mask_<i>, and ``dense``
    with numeric fields)."""
    import numpy as np
    import tensorflow as tf

    fn = getattr(model, "_offgraph_predict", None)
    if fn is None:
        sig = {k: tf.TensorSpec([None] + list(v.shape[1:]), tf.as_dtype(v.dtype)) for k, v in x.items()}
        fn = tf.function(lambda xb: ops.sigmoid(model.logit_and_l2(xb, training=False)[0]), input_signature=[sig])
        model._offgraph_predict = fn
    n = len(next(iter(x.values())))
    out = [fn({k: v[s : s + batch_size] for k, v in x.items()}).numpy() for s in range(0, n, batch_size)]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def build_deepfm(spec: FeatureSpec) -> DeepFM:
    return DeepFM(spec)


def load_run(run_dir: str | Path) -> tuple[DeepFM, FeatureSpec, dict]:
    """Rebuild the trained model of a run directory: (model, spec, metrics)."""
    run_dir = Path(run_dir)
    for name in (SPEC_FILE, WEIGHTS_FILE):
        if not (run_dir / name).exists():
            raise ValueError(f"run {run_dir}: missing {name}; is this a directory written by `offgraph train`?")
    spec = load_spec(run_dir / SPEC_FILE)
    model = build_deepfm(spec)
    try:
        model.load_weights(run_dir / WEIGHTS_FILE)
    except ValueError as e:
        raise ValueError(f"run {run_dir}: weights do not match its spec.yaml: {e}") from None
    metrics_path = run_dir / METRICS_FILE
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    return model, spec, metrics

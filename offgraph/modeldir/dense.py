"""Load the dense head's SavedModel (written by ``offgraph.export.dense_saved_model``) for the request path."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from offgraph.modeldir.layout import SIGNATURE


def load_dense(path: Path):
    """(loaded object, signature function). Keep the object alive while the function is used."""
    loaded = tf.saved_model.load(str(path))
    return loaded, loaded.signatures[SIGNATURE]

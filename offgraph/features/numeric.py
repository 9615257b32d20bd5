"""Continuous inputs: the ``numeric`` field kind, raw numbers -> the dense float inputs [N, k].

A numeric field reads one raw column (request or item scope) and feeds one float, after its
``transform`` steps in the order listed:

- ``clip``: into ``clip: [lo, hi]``;
- ``log1p``: log(1 + x); a value <= -1 is a FeatureValueError (clip it first);
- ``standardize``: (x - mean) / std, with ``stats: {mean, std}`` computed by training on its
  training rows (never the held-out ones) and written into the run's spec, so the manifest
  carries them; it must come last (the statistics are of the values before it).

No value (missing key, None, NaN, "") is fed as ``missing`` (default 0.0: the training mean
once standardized), after the transforms. A number or numeric text is a value; a boolean, a
list or other text is a FeatureValueError (a 422 from the server) naming the field and row.

Where they go: the Keras DeepFM and the dense SavedModel take them as ``dense`` [N, k] beside
``emb`` [N, F, D] and ``first_order`` [N, F]: a learned weight each in the first-order sum, and
concatenated to the MLP's input (``offgraph.model.head``). They are not embedding fields: no table,
no row in the store (spec.numeric, not spec.fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from offgraph.features.ops import FeatureValueError, _numeric

TRANSFORMS = ("clip", "log1p", "standardize")


def pre_standardize(f, column: Sequence[Any]) -> np.ndarray:
    """float64 [n]: the column through the steps before ``standardize``; NaN where no value."""
    x = _numeric(f.name, column)
    for step in f.params.get("transform", []):
        if step == "clip":
            lo, hi = f.params["clip"]
            x = np.clip(x, lo, hi)
        elif step == "log1p":
            bad = np.flatnonzero(x <= -1)  # NaN compares False: no value stays no value
            if len(bad):
                raise FeatureValueError.in_row(
                    f.name,
                    int(bad[0]),
                    f"log1p needs a value > -1, got {x[bad[0]]!r} (clip it first: transform: [clip, log1p])",
                )
            x = np.log1p(x)
    return x


def finish(f, x: np.ndarray) -> np.ndarray:
    """float32 [n]: pre-standardized values -> what the model is fed (standardized, no value -> missing)."""
    if "standardize" in f.params.get("transform", []):
        stats = f.params.get("stats")
        if stats is None:
            raise ValueError(
                f"field '{f.name}': standardize has no statistics (stats: {{mean, std}}); "
                "training computes them, a spec for serving must carry them"
            )
        x = (x - stats["mean"]) / stats["std"]
    return np.where(np.isnan(x), f.params.get("missing", 0.0), x).astype(np.float32)


def numeric_values(f, column: Sequence[Any]) -> np.ndarray:
    """float32 [n]: a raw column -> the field's model input (one definition for training and serving)."""
    return finish(f, pre_standardize(f, column))


def fit_stats(x: np.ndarray, name: str) -> dict:
    """Mean and std of pre-standardized training values (no value left out); std 1 for a constant column."""
    v = x[~np.isnan(x)]
    if len(v) == 0:
        raise ValueError(f"field '{name}': no training row has a value to standardize with")
    std = float(v.std())
    return {"mean": float(v.mean()), "std": std if std > 0 else 1.0}

"""Pooling of multi-valued fields with NumPy (the serving side of the Keras front's pooling).

mean: sum of the rows' vectors / number of values; sum: the plain sum; a row
with no value pools to zeros (vector and first-order weight).
"""

from __future__ import annotations

import numpy as np


def pool_numpy(values: np.ndarray, offsets: np.ndarray, mode: str) -> np.ndarray:
    """values [total, ...] pooled per segment ``offsets`` [n+1] -> [n, ...] float32."""
    if mode not in ("mean", "sum"):
        raise ValueError(f"unknown pooling {mode!r}: expected 'mean' or 'sum'")
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    out = np.zeros((n,) + values.shape[1:], dtype=np.float32)
    if len(values) == 0:
        return out
    if np.all(lengths == 1):
        out[:] = values
    else:
        seg = np.repeat(np.arange(n), lengths)
        np.add.at(out, seg, values)
    if mode == "mean":
        denom = np.maximum(lengths, 1).astype(np.float32)
        out /= denom.reshape((n,) + (1,) * (values.ndim - 1))
    return out

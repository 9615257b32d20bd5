"""Pooling of multi-valued fields with NumPy (the serving side of the Keras front's pooling).

mean: sum of the rows' vectors / number of values; sum: the plain sum; recency (a history listed oldest
first): a weighted mean whose weights halve every ``half_life`` values back from the most recent,
``recency_weights``. A row with no value pools to zeros (vector and first-order weight).
"""

from __future__ import annotations

import numpy as np

POOLING_MODES = ("mean", "sum", "recency")


def recency_weights(lengths: np.ndarray, half_life: float) -> np.ndarray:
    """Each value's weight in its row, flat in row order (rows of ``lengths`` values, oldest first): the value
    k places before the row's last has 2^(-k / half_life), divided by the row's total, so a row's weights sum
    to 1 (a weighted mean). float32, computed in float64. The one definition of the weighting: the Keras
    inputs (``offgraph.model.inputs``), the scorer (``offgraph.scoring.batch.pool_rows``), stream training
    and ``pool_numpy`` all take it from here."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.float32)
    ends = np.cumsum(lengths)
    row = np.repeat(np.arange(len(lengths)), lengths)
    back = (ends[row] - 1 - np.arange(total)).astype(np.float64)  # places before the row's last value
    rate = -np.log(2.0) / float(half_life)  # log of the decay per place
    # the row's total, a geometric series 1 + d + ... + d^(len - 1) = (1 - d^len) / (1 - d), by expm1: exact
    # to rounding for a long half-life too (d near 1)
    z = np.expm1(rate * lengths[row].astype(np.float64)) / np.expm1(rate)
    return (np.exp(rate * back) / z).astype(np.float32)


def pool_numpy(values: np.ndarray, offsets: np.ndarray, mode: str, half_life: float | None = None) -> np.ndarray:
    """values [total, ...] pooled per segment ``offsets`` [n+1] -> [n, ...] float32 (``half_life``: recency's)."""
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling {mode!r}: expected one of {list(POOLING_MODES)}")
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    out = np.zeros((n,) + values.shape[1:], dtype=np.float32)
    if len(values) == 0:
        return out
    if mode == "recency":
        if half_life is None:
            raise ValueError("recency pooling needs a half_life")
        values = values * recency_weights(lengths, half_life).reshape((-1,) + (1,) * (values.ndim - 1))
    if np.all(lengths == 1):
        out[:] = values
    else:
        seg = np.repeat(np.arange(n), lengths)
        np.add.at(out, seg, values)
    if mode == "mean":
        denom = np.maximum(lengths, 1).astype(np.float32)
        out /= denom.reshape((n,) + (1,) * (values.ndim - 1))
    return out

"""Calibration after the sigmoid (part of the served model, recorded in the manifest).

p  = sigmoid(logit(p) + b)    (the streamed bias offset b, when the stream trainer has moved the bias: the store's
                               bias row, ``offgraph.store.keys.BIAS_TABLE``; 0 until then, and then no step)
p  = sigmoid(logit_scale * logit(p) + logit_shift)   (Platt scaling: a listwise model's fit, offgraph.model.platt)
p' = p / (p + (1 - p) / r)   (negative down-sampling correction, kept negative rate r)
p'' = min(1, scale * p'^power)

The Platt step reads the logit back from the float32 sigmoid (``logit_of``), on every path alike (the
server, ``offgraph check``'s Keras side, the fit itself), so they agree to float rounding.
"""

from __future__ import annotations

import numpy as np

from offgraph.features.spec import Calibration

SCORE_KINDS = ("ctr", "ranking")
"""What a served score is: "ctr", a calibrated probability of a positive; "ranking", a score that orders one
request's candidates but is not a probability (a listwise model without a fitted calibration)."""

_P_EDGE = float(np.finfo(np.float32).eps) / 2
"""The sigmoid's float32 output is 0 or 1 beyond |logit| ~ 17: read it as this far from the edge."""


def logit_of(p: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)) in float64 of sigmoid outputs, the edges 0 and 1 clipped to finite logits."""
    p = np.clip(np.asarray(p, dtype=np.float64), _P_EDGE, 1.0 - _P_EDGE)
    return np.log(p) - np.log1p(-p)


def platt(p: np.ndarray, a: float, b: float) -> np.ndarray:
    """sigmoid(a * logit(p) + b), float64."""
    z = a * logit_of(p) + b
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the sigmoid without overflow in exp


def calibrate(p: np.ndarray, c: Calibration, bias_offset: float = 0.0) -> np.ndarray:
    """The served scores of the head's sigmoid outputs ``p``; ``bias_offset``: the streamed bias row's (module doc)."""
    p = np.asarray(p, dtype=np.float64)
    if bias_offset != 0.0:
        p = platt(p, 1.0, bias_offset)
    if c.identity:
        return p.astype(np.float32)
    if c.platt:
        p = platt(p, c.logit_scale, c.logit_shift)
    if c.negative_rate != 1.0:
        p = p / (p + (1.0 - p) / c.negative_rate)
    if c.scale != 1.0 or c.power != 1.0:
        p = np.minimum(1.0, c.scale * np.power(p, c.power))
    return p.astype(np.float32)


def score_kind(loss: str, c: Calibration) -> str:
    """A pointwise model's sigmoid is a CTR; a listwise one's (loss "listwise" or "both") only once a Platt step
    maps it to one (fitted by training on the validation rows, or declared in the spec): else "ranking"."""
    return "ctr" if loss == "pointwise" or c.platt else "ranking"

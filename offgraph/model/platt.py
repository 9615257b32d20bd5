"""Platt scaling: the calibration a listwise model is served with, fitted on its validation rows.

A listwise loss (softmax over one request's candidates) is blind to a shift of all of a request's
logits and to how peaked they are, so the sigmoid of its logit orders candidates but is no CTR. Two
numbers fix that: p = sigmoid(a * logit + b), fitted by maximum likelihood on labelled rows the model
was not fitted to (``model.calibration.logit_scale`` / ``logit_shift``, applied by
``offgraph.calibration.calibrate``). The fit is Newton's method with a backtracking line search on
Platt's smoothed targets (Lin, Lin & Weng 2007, "A note on Platt's probabilistic outputs"): finite
even on rows the scores separate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from offgraph.calibration import logit_of

MAX_ITERATIONS = 100
MIN_STEP = 1e-10


@dataclass(frozen=True)
class PlattFit:
    logit_scale: float  # a
    logit_shift: float  # b
    iterations: int


def _nll(z: np.ndarray, t: np.ndarray, a: float, b: float) -> float:
    """Cross-entropy of targets t under sigmoid(a z + b), summed (log1p(exp(-|f|)): no overflow)."""
    f = a * z + b
    return float(np.sum(np.logaddexp(0.0, f) - t * f))


def fit_platt(p: np.ndarray, labels: np.ndarray) -> PlattFit | None:
    """(a, b) maximising the likelihood of ``labels`` (0/1) under sigmoid(a * logit(p) + b), ``p`` the model's
    sigmoid outputs; None when there is nothing to fit (fewer than two classes) or the fit would reverse the
    model's order (a <= 0: the scores rank the rows backwards)."""
    y = np.asarray(labels, dtype=np.float64)
    n_pos = float(y.sum())
    n_neg = float(len(y) - n_pos)
    if n_pos == 0 or n_neg == 0:
        return None
    z = logit_of(p)
    t = np.where(y > 0.5, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))  # Platt's smoothed targets
    a, b = 0.0, float(np.log((n_pos + 1.0) / (n_neg + 1.0)))  # start: the prior, flat in z
    loss = _nll(z, t, a, b)
    it = 0
    for it in range(1, MAX_ITERATIONS + 1):  # noqa: B007 (read after the loop)
        q = 0.5 * (1.0 + np.tanh(0.5 * (a * z + b)))  # sigmoid
        d1 = q - t
        w = q * (1.0 - q) + 1e-12  # the Hessian's weights, kept positive definite
        g = np.array([np.dot(d1, z), d1.sum()])
        h = np.array([[np.dot(w * z, z), np.dot(w, z)], [np.dot(w, z), w.sum()]])
        if np.abs(g).max() < 1e-9 * len(z):
            break
        step = np.linalg.solve(h, g)
        s = 1.0
        while s >= MIN_STEP:  # backtrack until the loss goes down enough (Armijo)
            na, nb = a - s * step[0], b - s * step[1]
            new = _nll(z, t, na, nb)
            if new < loss + 1e-4 * s * float(g @ -step):
                break
            s /= 2.0
        if s < MIN_STEP:
            break  # no step lowers the loss: at the optimum to float precision
        a, b, loss = na, nb, new
    if not (np.isfinite(a) and np.isfinite(b)) or a <= 0:
        return None
    return PlattFit(float(a), float(b), it)

"""Calibration after the sigmoid (part of the served model, recorded in the manifest).

p' = p / (p + (1 - p) / r)   (negative down-sampling correction, kept negative rate r)
p'' = min(1, scale * p'^power)
"""
from __future__ import annotations

import numpy as np

from features.spec import Calibration


def calibrate(p: np.ndarray, c: Calibration) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if c.identity:
        return p.astype(np.float32)
    if c.negative_rate != 1.0:
        p = p / (p + (1.0 - p) / c.negative_rate)
    if c.scale != 1.0 or c.power != 1.0:
        p = np.minimum(1.0, c.scale * np.power(p, c.power))
    return p.astype(np.float32)

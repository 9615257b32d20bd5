"""Latency statistics of the benches."""

from __future__ import annotations

import numpy as np


def percentiles_ms(xs) -> dict:
    """Count, p50/p90/p99, max and mean in ms of latencies ``xs`` in seconds."""
    a = np.asarray(xs, dtype=np.float64) * 1000.0
    return {
        "n": int(a.size),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
        "mean_ms": float(a.mean()),
    }

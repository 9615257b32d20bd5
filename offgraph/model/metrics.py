"""Held-out metrics by name: ``make_metric_fn("auc" | "logloss" | "ndcg@k")(labels, scores, groups)``.

The name is the key a run's metrics record it under; ``groups`` (each row's request) is needed by
``ndcg@k`` only. The NumPy maths is in ``_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from offgraph.model._metrics import auc, logloss, ndcg_at_k

__all__ = ["MetricFn", "auc", "logloss", "ndcg_at_k", "make_metric_fn", "needs_groups"]

# labels [N], scores [N] (probabilities for logloss), groups [N] or None -> a float
MetricFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], float]

NDCG = "ndcg"  # "ndcg@k": mean NDCG at cut-off k over the request groups with a positive
_UNGROUPED = {"auc": auc, "logloss": logloss}


def _ndcg_cutoff(name: str) -> int | None:
    base, at, k = name.partition("@")
    return int(k) if base == NDCG and at and k.isdigit() and int(k) > 0 else None


def needs_groups(name: str) -> bool:
    make_metric_fn(name)  # a clear error for an unknown name
    return name not in _UNGROUPED


def make_metric_fn(name: str) -> MetricFn:
    """The metric called ``name``: ``auc``, ``logloss`` or ``ndcg@k`` (k >= 1)."""
    if name in _UNGROUPED:
        fn = _UNGROUPED[name]
        return lambda labels, scores, groups=None: fn(labels, scores)
    k = _ndcg_cutoff(name)
    if k is None:
        raise ValueError(f"unknown metric {name!r}: expected one of {sorted(_UNGROUPED)} or {NDCG}@k")

    def ndcg(labels, scores, groups=None):
        if groups is None:
            raise ValueError(f"metric {name} needs the rows' request groups")
        return ndcg_at_k(labels, scores, groups, k)

    return ndcg

"""Held-out metrics by name: ``make_metric_fn("auc" | "logloss" | "ndcg@k")(labels, scores, groups)``.

The name is the key a run's metrics record it under; ``groups`` (each row's request) is needed by
``ndcg@k`` only. The maths in NumPy: AUC (ties averaged), logloss, NDCG@k per request group.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["MetricFn", "auc", "logloss", "ndcg_at_k", "make_metric_fn", "needs_groups"]

# labels [N], scores [N] (probabilities for logloss), groups [N] or None -> a float
MetricFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], float]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC via the rank-sum formula with average ranks for ties."""
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = y.sum()
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    s_sorted = s[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average rank over runs of equal scores
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    ends = np.r_[starts[1:], len(s)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def ndcg_at_k(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, k: int = 10) -> float:
    """Mean NDCG@k over groups that have at least one positive (binary gains)."""
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(groups)
    _, gid = np.unique(g, return_inverse=True)
    # sort by group, then score descending (ties: original order)
    order = np.lexsort((np.arange(len(s)), -s, gid))
    gs, ys = gid[order], y[order]
    first = np.r_[0, np.flatnonzero(gs[1:] != gs[:-1]) + 1]
    pos_in_group = np.arange(len(gs)) - np.repeat(first, np.diff(np.r_[first, len(gs)]))
    disc = np.where(pos_in_group < k, 1.0 / np.log2(pos_in_group + 2.0), 0.0)
    dcg = np.bincount(gs, weights=ys * disc)
    # ideal: all positives first
    n_pos = np.bincount(gid, weights=y).astype(np.int64)
    cum = np.r_[0.0, np.cumsum(1.0 / np.log2(np.arange(k) + 2.0))]
    idcg = cum[np.minimum(n_pos, k)]
    has = n_pos > 0
    if not has.any():
        return float("nan")
    return float(np.mean(dcg[has] / idcg[has]))


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

"""Held-out metrics by name: ``make_metric_fn("auc" | "logloss" | "ndcg@k" | "map" | "mrr" | "arp")(labels,
scores, groups)``.

The name is the key a run's metrics record it under; ``groups`` (each row's request: its list) is needed
by the ranking metrics only. Labels are relevance grades >= 0 (``offgraph.model.relevance``). In NumPy:

- auc: ROC AUC of the binarised labels (label > 0), ties averaged; logloss: of the binarised labels;
- ndcg@k: per list, DCG@k / ideal DCG@k with gains 2^g - 1 and discount 1/log2(1 + rank);
- map: per list, average precision of the binarised labels: the mean, over its relevant items, of the
  precision of the top ranks down to that item;
- mrr: per list, 1 / the rank of its first relevant item;
- arp: average relevance position, per list sum(label * rank) / sum(label) (the label as its weight, as
  TensorFlow Ranking's ARP); lower is better, as for logloss (``higher_is_better``).

Ranking metrics are averaged per list, over the lists with at least one relevant item (a list without
one is excluded: no order of it is better than another); NaN where no list has one. Ranks are 1-based
by score descending; equal scores are ranked pessimistically, the less relevant first, so a constant
score is never rewarded and the result does not depend on row order. A list of one relevant item
scores 1 (arp: 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from offgraph.model.relevance import binarise, gain

__all__ = [
    "MetricFn",
    "auc",
    "logloss",
    "ndcg_at_k",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "average_relevance_position",
    "make_metric_fn",
    "needs_groups",
    "higher_is_better",
]

# labels [N], scores [N] (probabilities for logloss), groups [N] or None -> a float
MetricFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], float]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of the binarised labels via the rank-sum formula with average ranks for ties."""
    y = binarise(np.asarray(labels, dtype=np.float64))
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
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1 - eps)
    y = binarise(np.asarray(labels, dtype=np.float64))
    return float(-np.mean(np.where(y, np.log(p), np.log(1 - p))))


class _Ranked(NamedTuple):
    """The rows sorted by list, then score descending (ties: the less relevant first)."""

    lists: np.ndarray  # [N] the row's list 0..L-1
    labels: np.ndarray  # [N] float64
    rank: np.ndarray  # [N] 1-based place in its list
    ideal_labels: np.ndarray  # [N] the labels of each list sorted descending (the ideal order, same places)
    starts: np.ndarray  # [L] each list's first row
    relevant_lists: np.ndarray  # [L] bool: the list has an item with label > 0


def _ranked(labels, scores, groups) -> _Ranked:
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    _, gid = np.unique(np.asarray(groups), return_inverse=True)
    gid = gid.reshape(-1)
    order = np.lexsort((y, -s, gid))
    lists = gid[order]
    counts = np.bincount(gid)
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(y)) - starts[lists] + 1.0
    ideal = y[np.lexsort((-y, gid))]
    relevant = np.bincount(gid, weights=binarise(y)) > 0
    return _Ranked(lists, y[order], rank, ideal, starts, relevant)


def _per_list_mean(r: _Ranked, values: np.ndarray) -> float:
    """The mean of a per-list value over the lists with a relevant item."""
    if not r.relevant_lists.any():
        return float("nan")
    return float(np.mean(values[r.relevant_lists]))


def _list_sum(r: _Ranked, weights: np.ndarray) -> np.ndarray:
    return np.bincount(r.lists, weights=weights, minlength=len(r.starts))


def ndcg_at_k(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, k: int = 10) -> float:
    """Mean NDCG@k over the lists with a relevant item, gains 2^g - 1 (``relevance.gain``)."""
    r = _ranked(labels, scores, groups)
    disc = np.where(r.rank <= k, 1.0 / np.log2(r.rank + 1.0), 0.0)
    dcg = _list_sum(r, gain(r.labels) * disc)
    idcg = _list_sum(r, gain(r.ideal_labels) * disc)  # the ideal order has the same places, so the same discounts
    return _per_list_mean(r, np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0))


def mean_average_precision(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Mean over the lists with a relevant item of their average precision (binarised labels)."""
    r = _ranked(labels, scores, groups)
    rel = binarise(r.labels).astype(np.float64)
    seen = np.cumsum(rel)
    hits = seen - np.r_[0.0, seen][r.starts][r.lists]  # relevant items at or above this rank in its list
    n_rel = _list_sum(r, rel)
    ap = np.divide(_list_sum(r, rel * hits / r.rank), n_rel, out=np.zeros_like(n_rel), where=n_rel > 0)
    return _per_list_mean(r, ap)


def mean_reciprocal_rank(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Mean over the lists with a relevant item of 1 / the rank of the first one."""
    r = _ranked(labels, scores, groups)
    if not len(r.lists):
        return float("nan")
    rr = np.where(binarise(r.labels), 1.0 / r.rank, 0.0)
    return _per_list_mean(r, np.maximum.reduceat(rr, r.starts))


def average_relevance_position(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Mean over the lists with a relevant item of sum(label * rank) / sum(label); lower is better."""
    r = _ranked(labels, scores, groups)
    weight = _list_sum(r, r.labels)
    arp = np.divide(_list_sum(r, r.labels * r.rank), weight, out=np.zeros_like(weight), where=weight > 0)
    return _per_list_mean(r, arp)


NDCG = "ndcg"  # "ndcg@k": mean NDCG at cut-off k over the lists with a relevant item
_UNGROUPED = {"auc": auc, "logloss": logloss}
_GROUPED = {"map": mean_average_precision, "mrr": mean_reciprocal_rank, "arp": average_relevance_position}
_LOWER_IS_BETTER = frozenset({"logloss", "arp"})


def _ndcg_cutoff(name: str) -> int | None:
    base, at, k = name.partition("@")
    return int(k) if base == NDCG and at and k.isdigit() and int(k) > 0 else None


def needs_groups(name: str) -> bool:
    make_metric_fn(name)  # a clear error for an unknown name
    return name not in _UNGROUPED


def higher_is_better(name: str) -> bool:
    """Whether a larger value of the metric is better (all but logloss and arp)."""
    make_metric_fn(name)
    return name not in _LOWER_IS_BETTER


def make_metric_fn(name: str) -> MetricFn:
    """The metric called ``name``: ``auc``, ``logloss``, ``ndcg@k`` (k >= 1), ``map``, ``mrr`` or ``arp``."""
    if name in _UNGROUPED:
        fn = _UNGROUPED[name]
        return lambda labels, scores, groups=None: fn(labels, scores)
    k = _ndcg_cutoff(name)
    if k is None and name not in _GROUPED:
        raise ValueError(
            f"unknown metric {name!r}: expected one of {sorted(_UNGROUPED) + sorted(_GROUPED)} or {NDCG}@k"
        )
    grouped = _GROUPED.get(name) or (lambda labels, scores, groups: ndcg_at_k(labels, scores, groups, k))

    def ranking(labels, scores, groups=None):
        if groups is None:
            raise ValueError(f"metric {name} needs the rows' request groups")
        return grouped(labels, scores, groups)

    return ranking

"""`bench.ltr`'s statistics: each ranking metric per list (``offgraph.model.metrics``, one list at a time),
bootstrap 95% intervals over lists, paired intervals of a difference (the same resampled lists for both
orders), and AUC's interval by resampling whole lists' rows."""

from __future__ import annotations

import numpy as np

from offgraph.model.metrics import make_metric_fn

LIST_METRICS = ("ndcg@1", "ndcg@5", "ndcg@10", "map", "mrr")


def list_slices(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row order grouping the lists, each list's [start, end) in it as an [L, 2] array)."""
    _, gid = np.unique(groups, return_inverse=True)
    order = np.argsort(gid, kind="stable")
    counts = np.bincount(gid)
    ends = np.cumsum(counts)
    return order, np.stack([ends - counts, ends], axis=1)


def per_list(name: str, labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """[L] the metric ``name`` of each list alone (NaN: a list without a relevant item, which the package's
    mean leaves out). The package's metric called on one list at a time: the mean of these over the finite
    ones is its value on all the lists."""
    fn = make_metric_fn(name)
    order, spans = list_slices(groups)
    y, s = labels[order], scores[order]
    one = np.zeros(int((spans[:, 1] - spans[:, 0]).max(initial=0)), np.int64)
    return np.array([fn(y[a:b], s[a:b], one[: b - a]) for a, b in spans])


def draws(n_lists: int, n_draws: int, seed: int) -> np.ndarray:
    """[n_draws, n_lists] how many times each list is drawn in each bootstrap resample (with replacement)."""
    rng = np.random.default_rng(seed)
    return np.stack([np.bincount(rng.integers(0, n_lists, n_lists), minlength=n_lists) for _ in range(n_draws)])


def mean_ci(values: np.ndarray, weights: np.ndarray) -> dict:
    """{value, lo, hi}: the mean of ``values`` over the finite ones, and the 2.5/97.5 percentiles of the means
    of the resamples ``weights`` ([draws, lists] multiplicities)."""
    ok = np.isfinite(values)
    v, w = np.where(ok, values, 0.0), weights * ok
    means = (w @ v) / np.maximum(w.sum(axis=1), 1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"value": float(v[ok].mean()), "lo": float(lo), "hi": float(hi), "lists": int(ok.sum())}


def paired_diff_ci(a: np.ndarray, b: np.ndarray, weights: np.ndarray) -> dict:
    """{diff, lo, hi}: mean(a) - mean(b) over the lists where both are finite, with the interval of the same
    difference over the same resampled lists (paired)."""
    ok = np.isfinite(a) & np.isfinite(b)
    d = np.where(ok, a - b, 0.0)
    w = weights * ok
    means = (w @ d) / np.maximum(w.sum(axis=1), 1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"diff": float(d[ok].mean()), "lo": float(lo), "hi": float(hi)}


def auc_ci(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, n_draws: int, seed: int) -> dict:
    """AUC (of the binarised labels) with the interval of resampling whole lists (``n_draws`` resamples)."""
    fn = make_metric_fn("auc")
    order, spans = list_slices(groups)
    y, s = labels[order], scores[order]
    sizes = spans[:, 1] - spans[:, 0]
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_draws):
        pick = rng.integers(0, len(spans), len(spans))
        rows = np.repeat(spans[pick, 0] - np.r_[0, np.cumsum(sizes[pick])[:-1]], sizes[pick])
        rows = rows + np.arange(len(rows))
        vals.append(fn(y[rows], s[rows]))
    lo, hi = np.nanpercentile(vals, [2.5, 97.5])
    return {"value": float(fn(labels, scores)), "lo": float(lo), "hi": float(hi)}


def ci_text(c: dict) -> str:
    """A ``mean_ci`` as "value [lo, hi]"."""
    return f"{c['value']:.4f} [{c['lo']:.4f}, {c['hi']:.4f}]"


def diff_text(c: dict) -> str:
    """A ``paired_diff_ci`` as "+diff [+lo, +hi]"."""
    return f"{c['diff']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"

"""An online experiment's report: the served log joined with an outcome log, per arm, with bootstrap intervals.

``experiment_report(served, outcomes, item_field=...)`` takes the served log as one Arrow table
(``offgraph.server.process.served_log``: one record per scored request, with its arm, the request's and each
candidate's features as JSON and the order returned) and an outcome log (``read_outcomes``: Parquet or CSV with
``request_id``, the item field, ``event`` and an optional ``value``), and gives per arm:

- **requests**, **users** (distinct values of the request's ``user_field``, the experiment's sticky key), and
  the served **candidates** (every candidate of a logged request counts as one impression);
- **CTR**: clicked candidates / served candidates. A candidate is clicked when the outcome log has a ``click``
  event for its (request id, item);
- **UCTR**: the share of the arm's users with at least one clicked candidate;
- **mean gain**: the candidates' summed gain / served candidates. A candidate's gain is the sum of the values
  of its ``gain_event`` events (``play_share`` by default: the share of the item played; ``click`` and
  ``play`` events count 1 each unless the log gives a ``value``; a null value counts 1);
- **NDCG@k of the served order**: per request, DCG@k of the gains in the order the arm returned
  (``order``: by descending score; the prior arm's is the order sent) over the DCG@k of the same gains sorted
  descending, discount 1 / log2(1 + rank), the gains as measured (not 2^g - 1: a gain is already a gain);
  averaged over the requests with a positive gain (a request with none has no better or worse order), as
  ``offgraph.model.metrics.ndcg_at_k`` leaves out lists without a relevant item.

Each figure is a ratio of per-user sums (CTR: clicks over candidates; NDCG: the judged requests' NDCG over their
count...), so its 95% interval is a **cluster bootstrap over users**: the arm's users resampled with
replacement ``draws`` times (each draw's figure the ratio of the resampled sums; the 2.5 and 97.5 percentiles),
a user's requests staying together, since one user's requests are not independent. The **difference from
the control arm** pairs draw i of the arm with draw i of the control, each drawn independently (the arms
hold different users: no pairing is possible), and takes the same percentiles of the differences. Seeded: each
arm's draws come from its own stream of ``numpy.random.SeedSequence(seed)``, in the arms' name order.

A request without the user field (it was served by the first arm, unassigned) is its own cluster and counts
in no arm's users. Item keys and user values are compared as text (a number as its digits: ``242`` and
``"242"`` are the same item), as the experiment's assignment reads a sticky value. Everything is columnar:
the JSON features are read by ``pyarrow.json``, the join is a pyarrow hash join, the sums NumPy's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offgraph.streaming.served_outcomes import (  # noqa: F401 (read_outcomes, json_field, EVENTS: the report's names too)
    EVENTS,
    LogError,
    candidate_outcomes,
    check_columns,
    json_field,
    model_records,
    outcome_pairs,
    read_outcomes,
)

METRICS = ("ctr", "uctr", "mean_gain", "ndcg")
LABELS = {"ctr": "CTR", "uctr": "UCTR", "mean_gain": "mean gain", "ndcg": "NDCG@{k}"}
SERVED_COLUMNS = ("request_id", "model", "arm", "request", "candidates", "order")
DRAWS = 1000
LEVEL = 0.95
_DRAW_CELLS = 4_000_000
"""Bootstrap weights held at once (draws x users), 32 MB: the draws are made in chunks of this many cells."""


ReportError = LogError
"""Logs the report cannot use (a missing column, an unknown arm, an empty log): `offgraph experiment report`
exits 2 naming the problem. One class with the readers' errors it shares with the stream trainer."""


def item_field_from_models(models_dir: str | Path, served: pa.Table, model: str | None = None) -> str:
    """The item key (``item_key``) of the spec the logged versions of ``model`` (default: the log's one
    model) were trained with, read from their directories under ``models_dir`` (the prior arm's records name
    no version: then any version there)."""
    from offgraph.modeldir.version import ModelVersion

    check_columns(served, ("model", "version"), "served log")
    if model is None:
        models = sorted(m for m in pc.unique(served.column("model")).to_pylist() if m is not None)
        if len(models) != 1:
            raise ReportError(f"the served log holds the models {models}: name one (--model)")
        model = models[0]
    root = Path(models_dir) / model
    logged = pc.filter(served.column("version"), pc.equal(served.column("model"), model))
    versions = sorted(v for v in pc.unique(logged).to_pylist() if v is not None)
    dirs = [root / str(v) for v in versions] or sorted(p for p in root.glob("*") if p.name.isdigit())
    if not dirs:
        raise ReportError(f"{root}: no version of the model {model!r}")
    keys = {ModelVersion.open(d, verify_dense=False, verify_store=False).spec.item_key for d in dirs}
    if len(keys) != 1 or None in keys:
        raise ReportError(
            f"the specs of {model!r}'s versions under {root} name no single item_key ({keys}): --item-field"
        )
    return str(keys.pop())


def _codes(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """(each value's index into the distinct values, the distinct values); null values get -1."""
    if isinstance(values, pa.ChunkedArray):  # one dictionary for all: each chunk would have its own
        values = values.combine_chunks()
    enc = pc.dictionary_encode(values)
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, enc.dictionary.to_pylist()


def _served_ranks(served: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidates per request [R], each candidate's request [N], each candidate's 1-based place in the served
    order [N]), candidates in the log's order."""
    cands = served.column("candidates").combine_chunks()
    order = served.column("order").combine_chunks()
    n = pc.list_value_length(cands).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if not np.array_equal(pc.list_value_length(order).fill_null(0).to_numpy(zero_copy_only=False), n):
        raise ReportError("the served log's order and candidates differ in length in some record")
    parent = pc.list_parent_indices(cands).to_numpy().astype(np.int64)
    off = np.cumsum(n) - n
    o = pc.list_flatten(order).to_numpy(zero_copy_only=False).astype(np.int64)
    o_parent = pc.list_parent_indices(order).to_numpy().astype(np.int64)
    if o.size and ((o < 0) | (o >= n[o_parent])).any():
        raise ReportError("the served log's order holds an index outside its candidates")
    rank = np.zeros(len(parent), np.int64)
    rank[off[o_parent] + o] = np.arange(len(o)) - off[o_parent] + 1
    if (rank == 0).any():
        raise ReportError("the served log's order is not a permutation of its candidates in some record")
    return n, parent, rank


def _ndcg(gain: np.ndarray, rank: np.ndarray, parent: np.ndarray, n: np.ndarray, k: int) -> tuple:
    """(NDCG@k of each request's served order [R] (0 where unjudged), judged [R]: the request has a positive gain)."""
    R = len(n)

    def discount(place):
        return np.where(place <= k, 1.0 / np.log2(place + 1.0), 0.0)

    dcg = np.bincount(parent, gain * discount(rank), minlength=R)
    ideal = np.lexsort((-gain, parent))  # each request's candidates by descending gain, requests in place
    off = np.cumsum(n) - n
    place = np.arange(len(parent)) - off[parent[ideal]] + 1
    idcg = np.bincount(parent[ideal], gain[ideal] * discount(place), minlength=R)
    judged = idcg > 0
    return np.divide(dcg, idcg, out=np.zeros(R), where=judged), judged


def _bootstrap(num: np.ndarray, den: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """[metrics, draws]: sum(w * num) / sum(w * den) per metric, w the users' multiplicities of one resample
    (``num``, ``den``: [metrics, users]); NaN where a resample's denominator is 0."""
    users = num.shape[1]
    out = np.empty((num.shape[0], draws))
    chunk = max(1, _DRAW_CELLS // max(users, 1))
    for start in range(0, draws, chunk):
        b = min(chunk, draws - start)
        pick = rng.integers(0, users, (b, users)) + np.arange(b)[:, None] * users
        w = np.bincount(pick.ravel(), minlength=b * users).reshape(b, users).astype(np.float64)
        top, bottom = num @ w.T, den @ w.T
        out[:, start : start + b] = np.divide(top, bottom, out=np.full_like(top, np.nan), where=bottom > 0)
    return out


def _interval(samples: np.ndarray) -> tuple[float, float]:
    if not np.isfinite(samples).any():
        return math.nan, math.nan
    lo, hi = np.nanpercentile(samples, [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)])
    return float(lo), float(hi)


def experiment_report(
    served: pa.Table,
    outcomes: pa.Table,
    *,
    item_field: str,
    user_field: str = "user_id",
    control: str | None = None,
    k: int = 10,
    gain_event: str = "play_share",
    model: str | None = None,
    draws: int = DRAWS,
    seed: int = 0,
) -> dict[str, Any]:
    """The report (a JSON-ready dict; the module docstring defines each figure). ``control``: the arm the
    others are compared with (default: the arm with the most requests); ``model``: the model whose records
    count (needed when the log holds several)."""
    if k < 1:
        raise ReportError(f"k must be >= 1, got {k}")
    if draws < 1:
        raise ReportError(f"draws must be >= 1, got {draws}")
    if gain_event not in EVENTS:
        raise ReportError(f"the gain event is one of {', '.join(EVENTS)}, got {gain_event!r}")
    check_columns(served, SERVED_COLUMNS, "served log")
    served, model = model_records(served, model, "--model")
    if served.num_rows == 0:
        raise ReportError("the served log has no records")

    if served.column("arm").null_count:
        raise ReportError("the served log has records without an arm")
    n, parent, rank = _served_ranks(served)
    R = len(n)
    items = json_field(pc.list_flatten(served.column("candidates")), item_field)
    if items.null_count == len(items):
        raise ReportError(f"no served candidate has the field {item_field!r} (the item key; see --item-field)")
    users = json_field(served.column("request"), user_field)
    pairs = outcome_pairs(outcomes, item_field, gain_event)

    request_ids = served.column("request_id").cast(pa.string()).combine_chunks()
    clicked, gain, matched = candidate_outcomes(request_ids.take(pa.array(parent)), items, pairs, item_field)

    clicks_r = np.bincount(parent, clicked, minlength=R)
    gain_r = np.bincount(parent, gain, minlength=R)
    ndcg_r, judged = _ndcg(gain, rank, parent, n, k)

    arm_code, arm_names = _codes(served.column("arm"))
    user_code, _ = _codes(users)
    no_user = user_code < 0
    user_code = np.where(no_user, user_code.max(initial=-1) + 1 + np.arange(R), user_code)  # each its own cluster
    cluster_key = arm_code * (int(user_code.max()) + 1) + user_code
    clusters, cluster = np.unique(cluster_key, return_inverse=True)
    cluster_arm = clusters // (int(user_code.max()) + 1)
    C = len(clusters)

    def per_cluster(values: np.ndarray) -> np.ndarray:
        return np.bincount(cluster, values, minlength=C)

    n_c, clicks_c = per_cluster(n.astype(np.float64)), per_cluster(clicks_r)
    num = np.stack([clicks_c, (clicks_c > 0).astype(np.float64), per_cluster(gain_r), per_cluster(ndcg_r * judged)])
    den = np.stack([n_c, np.ones(C), n_c, per_cluster(judged.astype(np.float64))])
    has_user = per_cluster((~no_user).astype(np.float64)) > 0
    num[1] *= has_user  # UCTR: the users' share; a request without the user field is in no user's
    den[1] *= has_user

    names = sorted(str(a) for a in arm_names)
    counts = {str(a): int((arm_code == i).sum()) for i, a in enumerate(arm_names)}
    if control is None:
        control = min(names, key=lambda a: (-counts[a], a))
    elif control not in names:
        raise ReportError(f"the control arm {control!r} is not in the served log (its arms: {', '.join(names)})")
    streams = np.random.SeedSequence(seed).spawn(len(names))
    arms: dict[str, Any] = {}
    samples: dict[str, np.ndarray] = {}
    for name, stream in zip(names, streams):
        code = arm_names.index(name)
        mine, reqs = cluster_arm == code, arm_code == code
        a_num, a_den = num[:, mine], den[:, mine]
        samples[name] = _bootstrap(a_num, a_den, draws, np.random.default_rng(stream))
        total_num, total_den = a_num.sum(axis=1), a_den.sum(axis=1)
        figures: dict[str, Any] = {
            "requests": int(reqs.sum()),
            "users": int(has_user[mine].sum()),
            "requests_without_user": int((no_user & reqs).sum()),
            "candidates": int(n[reqs].sum()),
            "clicks": int(clicks_r[reqs].sum()),
            "judged_requests": int(judged[reqs].sum()),
        }
        for j, metric in enumerate(METRICS):
            value = total_num[j] / total_den[j] if total_den[j] > 0 else math.nan
            lo, hi = _interval(samples[name][j])
            figures[metric] = {"value": float(value), "lo": lo, "hi": hi}
        arms[name] = figures
    vs_control: dict[str, Any] = {}
    for name in names:
        if name == control:
            continue
        vs_control[name] = {}
        for j, metric in enumerate(METRICS):
            lo, hi = _interval(samples[name][j] - samples[control][j])
            diff = arms[name][metric]["value"] - arms[control][metric]["value"]
            vs_control[name][metric] = {"diff": float(diff), "lo": lo, "hi": hi}
    return {
        "model": model,
        "control": control,
        "k": k,
        "item_field": item_field,
        "user_field": user_field,
        "gain_event": gain_event,
        "draws": draws,
        "seed": seed,
        "level": LEVEL,
        "served": {"requests": R, "candidates": int(n.sum())},
        "outcomes": {
            "rows": outcomes.num_rows,
            "pairs": pairs.num_rows,
            "matched": matched,
            "unmatched": pairs.num_rows - matched,
        },
        "arms": arms,
        "vs_control": vs_control,
    }


def _label(metric: str, k: int) -> str:
    return LABELS[metric].format(k=k)


def _ci(v: float, lo: float, hi: float, sign: bool = False) -> str:
    f = "{:+.4f}" if sign else "{:.4f}"
    return f"{f.format(v)} [{f.format(lo)}, {f.format(hi)}]"


def format_report(report: dict[str, Any]) -> str:
    """The report as a text table: per arm its counts and each figure with its interval, then each arm's
    difference from the control."""
    k, control = report["k"], report["control"]
    o = report["outcomes"]
    head = ["arm", "requests", "users", "candidates", *(_label(m, k) for m in METRICS)]
    rows = [
        [
            name + (" (control)" if name == control else ""),
            f"{a['requests']:,}",
            f"{a['users']:,}",
            f"{a['candidates']:,}",
            *(_ci(a[m]["value"], a[m]["lo"], a[m]["hi"]) for m in METRICS),
        ]
        for name, a in report["arms"].items()
    ]
    diffs = [
        [f"{name} - {control}", "", "", "", *(_ci(d[m]["diff"], d[m]["lo"], d[m]["hi"], sign=True) for m in METRICS)]
        for name, d in report["vs_control"].items()
    ]
    widths = [max(len(r[i]) for r in [head, *rows, *diffs]) for i in range(len(head))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [
        f"model {report['model']}: {report['served']['requests']:,} requests, {report['served']['candidates']:,} "
        f"candidates served; outcomes: {o['matched']:,} of {o['pairs']:,} (request, item) pairs served "
        f"({o['unmatched']:,} not in the log); gain: {report['gain_event']}; 95% intervals: cluster bootstrap "
        f"over {report['user_field']}, {report['draws']} draws, seed {report['seed']}",
        line(head),
        *(line(r) for r in rows),
    ]
    if diffs:
        out += [f"difference from {control} (independent bootstraps):", *(line(r) for r in diffs)]
    return "\n".join(out)


def report_json(report: dict[str, Any]) -> str:
    """The report as JSON text (NaN, an interval no resample could give, as null)."""

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {key: plain(x) for key, x in v.items()}
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return json.dumps(plain(report), indent=2)


def plot_report(report: dict[str, Any], path: str | Path) -> None:
    """A PNG: per figure, each arm's value with its interval (top) and each arm's difference from the control
    with its interval (bottom)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    k, control = report["k"], report["control"]
    names = list(report["arms"])
    others = list(report["vs_control"])
    fig, axes = plt.subplots(2, len(METRICS), figsize=(3.6 * len(METRICS), 6.4), squeeze=False)
    for j, metric in enumerate(METRICS):
        ax = axes[0, j]
        v = np.array([report["arms"][a][metric]["value"] for a in names])
        lo = np.array([report["arms"][a][metric]["lo"] for a in names])
        hi = np.array([report["arms"][a][metric]["hi"] for a in names])
        x = np.arange(len(names))
        ax.errorbar(x, v, yerr=[v - lo, hi - v], fmt="o", capsize=5)
        ax.set_xticks(x, names, rotation=20)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_title(_label(metric, k))
        ax = axes[1, j]
        d = np.array([report["vs_control"][a][metric]["diff"] for a in others])
        lo = np.array([report["vs_control"][a][metric]["lo"] for a in others])
        hi = np.array([report["vs_control"][a][metric]["hi"] for a in others])
        x = np.arange(len(others))
        ax.axhline(0.0, color="grey", lw=0.8)
        if others:
            ax.errorbar(x, d, yerr=[d - lo, hi - d], fmt="o", capsize=5, color="C1")
        ax.set_xticks(x, others, rotation=20)
        ax.set_xlim(-0.6, max(len(others), 1) - 0.4)
        ax.set_title(f"{_label(metric, k)} − {control}")
    fig.suptitle(
        f"{report['model']}: per arm, 95% intervals (cluster bootstrap over {report['user_field']}, "
        f"{report['draws']} draws)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

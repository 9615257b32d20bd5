"""Learning to rank, measured: the same DeepFM trained with each loss on the same lists, scored on held-out lists
beside non-learned orders, with bootstrap 95% intervals over lists.

Data (``bench/lib/ltr_data.py``): MovieLens-100K with the rating as a graded relevance (grade = rating - 1,
gain 2^grade - 1; binarised for AUC/MAP/MRR: rating >= 2), held-out = each user's latest 20% of ratings, under
two protocols: user-day lists (NDCG@10) and the TensorFlow Ranking tutorial's sampled lists of 5 rated movies
per user (NDCG@5); and a generated data set whose lists differ by a list-level click propensity that says
nothing about the order within a list (NDCG@10). Losses: ``LOSSES`` (``offgraph.model.losses``), each trained
by ``offgraph.model.train.Trainer`` for ``--epochs`` epochs (no validation: fixed epochs, the same for every
loss); on MovieLens also the pointwise loss on the demo's label (rating >= 4, ``DEMO_LABEL``), since the
package binarises a grade as label > 0 (rating >= 2). Orders beside them: random, the items' popularity and
the items' prior mean grade (both from the training rows). Each metric with its bootstrap interval over
lists, and the paired interval of each learned order's difference from the prior order and from the
pointwise model (``bench/lib/ltr_stats.py``).

    python -m bench.ltr --out bench/results/ltr
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.lib.ltr_data import Protocol, generated_protocol, movielens_protocols
from bench.lib.ltr_stats import LIST_METRICS, auc_ci, draws, mean_ci, paired_diff_ci, per_list
from bench.lib.report import write_report

LOSSES = ("pointwise", "pairwise", "lambdarank", "listwise", "pointwise+pairwise")
# MovieLens only: the pointwise loss on the demo's label, rating >= 4 (grade >= 3), where the package's
# binarisation of the grade (label > 0) makes every rating >= 2 relevant; scored on the same graded lists
DEMO_LABEL = "pointwise r>=4"
LEARNED = (*LOSSES, DEMO_LABEL)
BASELINES = ("random", "popularity", "prior")
DRAWS, AUC_DRAWS = 1000, 200


def item_orders(p: Protocol, seed: int) -> dict[str, np.ndarray]:
    """The non-learned scores of the held-out rows: random; the item's training rows (popularity); its mean
    training grade (prior; an item without training rows gets the overall mean)."""
    items, grades = p.train_items, p.train.labels.astype(np.float64)
    ids, inv = np.unique(items, return_inverse=True)
    count = np.bincount(inv).astype(np.float64)
    mean = np.bincount(inv, weights=grades) / count
    pos = np.searchsorted(ids, p.held_items)
    known = (pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == p.held_items)
    at = np.minimum(pos, len(ids) - 1)
    return {
        "random": np.random.default_rng(seed).random(p.held.n),
        "popularity": np.where(known, count[at], 0.0),
        "prior": np.where(known, mean[at], grades.mean()),
    }


def train_scores(p: Protocol, loss: str, seed: int, args) -> tuple[np.ndarray, float]:
    """Held-out scores of ``loss`` (``DEMO_LABEL``: pointwise on grade >= 3) trained on ``p``'s training rows."""
    train = p.train
    if loss == DEMO_LABEL:
        train = replace(train, labels=(train.labels >= 3).astype(np.float32))
        loss = "pointwise"
    from offgraph.model.train import TrainConfig, Trainer

    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        loss=loss,
        seed=seed,
        validation=0,
        refit=False,
        max_list_size=args.max_list_size,
        split="random",  # unused: the bench splits itself
    )
    t0 = time.perf_counter()
    trainer = Trainer(p.spec, cfg)
    trainer.fit(train, None, progress=False, label=f"{p.name} {loss} seed {seed}")
    return trainer.predict(p.held), time.perf_counter() - t0


def evaluate(p: Protocol, scores: dict[str, np.ndarray], seed: int) -> dict:
    """Per order: each metric with its interval; per learned order: paired differences from prior and pointwise."""
    y, g = p.held.labels.astype(np.float64), p.held.groups
    _, gid = np.unique(g, return_inverse=True)
    w = draws(int(gid.max()) + 1, DRAWS, seed)
    values = {name: {m: per_list(m, y, s, g) for m in LIST_METRICS} for name, s in scores.items()}
    out: dict = {}
    for name, s in scores.items():
        res = {m: mean_ci(values[name][m], w) for m in LIST_METRICS}
        res["auc"] = auc_ci(y, s, g, AUC_DRAWS, seed)
        if name in LEARNED:
            res["vs_prior"] = {m: paired_diff_ci(values[name][m], values["prior"][m], w) for m in LIST_METRICS}
            if name in ("pairwise", "lambdarank", "listwise") and DEMO_LABEL in scores:
                res["vs_pointwise_r4"] = {
                    m: paired_diff_ci(values[name][m], values[DEMO_LABEL][m], w) for m in LIST_METRICS
                }
            if name != "pointwise":
                res["vs_pointwise"] = {
                    m: paired_diff_ci(values[name][m], values["pointwise"][m], w) for m in LIST_METRICS
                }
        out[name] = res
    return out


def acceptance(results: dict) -> list[dict]:
    """The issue's acceptance lines, per protocol and seed, read at the protocol's NDCG cut-off."""
    lines = []
    for proto, by_seed in results.items():
        k = by_seed["cutoff"]
        m = f"ndcg@{k}"
        for seed, r in by_seed["seeds"].items():
            o = r["orders"]
            if proto != "generated":
                beat = {loss: o[loss]["vs_prior"][m]["lo"] > 0 for loss in LOSSES}
                lines.append(
                    {
                        "protocol": proto,
                        "seed": seed,
                        "line": f"every learned loss beats the prior order on {m} (paired 95% CI above 0)",
                        "holds": all(beat.values()),
                        "detail": {loss: o[loss]["vs_prior"][m] for loss in LOSSES},
                    }
                )
                reach = {loss: o[loss]["vs_pointwise"][m]["hi"] > 0 for loss in LEARNED if loss != "pointwise"}
                lines.append(
                    {
                        "protocol": proto,
                        "seed": seed,
                        "line": f"a pairwise or listwise model matches or beats pointwise on {m} (CI reaches above 0)",
                        "holds": any(reach[x] for x in ("pairwise", "lambdarank", "listwise")),
                        "detail": {loss: o[loss]["vs_pointwise"][m] for loss in reach},
                    }
                )
                demo = {x: o[x]["vs_pointwise_r4"][m] for x in ("pairwise", "lambdarank", "listwise")}
                lines.append(
                    {
                        "protocol": proto,
                        "seed": seed,
                        "line": f"(beside) a pairwise or listwise model matches or beats pointwise trained on rating >= 4"
                        f" on {m} (CI reaches above 0)",
                        "holds": any(d["hi"] > 0 for d in demo.values()),
                        "detail": demo,
                    }
                )
            else:
                beat = {x: o[x]["vs_pointwise"][m]["lo"] > 0 for x in ("pairwise", "lambdarank", "listwise")}
                lines.append(
                    {
                        "protocol": proto,
                        "seed": seed,
                        "line": f"pairwise and listwise beat pointwise on {m} (paired 95% CI above 0)",
                        "holds": beat["pairwise"] and beat["listwise"],
                        "detail": {x: o[x]["vs_pointwise"][m] for x in beat},
                    }
                )
    return lines


def _ci(c: dict) -> str:
    return f"{c['value']:.4f} [{c['lo']:.4f}, {c['hi']:.4f}]"


def _d(c: dict) -> str:
    return f"{c['diff']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"


def markdown(report: dict) -> str:
    lines = ["# bench.ltr", "", f"command: `{report['command']}`", ""]
    for proto, by_seed in report["results"].items():
        k = by_seed["cutoff"]
        for seed, r in by_seed["seeds"].items():
            lines += [
                f"## {proto}, seed {seed}: {r['held_lists']} held-out lists, {r['held_rows']} rows "
                f"({r['train_rows']} training rows)",
                "",
                "| order | NDCG@1 | NDCG@5 | NDCG@10 | MAP | MRR | AUC | train s |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for name, o in r["orders"].items():
                cells = [_ci(o[m]) for m in (*LIST_METRICS, "auc")]
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['train_seconds'].get(name, 0):.0f} |")
            lines += ["", f"paired differences on NDCG@{k} (95% CI over lists):", ""]
            lines += ["| loss | vs prior order | vs pointwise |", "|---|---|---|"]
            for name in (n for n in LEARNED if n in r["orders"]):
                o = r["orders"][name]
                vp = _d(o["vs_pointwise"][f"ndcg@{k}"]) if "vs_pointwise" in o else "-"
                lines.append(f"| {name} | {_d(o['vs_prior'][f'ndcg@{k}'])} | {vp} |")
            lines.append("")
    lines += ["## Acceptance", "", "| protocol | seed | line | holds |", "|---|---|---|---|"]
    lines += [
        f"| {a['protocol']} | {a['seed']} | {a['line']} | {'yes' if a['holds'] else 'NO'} |"
        for a in report["acceptance"]
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protos = list(report["results"])
    fig, axes = plt.subplots(1, len(protos), figsize=(5.5 * len(protos), 4.2), squeeze=False)
    for ax, proto in zip(axes[0], protos, strict=True):
        by_seed = report["results"][proto]
        m = f"ndcg@{by_seed['cutoff']}"
        names = [*BASELINES, *LEARNED] if proto != "generated" else [*BASELINES, *LOSSES]
        for j, (seed, r) in enumerate(by_seed["seeds"].items()):
            x = np.arange(len(names)) + (j - 0.5) * 0.3
            v = np.array([r["orders"][n][m]["value"] for n in names])
            lo = v - np.array([r["orders"][n][m]["lo"] for n in names])
            hi = np.array([r["orders"][n][m]["hi"] for n in names]) - v
            ax.errorbar(x, v, yerr=[lo, hi], fmt="o", capsize=3, label=f"seed {seed}")
        ax.set_xticks(np.arange(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{proto}: held-out {m.upper()}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results directory (ltr.json, ltr.md, ltr.png)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (split, sampling, initial weights)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--max-list-size", type=int, default=100)
    ap.add_argument("--lists-per-user", type=int, default=20, help="sampled protocol: training lists per user")
    ap.add_argument("--held-lists-per-user", type=int, default=2, help="sampled protocol: held-out lists per user")
    ap.add_argument("--protocols", default="user-day,sampled-5,generated")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    wanted = args.protocols.split(",")
    results: dict = {}
    t0 = time.perf_counter()
    for seed in seeds:
        protos = movielens_protocols(args.lists_per_user, args.held_lists_per_user, 5, seed)
        protos.append(generated_protocol(seed))
        for p in protos:
            if p.name not in wanted:
                continue
            scores = item_orders(p, seed)
            secs = {}
            for loss in LOSSES if p.name == "generated" else LEARNED:
                scores[loss], secs[loss] = train_scores(p, loss, seed, args)
                print(f"{p.name} seed {seed} {loss}: {secs[loss]:.0f}s", flush=True)
            entry = results.setdefault(p.name, {"cutoff": p.cutoff, "seeds": {}})
            entry["seeds"][str(seed)] = {
                "train_rows": int(p.train.n),
                "held_rows": int(p.held.n),
                "held_lists": int(len(np.unique(p.held.groups))),
                "train_seconds": secs,
                "orders": evaluate(p, scores, seed),
            }
    report = {
        "command": "python -m bench.ltr " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "settings": vars(args),
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    report["acceptance"] = acceptance(results)
    write_report(out, "ltr", report, markdown(report), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

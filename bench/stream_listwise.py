"""A listwise model streamed on lists against a full retrain on the same data (issue 54's acceptance line "A
listwise model streamed on lists keeps NDCG on held-out lists within noise of a full retrain on the same data").

MovieLens-100K user-day lists (the spec's ``request_id``) with the grade ``rating - 1`` as the label (graded gains
2^grade - 1, ``bench/lib/ltr_data.py``'s spec), the lists in order of their first rating: the first share of
them (A), the next (B), the rest held out (H), per ``--splits``: 70/20/10, the issue's question, and 40/50/10,
where B holds enough to move held-out NDCG (the retrain's gain over A only is the test's power). Three models,
each scored on H through the served path (export fp32, then ``offgraph.scoring.scorer.Scorer``):

- A only: ``train_run`` with the listwise loss and ``validation=0`` (no Platt fit: the stream trainer refuses a
  listwise model whose scores are CTRs through one), exported;
- streamed: that export stream-trained on B's events (``open_trainer(model_dir=...)``: whole lists a batch, the
  model's own listwise loss), the deltas applied to the export by the updater, then scored;
- retrain: the same config and seed trained on A+B, exported.

``train_run`` always holds rows out: it gets A+H (or A+B+H) with the spec's time the list's first rating and the
'time' split at exactly H's rows, so it trains on A (A+B) and H is its held-out part (never used to choose
anything: no validation, a fixed epoch count). The stream trainer's optimizer and learning rate are picked on
B alone, per split and seed: streamed on B's first ``--tune-share`` of lists, scored on the rest by the trainer's
``predict`` (``tuning`` in the report).

NDCG@10 per held-out list (``bench/lib/ltr_stats.py``: the package's metric one list at a time), the paired
bootstrap 95% intervals of streamed - retrain, streamed - A only and retrain - A only over lists. The line holds
where the interval of streamed - retrain contains 0 or lies above it.

    python -m bench.stream_listwise --out bench/results/stream-listwise
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.lib.ltr_data import movielens_spec, with_model
from bench.lib.ltr_stats import ci_text, diff_text, draws, mean_ci, paired_diff_ci, per_list
from bench.lib.report import write_report
from offgraph.features.spec import FeatureSpec, parse_spec

METRIC = "ndcg@10"
NAME = "ml"  # the model's name under each MODELS directory
DRAWS = 1000
# the listwise arm of bench/ltr.py's SETTINGS (chosen there on validation lists of the same protocol): Adam-style
# lr 3e-4, L2 1e-6, no hidden layer; its best epoch there was 5 and 6 (seeds 0, 1) on ~64k training ratings
TRAIN = {"lr": 0.0003, "epochs": 6, "batch_size": 512, "max_list_size": 100}
MODEL = {"l2_embedding": 1e-6, "l2_dense": 1e-6, "mlp": []}
# (optimizer, lr) of the stream trainer tried on B's tuning split; its batch: about one list (whole lists a batch)
STREAM_GRID = (
    *(("adagrad", lr) for lr in (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03)),
    *(("sgd", lr) for lr in (0.001, 0.003, 0.01, 0.03)),
)
STREAM_BATCH = 32


def listed_movielens() -> tuple[pa.Table, FeatureSpec, np.ndarray]:
    """(MovieLens-100K ordered by list: the lists by their first rating, a list's rows together in time order, with
    ``grade`` = rating - 1 and ``list_start`` = the list's first timestamp; the spec (bench/lib/ltr_data's, its time
    the list's start, no feature tables: every request sends its inputs), each row's list number 0..L-1)."""
    from offgraph.data import movielens

    table = movielens.load(fetch=False)
    table = table.append_column("grade", pa.array(table.column("rating").to_numpy() - 1))
    codes = np.asarray(table.column("request_id").combine_chunks().dictionary_encode().indices, np.int64)
    ts = table.column("timestamp").to_numpy()
    start = np.full(codes.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(start, codes, ts)
    order = np.lexsort((ts, codes, start[codes]))  # by list start, then list, then time within the list
    table, codes = table.take(pa.array(order)), codes[order]
    table = table.append_column("list_start", pa.array(start[codes]))
    lists = np.r_[0, np.cumsum(np.diff(codes) != 0)]
    raw = with_model(movielens_spec(), **MODEL).to_dict()
    raw["time"] = "list_start"
    raw.pop("tables", None)
    return table, parse_spec(raw), lists


def list_cuts(lists: np.ndarray, shares: tuple[float, ...]) -> list[int]:
    """The row positions where the first ``shares`` (cumulative) of the lists end."""
    n_lists = int(lists[-1]) + 1
    return [int(np.searchsorted(lists, int(round(s * n_lists)))) for s in shares]


def train_export(
    spec: FeatureSpec, parts: list[pa.Table], held: pa.Table, seed: int, epochs: int, work: Path, name: str
) -> Path:
    """``train_run`` (listwise, no validation) on ``parts`` with ``held`` as its held-out rows, exported fp32 as
    MODELS/ml/1 under ``work/name``; returns the version directory."""
    from offgraph.export.export import export_run
    from offgraph.model.train import TrainConfig, train_run

    table = pa.concat_tables([*parts, held])
    n = table.num_rows
    # the 'time' split holds out the last floor(n * frac)..: frac half a row short of H's rows gives exactly H
    cfg = TrainConfig(
        loss="listwise",
        validation=0.0,
        split="time",
        held_out=(held.num_rows - 0.5) / n,
        seed=seed,
        **{**TRAIN, "epochs": epochs},
    )
    run = work / name / "run"
    _, metrics = train_run(spec, table, cfg, run, source=f"movielens {name}", progress=False)
    assert metrics["held_out_rows"] == held.num_rows, metrics["held_out_rows"]
    vdir = work / name / "models" / NAME / "1"
    export_run(run, vdir, shards=2, quant="fp32", progress=False)
    return vdir


def served_scores(spec: FeatureSpec, vdir: Path, table: pa.Table) -> np.ndarray:
    """Every row's served score from the version at ``vdir`` (one request a user's rows: a score is the row's own)."""
    from offgraph.export.check import requests_from_rows
    from offgraph.scoring.scorer import Scorer

    cols = {c: table.column(c).to_pylist() for c in {*spec.raw_inputs("request"), *spec.raw_inputs("item")}}
    out = np.zeros(table.num_rows, np.float64)
    with Scorer(vdir) as sc:
        for req, cands, pos in requests_from_rows(spec, cols, np.arange(table.num_rows)):
            out[pos] = sc.score(req, cands)
    return out


def stream_config(optimizer: str, lr: float):
    from offgraph.streaming.stream_train import StreamTrainConfig

    return StreamTrainConfig(optimizer=optimizer, lr=lr, batch_size=STREAM_BATCH)


def ndcg_lists(table: pa.Table, scores: np.ndarray) -> np.ndarray:
    """[L] NDCG@10 (graded gains) of each list of ``table``."""
    groups = np.asarray(table.column("request_id").combine_chunks().dictionary_encode().indices)
    return per_list(METRIC, table.column("grade").to_numpy().astype(np.float64), scores, groups)


def tune(vdir: Path, spec: FeatureSpec, fit: pa.Table, val: pa.Table) -> dict:
    """Each (optimizer, lr) of STREAM_GRID streamed from ``vdir`` on ``fit`` (deltas to a scratch spool, never
    applied), scored by the trainer's ``predict`` on ``val``; beside the unstreamed model's score there."""
    from offgraph.streaming.stream_train import event_inputs, open_trainer, stream_train_table

    cols = {c: val.column(c).to_pylist() for c in event_inputs(spec)}
    rows: list[dict] = []
    for optimizer, lr in STREAM_GRID:
        t0 = time.perf_counter()
        with open_trainer(model_dir=vdir, config=stream_config(optimizer, lr)) as tr:
            if not rows:  # before any step: the unstreamed model's score, the reference
                p = tr.predict(cols, val.num_rows).astype(np.float64)
                rows.append({"optimizer": "none", "lr": 0.0, METRIC: float(np.nanmean(ndcg_lists(val, p)))})
            with tempfile.TemporaryDirectory() as spool:
                stream_train_table(tr, fit, spool, progress=False)
            p = tr.predict(cols, val.num_rows).astype(np.float64)
        v = float(np.nanmean(ndcg_lists(val, p)))
        rows.append({"optimizer": optimizer, "lr": lr, METRIC: v, "seconds": time.perf_counter() - t0})
        print(f"tune {optimizer} lr {lr:g}: validation {METRIC} {v:.4f} (unstreamed {rows[0][METRIC]:.4f})", flush=True)
    best = max(rows[1:], key=lambda r: r[METRIC])
    return {"grid": rows, "chosen": {"optimizer": best["optimizer"], "lr": best["lr"]}}


def stream_apply(vdir: Path, events: pa.Table, optimizer: str, lr: float, spool: Path) -> dict:
    """Stream ``events`` from the export at ``vdir`` into ``spool``, then the updater applies the deltas to it."""
    from offgraph.streaming.sources import open_source
    from offgraph.streaming.stream_train import open_trainer, stream_train_table
    from offgraph.streaming.updater import Updater
    from offgraph.streaming.updater_config import UpdaterConfig

    spool.mkdir(parents=True)
    with open_trainer(model_dir=vdir, config=stream_config(optimizer, lr)) as tr:
        summary = stream_train_table(tr, events, spool, progress=False)
    applied = Updater(vdir.parents[1], NAME, open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
    keep = ("events", "rows_touched", "files_emitted", "seconds", "events_per_second", "loss", "bias_offset")
    return {**{k: summary[k] for k in keep}, "updater": applied}


def run_seed(seed: int, a: float, b: float, args, table: pa.Table, spec: FeatureSpec, lists: np.ndarray) -> dict:
    """One split's three models for ``seed``, the stream trainer's setting tuned on this split's B."""
    a_end, b_end, tune_end = list_cuts(lists, (a, a + b, a + b * args.tune_share))
    part_a, part_b, held = table.slice(0, a_end), table.slice(a_end, b_end - a_end), table.slice(b_end)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        v_a = train_export(spec, [part_a], held, seed, args.epochs, work, "a")
        t_a = time.perf_counter() - t0
        scores = {"a_only": served_scores(spec, v_a, held)}
        tuning = tune(v_a, spec, table.slice(a_end, tune_end - a_end), table.slice(tune_end, b_end - tune_end))
        chosen = tuning["chosen"]
        t1 = time.perf_counter()
        streamed = stream_apply(v_a, part_b, chosen["optimizer"], chosen["lr"], work / "spool")
        scores["streamed"] = served_scores(spec, v_a, held)
        t_stream = time.perf_counter() - t1
        t2 = time.perf_counter()
        v_ab = train_export(spec, [part_a, part_b], held, seed, args.epochs, work, "ab")
        t_ab = time.perf_counter() - t2
        scores["retrain"] = served_scores(spec, v_ab, held)
    per = {k: ndcg_lists(held, s) for k, s in scores.items()}
    w = draws(len(per["a_only"]), DRAWS, seed)
    return {
        "rows": {"a": part_a.num_rows, "b": part_b.num_rows, "held": held.num_rows},
        "lists": {
            "a": int(lists[a_end]),
            "b": int(lists[b_end] - lists[a_end]),
            "held": int(lists[-1] + 1 - lists[b_end]),
            "held_with_a_relevant_item": int(np.isfinite(per["a_only"]).sum()),
        },
        "tuning": tuning,
        "stream": {"optimizer": chosen["optimizer"], "lr": chosen["lr"], "batch_size": STREAM_BATCH, **streamed},
        "seconds": {"train_a": t_a, "stream_and_apply": t_stream, "retrain_ab": t_ab},
        METRIC: {k: mean_ci(v, w) for k, v in per.items()},
        "streamed_minus_retrain": paired_diff_ci(per["streamed"], per["retrain"], w),
        "streamed_minus_a_only": paired_diff_ci(per["streamed"], per["a_only"], w),
        "retrain_minus_a_only": paired_diff_ci(per["retrain"], per["a_only"], w),
    }


def markdown(report: dict) -> str:
    lines = ["# bench.stream_listwise", "", f"command: `{report['command']}` ({report['seconds']:.0f} s)", ""]
    lines += [
        f"held-out {METRIC} (95% CI over lists) and paired differences:",
        "",
        "| split A/B/H | seed | A only | streamed | retrain | streamed − retrain | streamed − A only | "
        "retrain − A only | line holds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for split, by_seed in report["splits"].items():
        for seed, r in by_seed.items():
            m = r[METRIC]
            lines.append(
                f"| {split} | {seed} | {ci_text(m['a_only'])} | {ci_text(m['streamed'])} | {ci_text(m['retrain'])} | "
                f"{diff_text(r['streamed_minus_retrain'])} | {diff_text(r['streamed_minus_a_only'])} | "
                f"{diff_text(r['retrain_minus_a_only'])} | {'yes' if r['holds'] else 'NO'} |"
            )
    for split, by_seed in report["splits"].items():
        for seed, r in by_seed.items():
            s, rows, ls = r["stream"], r["rows"], r["lists"]
            lines += [
                "",
                f"## split {split}, seed {seed}",
                "",
                f"rows A/B/H {rows['a']}/{rows['b']}/{rows['held']}, lists {ls['a']}/{ls['b']}/{ls['held']} "
                f"({ls['held_with_a_relevant_item']} held-out lists with a relevant item); stream: {s['optimizer']} "
                f"lr {s['lr']:g}, batch {s['batch_size']} events (whole lists), {s['events']} events, "
                f"{s['rows_touched']} rows touched, {s['events_per_second']:.0f} events/s; seconds: "
                + ", ".join(f"{k} {v:.0f}" for k, v in r["seconds"].items()),
                "",
                f"tuning ({METRIC} of B's last lists by the trainer's predict, after streaming B's first ones):",
                "",
                "| optimizer | lr | validation NDCG@10 | s |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {g['optimizer']} | {g['lr']:g} | {g[METRIC]:.4f} | {g.get('seconds', 0):.0f} |"
                for g in r["tuning"]["grid"]
            ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Top: each model's held-out NDCG@10 per split and seed; bottom: the paired differences (what the line reads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("a_only", "streamed", "retrain")
    diffs = ("streamed_minus_retrain", "streamed_minus_a_only", "retrain_minus_a_only")
    splits = list(report["splits"])
    fig, axes = plt.subplots(2, len(splits), figsize=(5.5 * len(splits), 7.5), squeeze=False)
    for col, split in enumerate(splits):
        by_seed = report["splits"][split]
        top, bottom = axes[0][col], axes[1][col]
        for j, (seed, r) in enumerate(by_seed.items()):
            x = np.arange(3) + (j - (len(by_seed) - 1) / 2) * 0.2
            m = r[METRIC]
            v = np.array([m[n]["value"] for n in names])
            err = [v - np.array([m[n]["lo"] for n in names]), np.array([m[n]["hi"] for n in names]) - v]
            top.errorbar(x, v, yerr=err, fmt="o", capsize=3, label=f"seed {seed}")
            d = np.array([r[n]["diff"] for n in diffs])
            err = [d - np.array([r[n]["lo"] for n in diffs]), np.array([r[n]["hi"] for n in diffs]) - d]
            bottom.errorbar(x, d, yerr=err, fmt="o", capsize=3, label=f"seed {seed}")
        top.set_xticks(np.arange(3), ["A only", "A, streamed on B", "retrain on A+B"])
        top.set_ylabel(f"held-out {METRIC.upper()} (95% CI over lists)")
        top.set_title(f"listwise DeepFM, MovieLens user-day lists, A/B/H {split}", fontsize=9)
        bottom.axhline(0, color="grey", lw=0.8)
        bottom.set_xticks(np.arange(3), ["streamed − retrain", "streamed − A only", "retrain − A only"])
        bottom.set_ylabel(f"paired difference of {METRIC.upper()} (95% CI)")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_splits(text: str) -> list[tuple[float, float]]:
    """``0.7:0.2,0.4:0.5`` -> [(A share, B share), ...] of the lists; the rest of each is held out."""
    out = []
    for part in text.split(","):
        a, b = (float(x) for x in part.split(":"))
        if not (a > 0 and b > 0 and a + b < 1):
            raise SystemExit(f"--splits: {part!r} needs A > 0, B > 0 and A + B < 1")
        out.append((a, b))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="bench/results/stream-listwise")
    ap.add_argument("--workdir", default=None, help="where the scratch runs and exports go (a temp dir under it)")
    ap.add_argument("--seeds", default="0,1", help="seeds of the training runs (the lists are the same for all)")
    ap.add_argument(
        "--splits",
        default="0.7:0.2,0.4:0.5",
        help="A:B shares of the lists (by first rating), comma-separated; the rest of the lists held out",
    )
    ap.add_argument("--epochs", type=int, default=TRAIN["epochs"], help="training epochs (A, and A+B)")
    ap.add_argument("--tune-share", type=float, default=0.75, help="B's first lists streamed when tuning")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    table, spec, lists = listed_movielens()
    splits: dict[str, dict] = {}
    for a, b in parse_splits(args.splits):
        by_seed = splits.setdefault(f"{a:g}/{b:g}/{1 - a - b:.2g}", {})
        for seed in (int(x) for x in args.seeds.split(",")):
            r = run_seed(seed, a, b, args, table, spec, lists)
            r["holds"] = r["streamed_minus_retrain"]["hi"] >= 0  # the interval contains 0 or lies above it
            by_seed[str(seed)] = r
    report = {
        "command": "python -m bench.stream_listwise " + " ".join(argv if argv is not None else sys.argv[1:]),
        "line": "A listwise model streamed on lists keeps NDCG on held-out lists within noise of a full retrain "
        "on the same data",
        "settings": {**vars(args), "train": TRAIN, "model": MODEL, "stream_grid": STREAM_GRID, "draws": DRAWS},
        "seconds": time.perf_counter() - t0,
        "splits": splits,
        "holds": all(r["holds"] for by_seed in splits.values() for r in by_seed.values()),
    }
    write_report(out, "results", report, markdown(report), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

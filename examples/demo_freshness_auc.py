"""Freshness demo on real MovieLens-100k: a frozen exported model vs the same model kept
fresh by the stream trainer, day by day after a GLOBAL time cut.

    python examples/demo_freshness_auc.py --out out/fresh [--days 30] [--cut-quantile 0.5]

1. build the data; train a DeepFM on the ratings before the cut (a quantile of the
   timestamps); export it (int8 x 4 shards by default) to MODELS/movielens/1;
2. copy the version to a second models directory: the "streamed" model. Its store is
   updated only by deltas, through the real updater (``offgraph.streaming.updater.Updater``, what
   ``offgraph update`` runs; ONE updater kept up for the whole demo) when it exists, else by
   ``store.write``;
3. for each evaluation day (UTC days after the cut with at least --min-events
   ratings, at most --days of them): stream-train on every rating not yet streamed
   that happened before that day, apply the deltas, then score the day's ratings with
   both models through ``offgraph.scoring.scorer.Scorer`` (rows grouped into requests as
   ``offgraph check`` does; the streamed scorer follows the live store) and compare
   held-out AUC / logloss.

Most users after a global cut are new: the frozen model has never seen them; the
streamed one learns them (and the items' drift) from their earlier ratings. Only the
users already seen in the stream (about a quarter of a day's ratings) can gain.
Tuning (sgd/adagrad, lr, batch, fields; see the flags' defaults): streaming EVERY table
(the shared side-feature tables too) loses AUC on users not seen yet, as a few bursty
raters drag the shared rows; streaming the id tables only (user_id, movie_id) with small
embedding steps and larger first-order steps gains on seen users and loses nothing elsewhere.
Prints a table and writes OUT/freshness_auc.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from offgraph.config import default
from offgraph.streaming.stream_train_config import OPTIMIZERS, StreamTrainConfig

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "examples" / "movielens.yaml"
MODEL = "movielens"
DAY_S = 86400


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python examples/demo_freshness_auc.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--days", type=int, default=30, help="evaluation days at most")
    p.add_argument("--cut-quantile", type=float, default=0.5, help="global time cut: this quantile of timestamps")
    p.add_argument("--min-events", type=int, default=300, help="ratings a day needs to be an evaluation day")
    p.add_argument("--spec", default=str(DEFAULT_SPEC))
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--quant", default="int8", choices=["fp32", "fp16", "int8"])
    # tuned on this protocol (see the module docstring): small steps for the embeddings (StreamTrainConfig's
    # defaults come from here), larger for the first-order weights, small batches, and only the id tables:
    # streaming the shared side-feature tables (gender, age, occupation, genres, crosses) lets a few bursty
    # raters drag them and hurts everyone else
    p.add_argument("--lr", type=float, default=default(StreamTrainConfig, "lr"))
    p.add_argument("--lr-first-order", type=float, default=0.1)
    p.add_argument("--optimizer", default=default(StreamTrainConfig, "optimizer"), choices=OPTIMIZERS)
    p.add_argument("--l2", type=float, default=default(StreamTrainConfig, "l2"))
    p.add_argument("--adagrad-init", type=float, default=default(StreamTrainConfig, "adagrad_init"))
    p.add_argument("--batch-size", type=int, default=default(StreamTrainConfig, "batch_size"))
    p.add_argument("--fields", default="user_id,movie_id", help="fields whose rows are streamed ('all': every one)")
    p.add_argument("--every-events", type=int, default=1000, help="delta file every K events")
    p.add_argument("--reuse", action="store_true", help="reuse OUT/run and OUT/models when present (tuning)")
    p.add_argument(
        "--apply",
        choices=["auto", "updater", "store-write"],
        default="auto",
        help="how deltas reach the streamed store (auto: the updater if offgraph/streaming/updater.py exists)",
    )
    args = p.parse_args(argv)
    if not 0 < args.cut_quantile < 1:
        raise ValueError(f"--cut-quantile must be in (0, 1), got {args.cut_quantile}")
    if args.days < 1 or args.min_events < 1:
        raise ValueError("--days and --min-events must be >= 1")
    return args


def _updater_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("offgraph.streaming.updater") is not None


def _start_updater(models_dir: Path, spool: Path):
    """The live updater (what `offgraph update --models DIR --model movielens --source spool:DIR` runs)."""
    from offgraph.streaming.sources import open_source
    from offgraph.streaming.updater import Updater

    up = Updater(models_dir, MODEL, open_source(f"spool:{spool}", delete_applied=True))
    up.start()
    return up


def _apply_updater(up) -> dict:
    """Apply everything in the spool now (like `run(once=True)`, but the updater stays up)."""
    before = dict(up.metrics.summary())
    while up.step() > 0:
        pass
    after = up.metrics.summary()
    return {k: after[k] - before[k] for k in ("rows_applied", "files_applied", "files_dead_lettered")}


class _StoreWriter:
    """Fallback without offgraph/streaming/updater.py: ``store.write`` of every spool file, in name order."""

    def __init__(self, version_dir: Path, spool: Path):
        from offgraph.store import open_store

        self.store = open_store(version_dir / "store", mode="w")
        self.spool = spool

    def apply(self) -> dict:
        from offgraph.streaming.deltas import read as read_delta_file

        rows, files = 0, sorted(self.spool.glob("*.delta.arrow"))
        for p in files:
            d = read_delta_file(p)
            self.store.write(d.table_ids, d.rows, d.vectors, d.first_order)
            rows += len(d)
            p.unlink()
        return {"files_applied": len(files), "rows_applied": rows}

    def close(self) -> None:
        self.store.close()


def _score(scorer, spec, columns: dict, idx: np.ndarray) -> np.ndarray:
    from offgraph.export.check import requests_from_rows

    out = np.zeros(len(idx), np.float32)
    for req, cands, pos in requests_from_rows(spec, columns, idx):
        out[pos] = scorer.score(req, cands)
    return out


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from offgraph.runtime import install_quiet_tensorflow_import

    install_quiet_tensorflow_import()  # TensorFlow's C++ start-up lines, hidden as by the offgraph CLI
    args = parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from offgraph.data.datasets import build
    from offgraph.export.export import export_run
    from offgraph.features.spec import load_spec
    from offgraph.model.metrics import auc, logloss
    from offgraph.model.train import TrainConfig, train_run
    from offgraph.scoring.scorer import Scorer
    from offgraph.streaming.stream_train import open_trainer

    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = load_spec(args.spec)
    table = pq.read_table(build("movielens-100k", out / "data"))
    ts = table.column("timestamp").to_numpy().astype(np.int64)
    cut = int(np.quantile(ts, args.cut_quantile))
    before = np.flatnonzero(ts < cut)
    run_dir, frozen_models = out / "run", out / "models"
    frozen = frozen_models / MODEL / "1"

    # 1. train before the cut, export
    t0 = time.perf_counter()
    if not (args.reuse and (frozen / "manifest.json").exists()):
        cfg = TrainConfig(epochs=args.epochs, split="random", held_out=0.05)
        _, metrics = train_run(
            spec, table.take(pa.array(before)), cfg, run_dir, source="movielens < cut", progress=False
        )
        if frozen_models.exists():
            shutil.rmtree(frozen_models)
        export_run(run_dir, frozen, shards=4, quant=args.quant, progress=False)
    train_s = time.perf_counter() - t0
    streamed_models = out / "streamed_models"
    streamed = streamed_models / MODEL / "1"
    if streamed_models.exists():
        shutil.rmtree(streamed_models)
    shutil.copytree(frozen, streamed)
    if (frozen_models / MODEL / "features").exists():  # the model's feature tables (shared by its versions)
        shutil.copytree(frozen_models / MODEL / "features", streamed_models / MODEL / "features")
    spool = out / "spool"
    if spool.exists():
        shutil.rmtree(spool)
    spool.mkdir()
    apply_mode = args.apply
    if apply_mode == "auto":
        apply_mode = "updater" if _updater_available() else "store-write"

    # 2. evaluation days
    day = ts // DAY_S
    after = ts >= cut
    cut_day = cut // DAY_S
    days, counts = np.unique(day[after & (day > cut_day)], return_counts=True)
    eval_days = days[counts >= args.min_events][: args.days]
    if len(eval_days) == 0:
        raise ValueError(f"no UTC day after the cut has >= {args.min_events} ratings")
    inputs = sorted(set(spec.raw_inputs("request")) | set(spec.raw_inputs("item")))
    columns = {c: table.column(c).to_pylist() for c in inputs}
    labels = table.column(spec.label).to_numpy().astype(np.float32)
    users = table.column("user_id").to_numpy()
    print(
        f"cut {time.strftime('%Y-%m-%d %H:%M', time.gmtime(cut))} UTC (q={args.cut_quantile}): "
        f"{len(before)} ratings before, {int(after.sum())} after; {len(eval_days)} evaluation days; "
        f"deltas applied by {'the updater (offgraph.streaming.updater.Updater, as offgraph update runs it)' if apply_mode == 'updater' else 'store.write on the copy'}",
        flush=True,
    )

    fields = None if args.fields == "all" else tuple(f.strip() for f in args.fields.split(",") if f.strip())
    scfg = StreamTrainConfig(
        lr=args.lr,
        optimizer=args.optimizer,
        batch_size=args.batch_size,
        l2=args.l2,
        lr_first_order=args.lr_first_order,
        fields=fields,
        adagrad_init=args.adagrad_init,
        every_events=args.every_events,
        time_unit="s",
    )
    # ONE writer for the whole demo (the live updater process); the streamed scorer follows it
    applier = _start_updater(streamed_models, spool) if apply_mode == "updater" else _StoreWriter(streamed, spool)
    state = {
        "per_day": [],
        "y": [],
        "frozen": [],
        "streamed": [],
        "seen": [],
        "files": 0,
        "rows_applied": 0,
        "served_minus_trained": 0.0,
        "streamed_idx": [],
        "seconds": {"stream_train": 0.0, "apply": 0.0, "score": 0.0},
    }
    try:
        with (
            open_trainer(model_dir=frozen, config=scfg) as trainer,
            Scorer(frozen) as fz,
            Scorer(streamed, store_mode="follow") as st,
        ):
            _run_days(
                eval_days,
                ts,
                day,
                table,
                spec,
                columns,
                labels,
                users,
                cut,
                trainer,
                fz,
                st,
                spool,
                applier,
                apply_mode,
                state,
            )
            rows_touched = trainer.rows.n_trained
            # progressive: each streamed rating scored by the trainer just before it trained on it, vs frozen
            py, pp = trainer.progressive_predictions()
            sidx = np.concatenate(state["streamed_idx"])
            if not np.array_equal(py, labels[sidx]):
                raise ValueError("internal error: the trainer's progressive predictions are not in table order")
            pfz = _score(fz, spec, columns, sidx)
            prog = {
                "events": int(len(sidx)),
                "auc_frozen": auc(py, pfz),
                "auc_streamed": auc(py, pp),
                "logloss_frozen": logloss(py, pfz),
                "logloss_streamed": logloss(py, pp),
            }
    finally:
        applier.close()
    per_day = state["per_day"]
    files, rows_applied, apply_err = state["files"], state["rows_applied"], state["served_minus_trained"]
    stream_s, apply_s, score_s = (state["seconds"][k] for k in ("stream_train", "apply", "score"))
    all_y, all_f, all_s, all_seen = state["y"], state["frozen"], state["streamed"], state["seen"]

    y, pf, ps, seen = (np.concatenate(a) for a in (all_y, all_f, all_s, all_seen))
    pooled = {
        "events": int(len(y)),
        "auc_frozen": auc(y, pf),
        "auc_streamed": auc(y, ps),
        "logloss_frozen": logloss(y, pf),
        "logloss_streamed": logloss(y, ps),
        "seen_user_fraction": float(seen.mean()),
    }
    if seen.any() and (~seen).any():
        pooled.update(
            auc_frozen_seen_users=auc(y[seen], pf[seen]),
            auc_streamed_seen_users=auc(y[seen], ps[seen]),
            auc_frozen_unseen_users=auc(y[~seen], pf[~seen]),
            auc_streamed_unseen_users=auc(y[~seen], ps[~seen]),
        )
    wins = sum(r["auc_streamed"] > r["auc_frozen"] for r in per_day)
    total_s = time.perf_counter() - t_start
    report = {
        "cut": cut,
        "cut_quantile": args.cut_quantile,
        "train_events": int(len(before)),
        "quant": args.quant,
        "apply": apply_mode,
        "stream_config": vars(scfg),
        "per_day": per_day,
        "pooled": pooled,
        "days_streamed_better": wins,
        "files_emitted": files,
        "rows_touched": rows_touched,
        "rows_applied": rows_applied,
        "max_abs_served_minus_trained": apply_err,
        "progressive": prog,
        "seconds": {
            "train_export": train_s,
            "stream_train": stream_s,
            "apply": apply_s,
            "score": score_s,
            "total": total_s,
        },
    }
    (out / "freshness_auc.json").write_text(json.dumps(report, indent=2, default=float))
    _plot_days(report["per_day"], out / "freshness_auc.png")
    _print_table(report)
    print(f"per-day AUC: {out / 'freshness_auc.png'}")
    return 0


def _plot_days(per_day: list[dict], path: Path) -> None:
    """Frozen vs streamed AUC per day, and the day's ratings (bars, right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = [r["day"] for r in per_day]
    x = np.arange(len(days))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    bars = ax.twinx()
    bars.bar(x, [r["events"] for r in per_day], color="0.85", width=0.6)
    bars.set_ylabel("ratings that day", color="0.5")
    ax.set_zorder(bars.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.plot(x, [r["auc_frozen"] for r in per_day], "o-", label="frozen (trained up to the cut)")
    ax.plot(x, [r["auc_streamed"] for r in per_day], "s-", label="streamed (stream-trained, applied live)")
    ax.set_xticks(x, days, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("AUC")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _run_days(
    eval_days, ts, day, table, spec, columns, labels, users, cut, trainer, fz, st, spool, applier, apply_mode, state
) -> None:
    """Per evaluation day: stream-train on what happened before it, apply, catch up, score both models."""
    import pyarrow as pa

    from offgraph.model.metrics import auc, logloss
    from offgraph.store.keys import split_keys
    from offgraph.streaming.stream_train import stream_train_table

    secs = state["seconds"]
    streamed_upto = cut  # ratings with cut <= ts < streamed_upto have been streamed
    seen_users: set = set()
    for d in eval_days:
        start = int(d) * DAY_S
        new = np.flatnonzero((ts >= streamed_upto) & (ts < start))
        t0 = time.perf_counter()
        s = stream_train_table(trainer, table.take(pa.array(new)), spool, progress=False, source="movielens")
        secs["stream_train"] += time.perf_counter() - t0
        state["streamed_idx"].append(new)  # the table is in time order: the trainer keeps this order
        seen_users.update(users[new].tolist())
        streamed_upto = start
        t0 = time.perf_counter()
        res = _apply_updater(applier) if apply_mode == "updater" else applier.apply()
        st.store.catch_up()
        secs["apply"] += time.perf_counter() - t0
        if res.get("files_dead_lettered"):
            raise ValueError(f"the updater refused {res['files_dead_lettered']} delta file(s): see {spool}/dead/")
        state["files"] += s["files_emitted"]
        state["rows_applied"] += int(res["rows_applied"])
        # what the streamed scorer serves is what the trainer holds (up to quantization)
        n = trainer.rows.size
        t, r = split_keys(trainer.rows.keys[:n])
        served, _, _ = st.store.read_unique(t, r)
        err = float(np.abs(served - trainer.rows.vectors[:n]).max(initial=0.0))
        state["served_minus_trained"] = max(state["served_minus_trained"], err)
        idx = np.flatnonzero(day == d)
        t0 = time.perf_counter()
        pf, ps = _score(fz, spec, columns, idx), _score(st, spec, columns, idx)
        secs["score"] += time.perf_counter() - t0
        y = labels[idx]
        seen = np.isin(users[idx], list(seen_users))
        row = {
            "day": time.strftime("%Y-%m-%d", time.gmtime(start)),
            "events": int(len(idx)),
            "streamed_events_before": int(s["events"]),
            "seen_user_fraction": float(seen.mean()),
            "auc_frozen": auc(y, pf),
            "auc_streamed": auc(y, ps),
            "logloss_frozen": logloss(y, pf),
            "logloss_streamed": logloss(y, ps),
            "max_abs_served_minus_trained": err,
        }
        state["per_day"].append(row)
        for k, v in (("y", y), ("frozen", pf), ("streamed", ps), ("seen", seen)):
            state[k].append(v)
        print(
            f"  {row['day']}: {row['events']:5d} ratings ({100 * row['seen_user_fraction']:3.0f}% seen users) "
            f"AUC frozen {row['auc_frozen']:.4f} streamed {row['auc_streamed']:.4f} "
            f"({row['auc_streamed'] - row['auc_frozen']:+.4f}); served-trained {err:.2g}",
            flush=True,
        )


def _print_table(rep: dict) -> None:
    print()
    print(
        f"{'day (UTC)':<12}{'ratings':>8}{'seen':>6}{'AUC frozen':>12}{'AUC streamed':>14}{'delta':>9}"
        f"{'LL frozen':>11}{'LL streamed':>13}"
    )
    for r in rep["per_day"]:
        print(
            f"{r['day']:<12}{r['events']:>8}{100 * r['seen_user_fraction']:>5.0f}%{r['auc_frozen']:>12.4f}"
            f"{r['auc_streamed']:>14.4f}{r['auc_streamed'] - r['auc_frozen']:>+9.4f}"
            f"{r['logloss_frozen']:>11.4f}{r['logloss_streamed']:>13.4f}"
        )
    p = rep["pooled"]
    print(
        f"{'pooled':<12}{p['events']:>8}{100 * p['seen_user_fraction']:>5.0f}%{p['auc_frozen']:>12.4f}"
        f"{p['auc_streamed']:>14.4f}{p['auc_streamed'] - p['auc_frozen']:>+9.4f}"
        f"{p['logloss_frozen']:>11.4f}{p['logloss_streamed']:>13.4f}"
    )
    if "auc_frozen_seen_users" in p:
        print(
            f"pooled, users seen in the stream: AUC frozen {p['auc_frozen_seen_users']:.4f} streamed "
            f"{p['auc_streamed_seen_users']:.4f}; unseen: frozen {p['auc_frozen_unseen_users']:.4f} "
            f"streamed {p['auc_streamed_unseen_users']:.4f}"
        )
    s = rep["seconds"]
    c = rep["stream_config"]
    print(
        f"streamed better on {rep['days_streamed_better']}/{len(rep['per_day'])} days; {c['optimizer']} lr {c['lr']} "
        f"(first-order {c['lr_first_order'] if c['lr_first_order'] is not None else c['lr']}) batch {c['batch_size']}, "
        f"fields {','.join(c['fields']) if c['fields'] else 'all'}; {rep['files_emitted']} delta files, {rep['rows_touched']} rows touched, applied by "
        f"{rep['apply']} ({rep['quant']} store; max |served - trained| {rep['max_abs_served_minus_trained']:.2g})"
    )
    g = rep["progressive"]
    print(
        f"progressive (each of the {g['events']} streamed ratings scored just before the trainer stepped on it): "
        f"AUC frozen {g['auc_frozen']:.4f} streamed {g['auc_streamed']:.4f} ({g['auc_streamed'] - g['auc_frozen']:+.4f}), "
        f"logloss {g['logloss_frozen']:.4f} -> {g['logloss_streamed']:.4f}"
    )
    print(
        f"time: train+export {s['train_export']:.0f}s, stream-train {s['stream_train']:.0f}s, apply {s['apply']:.0f}s, "
        f"score {s['score']:.0f}s, total {s['total']:.0f}s"
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"demo_freshness_auc: error: {e}", file=sys.stderr)
        sys.exit(2)

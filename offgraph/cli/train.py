"""`offgraph train`: train a DeepFM on a raw table and write RUN."""

from __future__ import annotations

import argparse

from offgraph.cli import LazyChoices
from offgraph.cli.settings_flags import add_settings_flags, settings_from_args
from offgraph.cli.table_args import add_table_args, check_table_columns, read_table_args

# `offgraph --help` imports this module: nothing heavy here (the trainer is imported in run)
from offgraph.model.train_config import TrainConfig


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a DeepFM from a feature spec on a raw table")
    p.add_argument("--spec", required=True, help="feature spec YAML")
    p.add_argument("--data", required=True, help="raw table: Parquet, CSV/TSV or JSON lines")
    p.add_argument("--out", required=True, help="run directory to write")
    add_table_args(p)
    add_settings_flags(
        p,
        TrainConfig,
        exclude={"eval_batch_size", "schedule"},
        kwargs={"split": {"choices": LazyChoices("offgraph.model.splits", "SPLITS"), "metavar": "SPLIT"}},
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from offgraph.features.spec import load_spec

    cfg = settings_from_args(TrainConfig, args)
    spec = load_spec(args.spec)
    cfg.validate(spec)
    check_table_columns(spec, args)  # a misspelt column is told now, not after the rows are read
    table = read_table_args(args)
    from offgraph.model.train import train_run  # TensorFlow: only once the inputs are known to be good

    _, metrics = train_run(spec, table, cfg, args.out, source=str(args.data), progress=not args.no_progress)
    h = metrics["held_out"]
    sel = h["selected_by"]
    if sel["best_epoch"] is None:
        chosen = "no validation rows: the last epoch kept"
    else:
        best = "undefined" if sel["best_validation"] is None else f"{sel['best_validation']:.4f}"
        n = sel["best_epoch"]  # worded without "epoch N": each epoch is one line of the output
        chosen = f"best validation {best} after {n} epoch{'s' if n != 1 else ''}"
    print(
        f"held-out: AUC {h['auc']:.4f}  logloss {h['logloss']:.4f}"
        + (f"  NDCG@10 {h['ndcg@10']:.4f}" if "ndcg@10" in h else "")
        + (f"  {sel['metric']} {h[sel['metric']]:.4f}" if sel["metric"] not in ("auc", "logloss", "ndcg@10") else "")
        + f"  rows {h['rows']}  train {metrics['train_seconds']:.1f}s  -> {args.out}\n"
        + f"loss {metrics['config']['loss']}, epochs chosen by validation {sel['metric']} ({chosen})"
    )
    return 0

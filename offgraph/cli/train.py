"""`offgraph train`: train a DeepFM on a raw table and write RUN."""

from __future__ import annotations

import argparse

from offgraph.cli import LazyChoices

# `offgraph --help` imports this module: nothing heavy here (the trainer is imported in run)
from offgraph.model.train_config import LOSSES, OPTIMIZERS, TrainConfig


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a DeepFM from a feature spec on a raw table")
    p.add_argument("--spec", required=True, help="feature spec YAML")
    p.add_argument("--data", required=True, help="raw table: Parquet, CSV/TSV or JSON lines")
    p.add_argument("--out", required=True, help="run directory to write")
    add_table_args(p)
    d = TrainConfig()  # the defaults
    p.add_argument("--epochs", type=int, default=d.epochs, help="default %(default)s")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="default %(default)s")
    p.add_argument("--lr", type=float, default=d.lr, help="default %(default)g")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=d.optimizer, help="default %(default)s")
    p.add_argument("--loss", choices=LOSSES, default=d.loss, help="default %(default)s")
    p.add_argument(
        "--split",
        choices=LazyChoices("offgraph.model.splits", "SPLITS"),
        metavar="SPLIT",
        default=d.split,
        help="held-out split: %(choices)s (default %(default)s)",
    )
    p.add_argument(
        "--held-out", type=float, default=d.held_out, help="held-out fraction, in (0, 1) (default %(default)g)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="default %(default)s")
    p.add_argument(
        "--validation",
        type=float,
        default=d.validation,
        help="fraction of the training rows (same split) that picks the best epoch: early stopping, "
        "best weights restored; 0: keep the last epoch (default %(default)g)",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=d.patience,
        help="epochs without a better validation AUC before stopping (default %(default)s)",
    )
    p.add_argument(
        "--no-refit",
        action="store_true",
        help="keep the best epoch's weights of the validation pass instead of retraining on all the "
        "training rows for that many epochs",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def add_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--columns", help="comma-separated column names of a CSV/TSV file without a header line")
    p.add_argument("--sep", help="CSV/TSV field separator (default: ',' for .csv, tab for .tsv)")


def read_table_args(args: argparse.Namespace):
    """The --data table, honouring --columns / --sep."""
    from offgraph.features.tables import read_table

    names = [c.strip() for c in args.columns.split(",")] if args.columns else None
    return read_table(args.data, names=names, header=False if names else None, sep=args.sep)


def run(args: argparse.Namespace) -> int:
    from offgraph.features.spec import load_spec

    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        optimizer=args.optimizer,
        loss=args.loss,
        split=args.split,
        held_out=args.held_out,
        seed=args.seed,
        validation=args.validation,
        patience=args.patience,
        refit=not args.no_refit,
    )
    spec = load_spec(args.spec)
    cfg.validate(spec)
    table = read_table_args(args)
    from offgraph.model.train import train_run  # TensorFlow: only once the inputs are known to be good

    _, metrics = train_run(spec, table, cfg, args.out, source=str(args.data), progress=not args.no_progress)
    h = metrics["held_out"]
    print(
        f"held-out: AUC {h['auc']:.4f}  logloss {h['logloss']:.4f}"
        + (f"  NDCG@10 {h['ndcg@10']:.4f}" if "ndcg@10" in h else "")
        + f"  rows {h['rows']}  train {metrics['train_seconds']:.1f}s  -> {args.out}"
    )
    return 0

"""`offgraph data NAME --out DIR`: convert a known dataset (offgraph/data/datasets.py) into the trainer's
Parquet input."""

from __future__ import annotations

import argparse

# `offgraph --help` imports this module: nothing heavy here (PyArrow is imported in run)
from offgraph.cli import LazyChoices


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add `data NAME --out DIR [--source DIR]` to an argparse subparsers
    object; the handler is `run` (set as the `func` default)."""
    p = subparsers.add_parser(
        "data",
        help="convert a known dataset into the trainer's Parquet input",
        description="Convert a known dataset into one flat Parquet table of raw columns.",
    )
    p.add_argument(
        "name", choices=LazyChoices("offgraph.data.datasets", "DATASETS"), metavar="NAME", help="dataset: %(choices)s"
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--source",
        default=None,
        help="folder holding the raw files (default: $OFFGRAPH_DATA_DIR/NAME if that variable is set, else "
        "<repo>/../shared/data/NAME; MovieLens-100k is downloaded if absent)",
    )
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from offgraph.data.datasets import build

    path = build(args.name, args.out, getattr(args, "source", None))
    meta = pq.read_metadata(path)
    label = pq.read_table(path, columns=["label"]).column("label")
    rate = pc.mean(label).as_py() if len(label) else float("nan")
    names = meta.schema.to_arrow_schema().names
    print(f"{args.name}: wrote {meta.num_rows:,} rows x {len(names)} columns, {rate:.1%} positive, to {path}")
    print("columns: " + ", ".join(names))
    return 0

"""`offgraph import`: a version from a model trained elsewhere (offgraph.export.import_model)."""

from __future__ import annotations

import argparse
import json

from offgraph.cli import LazyChoices

# `offgraph --help` imports this module: nothing heavy here (the importer is imported in run_import)


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="build a version from tables and a dense head trained elsewhere (or one Keras model)",
        description="Build a version MODELS/NAME/VERSION in the format `offgraph export` writes from a model "
        "trained elsewhere: per-field tables (Parquet or Arrow: row or key, vector, first_order) and a dense "
        "head taking emb [N, F, D] and first_order [N, F] (and dense [N, k]), or one Keras model with the "
        "layers FIELD_emb and FIELD_first_order per field (docs/DESIGN.md, 'Importing models trained elsewhere').",
    )
    p.add_argument("--spec", required=True, help="the feature spec (FG) the model was trained with")
    p.add_argument(
        "--tables",
        nargs="+",
        metavar="DIR_OR_FILE",
        help="a directory of FIELD.parquet / FIELD.arrow files, or the files (one per field)",
    )
    p.add_argument("--dense", metavar="HEAD", help="the dense head: a SavedModel directory or a .keras / .h5 file")
    p.add_argument(
        "--keras",
        metavar="MODEL",
        help="instead of --tables and --dense: one Keras model (.keras / .h5) whose embeddings the importer splits",
    )
    p.add_argument("--out", required=True, help="version directory MODELS/NAME/VERSION")
    p.add_argument(
        "--quant",
        choices=LazyChoices("offgraph.store.quant", "CODECS"),
        metavar="QUANT",
        default="int8",
        help="row format: %(choices)s (default %(default)s)",
    )
    p.add_argument("--shards", type=int, default=8)
    p.add_argument(
        "--check-rows",
        metavar="FILE",
        help="sample rows (Parquet, with the spec's inputs and label): the version's served scores must equal "
        "the sources' within the quantization's bound, else the import fails (exit 1)",
    )
    p.add_argument("--json", help="also write the check's figures to this file")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_import)


def run_import(args) -> int:
    from offgraph.export.import_model import ImportRefused, import_model

    rows = None
    if args.check_rows:
        import pyarrow.parquet as pq

        rows = pq.read_table(args.check_rows)
    try:
        m, checked = import_model(
            args.spec,
            args.out,
            tables=args.tables,
            dense=args.dense,
            keras_model=args.keras,
            quant=args.quant,
            shards=args.shards,
            progress=not args.no_progress,
            check_rows=rows,
            check_source=args.check_rows or "<rows>",
        )
    except ImportRefused as e:
        if "served scores differ" not in str(e):
            raise
        print(f"FAIL: {e}")
        return 1
    print(
        f"imported -> {args.out}: {len(m.fields)} tables, {m.store.total_rows:,} rows, {m.store.quant} "
        f"x {m.store.shards} shards"
        + (
            f"; check on {checked['rows']} rows: max |dp| {checked['max_abs_dp']:.3g} <= {checked['derived_max_diff']:.3g}"
            if checked
            else ""
        )
    )
    if args.json and checked:
        with open(args.json, "w") as f:
            json.dump(checked, f, indent=2)
    return 0

"""`offgraph features load`: bulk-load an entity feature table (the spec's `tables`) from a file."""

from __future__ import annotations

import argparse
import sys

# `offgraph --help` imports this module: nothing heavy here
from offgraph.cli.table_args import add_table_args, read_table_args


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("features", help="entity feature tables the server joins by key (user, item)")
    fsub = p.add_subparsers(dest="features_cmd", required=True)
    ld = fsub.add_parser(
        "load",
        help="bulk-load one table from a Parquet / CSV / TSV / JSON-lines file (SST "
        "ingestion; rows of keys already there are replaced)",
    )
    ld.add_argument(
        "--model",
        required=True,
        help="MODELS/NAME: the table goes to MODELS/NAME/features/TABLE, shared by the model's versions",
    )
    ld.add_argument("--table", required=True, help="table name, as declared under the spec's `tables`")
    ld.add_argument(
        "--data",
        required=True,
        help="one row per key: the key column and every column of the table (a "
        "file, or a directory of Parquet files only: one dataset)",
    )
    ld.add_argument("--spec", help="the spec declaring the table (default: the newest complete version's)")
    add_table_args(ld)
    ld.add_argument("--no-progress", action="store_true")
    ld.set_defaults(func=run_load)


def run_load(args) -> int:
    from pathlib import Path

    from offgraph.feature_tables.db import FeatureTableError
    from offgraph.feature_tables.load import load_table
    from offgraph.features.spec import SpecError, load_spec
    from offgraph.features.tables import DataError, parquet_files, row_locator
    from offgraph.modeldir.manifest import ModelDirError, complete_versions
    from offgraph.modeldir.version import ModelVersion

    def fail(msg: str) -> int:
        print(f"offgraph features load: error: {msg}", file=sys.stderr)
        return 2

    model = Path(args.model)
    try:
        if args.spec:
            spec = load_spec(args.spec)
        else:
            versions = complete_versions(model)
            if not versions:
                return fail(f"{model}: no complete version to read the spec from; pass --spec")
            vdir = model / str(versions[-1])
            spec = ModelVersion.open(vdir, verify_dense=False).spec
        tables = {t.name: t for t in spec.tables}
        if args.table not in tables:
            return fail(f"the spec declares no table {args.table!r} (its tables: {sorted(tables) or 'none'})")
        data = read_table_args(args)
        dataset = ""
        if Path(args.data).is_dir():  # say so: a directory is one Parquet dataset (offgraph/features/tables.py)
            dataset = f" from the Parquet dataset of {len(parquet_files(args.data))} file(s) in {args.data}"
        names = args.columns
        where = row_locator(args.data, header=False if names else None, names=names, sep=args.sep)
        res = load_table(
            model, tables[args.table], spec, data, source=str(args.data), progress=not args.no_progress, where=where
        )
    except (SpecError, ModelDirError, DataError, FeatureTableError, OSError) as e:
        return fail(str(e))
    ign = res["ignored_columns"]  # a file may have 10^5 columns: name a few
    extra = (f"; ignored {len(ign)} column(s) {ign[:10]}" + (" ..." if len(ign) > 10 else "")) if ign else ""
    print(f"loaded {res['rows']:,} rows{dataset} into {res['path']}{extra}")
    return 0

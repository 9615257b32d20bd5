"""`offgraph features load`: bulk-load an entity feature table (the spec's `tables`) from a file."""
from __future__ import annotations

import argparse
import sys

# `offgraph --help` imports this module: nothing heavy here
from dense_model.cli_train import add_table_args, read_table_args


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("features", help="entity feature tables the server joins by key (user, item)")
    fsub = p.add_subparsers(dest="features_cmd", required=True)
    ld = fsub.add_parser("load", help="bulk-load one table from a Parquet / CSV / TSV / JSON-lines file (SST "
                                      "ingestion; rows of keys already there are replaced)")
    ld.add_argument("--model", required=True, help="MODELS/NAME: the table goes to MODELS/NAME/features/TABLE, "
                                                   "shared by the model's versions")
    ld.add_argument("--table", required=True, help="table name, as declared under the spec's `tables`")
    ld.add_argument("--data", required=True, help="one row per key: the key column and every column of the table")
    ld.add_argument("--spec", help="the spec declaring the table (default: the newest complete version's)")
    add_table_args(ld)
    ld.add_argument("--no-progress", action="store_true")
    ld.set_defaults(func=run_load)


def run_load(args) -> int:
    from pathlib import Path

    from embstore.feature_db import FeatureTableError
    from embstore.feature_load import load_table
    from exporter.manifest import ModelDirError, complete_versions, load_manifest
    from features.spec import SpecError, load_spec, parse_spec
    from features.tables import DataError

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
            spec = parse_spec(load_manifest(vdir, verify_dense=False)["spec"], source=str(vdir / "manifest.json"))
        tables = {t.name: t for t in spec.tables}
        if args.table not in tables:
            return fail(f"the spec declares no table {args.table!r} (its tables: {sorted(tables) or 'none'})")
        data = read_table_args(args)
        res = load_table(model, tables[args.table], spec, data, source=str(args.data),
                         progress=not args.no_progress)
    except (SpecError, ModelDirError, DataError, FeatureTableError, OSError) as e:
        return fail(str(e))
    extra = f"; ignored columns {res['ignored_columns']}" if res["ignored_columns"] else ""
    print(f"loaded {res['rows']:,} rows into {res['path']}{extra}")
    return 0

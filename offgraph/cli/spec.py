"""`offgraph spec check SPEC [--data FILE]`: validate a feature spec (and that a table has the columns it
reads) without training; `offgraph spec schema`: the spec's JSON Schema, for editors."""

from __future__ import annotations

import argparse
import sys

# `offgraph --help` imports this module: nothing heavy here (the spec's modules are imported in run)
from offgraph.cli.table_args import add_table_args, check_table_columns

SCHEMA_FILE = "docs/spec.schema.json"
"""Where the repository keeps the schema (tests/features/test_spec_schema.py checks it is up to date)."""


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spec", help="check a feature spec; print its JSON Schema")
    ssub = p.add_subparsers(dest="spec_cmd", required=True)
    c = ssub.add_parser(
        "check",
        help="validate a spec (and, with --data, that the table has every column it reads); exit 2 on an error",
    )
    c.add_argument("spec", help="feature spec YAML")
    c.add_argument("--data", help="a raw table (Parquet, CSV/TSV, JSON lines): its columns are checked, not its rows")
    add_table_args(c)
    c.set_defaults(func=run_check)
    s = ssub.add_parser("schema", help=f"print the spec's JSON Schema (the repository keeps it in {SCHEMA_FILE})")
    s.set_defaults(func=run_schema)


def run_check(args: argparse.Namespace) -> int:
    from offgraph.features.spec import load_spec
    from offgraph.features.spec_columns import spec_columns
    from offgraph.model.train_config import default_split

    spec = load_spec(args.spec)  # a SpecError is printed by offgraph.cli.main, exit 2
    checked = check_table_columns(spec, args) if args.data else False  # likewise a missing column
    ops: dict[str, int] = {}
    for f in spec.fields + spec.numeric:
        ops[f.op] = ops.get(f.op, 0) + 1
    split, why = default_split(spec)
    print(
        f"spec {args.spec}: ok: {len(spec.fields)} embedding field(s), {len(spec.numeric)} numeric; ops "
        + ", ".join(f"{op} x{n}" for op, n in ops.items())
        + f"; label '{spec.label}'"
        + "".join(f"; {k} '{getattr(spec, k)}'" for k in ("group", "time", "split_key", "item_key") if getattr(spec, k))
        + (f"; tables {[t.name for t in spec.tables]}" if spec.tables else "")
    )
    print(f"default split: {split} ({why})")
    if args.data:
        if checked:
            print(f"data {args.data}: has all {len(spec_columns(spec))} column(s) the spec reads")
        else:
            print(f"data {args.data}: columns not checked (JSON lines name them only in their rows)", file=sys.stderr)
    return 0


def run_schema(args: argparse.Namespace) -> int:
    from offgraph.features.spec_schema import schema_json

    print(schema_json(), end="")
    return 0

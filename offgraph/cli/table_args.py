"""The flags that say how to read a raw table (``--columns``, ``--sep``), shared by the subcommands that
read one, and the check of a spec's columns against the table's before its rows are read."""

from __future__ import annotations

import argparse
import re
from collections import Counter

# `offgraph --help` imports this module: nothing heavy here (PyArrow is imported when a table is read)

_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<lo>\d+)\.\.(?P<prefix2>.*?)(?P<hi>\d+)$")


def expand_columns(text: str) -> list[str]:
    """``label,I1..I13,C1..C26`` -> label, I1, ..., I13, C1, ..., C26: comma-separated names, where
    ``<prefix><a>..<prefix><b>`` (a <= b, one prefix) stands for every number from a to b. A bad range
    or a name given twice is an ``argparse.ArgumentTypeError`` naming it."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise argparse.ArgumentTypeError(f"empty column name in {text!r}")
        if part in ("...", "..", "…"):
            raise argparse.ArgumentTypeError(f"{part!r} in {text!r}: write a range as I1..I13")
        if ".." not in part:
            names.append(part)
            continue
        names.extend(_expand_range(part))
    twice = [n for n, k in Counter(names).items() if k > 1]
    if twice:
        raise argparse.ArgumentTypeError(f"duplicate column name(s) {twice} in {text!r}")
    return names


def _expand_range(part: str) -> list[str]:
    m = _RANGE.match(part)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"bad range {part!r}: a range is <prefix><first>..<prefix><last> with whole numbers, e.g. I1..I13"
        )
    prefix, lo, hi = m["prefix"], int(m["lo"]), int(m["hi"])
    if m["prefix2"] != prefix:
        raise argparse.ArgumentTypeError(
            f"bad range {part!r}: both ends need the same prefix ({prefix!r} vs {m['prefix2']!r})"
        )
    if lo > hi:
        raise argparse.ArgumentTypeError(
            f"bad range {part!r}: it runs backwards ({lo} > {hi}); write {prefix}{hi}..{prefix}{lo}"
        )
    width = len(m["lo"]) if m["lo"].startswith("0") and len(m["lo"]) > 1 else 0  # C01..C26 keeps its zeros
    return [f"{prefix}{i:0{width}d}" for i in range(lo, hi + 1)]


def add_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--columns",
        type=expand_columns,
        metavar="NAMES",
        help="comma-separated column names of a CSV/TSV file without a header line; a range I1..I13 stands "
        "for I1, I2, ..., I13 (e.g. label,I1..I13,C1..C26)",
    )
    p.add_argument("--sep", help="CSV/TSV field separator (default: ',' for .csv, tab for .tsv)")


def read_table_args(args: argparse.Namespace):
    """The --data table, honouring --columns / --sep."""
    from offgraph.features.tables import read_table

    names = args.columns
    return read_table(args.data, names=names, header=False if names else None, sep=args.sep)


def check_table_columns(spec, args: argparse.Namespace) -> bool:
    """DataError now, before the rows are read, when the --data table lacks a column the spec reads (from
    the Parquet schema, the CSV header or --columns); False where only the rows would tell (JSON lines)."""
    from offgraph.features.spec_columns import check_spec_columns
    from offgraph.features.tables import column_names

    names = args.columns
    have = column_names(args.data, header=False if names else None, names=names, sep=args.sep)
    if have is None:
        return False
    check_spec_columns(spec, have, str(args.data))
    return True

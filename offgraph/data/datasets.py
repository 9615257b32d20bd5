"""Named datasets converted into the trainer's input format (one flat Parquet
table of raw columns), for the `offgraph data NAME --out DIR` subcommand.

  movielens-100k -> DIR/movielens.parquet (see datasets_movielens)
  criteo-10k     -> DIR/criteo.parquet: label, I1..I13 (int64, nullable),
                    C1..C26 (string, nullable), from the header-less TSV
  frappe-86k     -> DIR/frappe.parquet: label (0/1), user, item, daytime,
                    weekday, isweekend, homework, cost, weather, country, city
                    (int64 codes), src (string: "validation"/"test")

The trainer can also read the raw CSV/TSV files directly through
offgraph.features.tables.read_table; these conversions only give it one format.
The subcommand itself is in offgraph/cli/data.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offgraph.data import movielens as datasets_movielens
from offgraph.data.data_dir import dataset_dir, where_to_put
from offgraph.features.tables import read_table

CRITEO_INT = [f"I{i}" for i in range(1, 14)]
CRITEO_CAT = [f"C{i}" for i in range(1, 27)]
CRITEO_COLUMNS = ["label"] + CRITEO_INT + CRITEO_CAT
FRAPPE_COLUMNS = [
    "label",
    "user",
    "item",
    "daytime",
    "weekday",
    "isweekend",
    "homework",
    "cost",
    "weather",
    "country",
    "city",
    "src",
]

CRITEO_FILE = "criteo_10k.tsv"
FRAPPE_FILE = "frappe_nfm_valtest_86k.csv"


def _source_file(name: str, fname: str, source) -> Path:
    d, why = dataset_dir(name, source)
    p = d / fname
    if not p.is_file():
        raise FileNotFoundError(
            f"{p} not found (looked in {d}, from {why}): {name} is not redistributable and cannot be "
            f"fetched; {where_to_put(name, fname)}"
        )
    return p


def _write(table: pa.Table, out_dir, fname: str) -> str:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / fname
    tmp = out / (fname + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return str(path)


def load_criteo(source=None) -> pa.Table:
    types = {"label": pa.int64(), **{c: pa.int64() for c in CRITEO_INT}, **{c: pa.string() for c in CRITEO_CAT}}
    return read_table(
        _source_file("criteo-10k", CRITEO_FILE, source), fmt="tsv", header=False, names=CRITEO_COLUMNS, types=types
    )


def load_frappe(source=None) -> pa.Table:
    t = read_table(_source_file("frappe-86k", FRAPPE_FILE, source), fmt="csv", columns=FRAPPE_COLUMNS)
    # The NFM/AFN split of frappe uses labels -1/1 in its libfm files; this
    # CSV already has 0/1. Map any positive label to 1 and the rest to 0 so
    # both variants end up 0/1.
    label = pc.cast(pc.greater(t.column("label"), 0), pa.int64())
    t = t.set_column(0, "label", label)
    types = {c: pa.int64() for c in FRAPPE_COLUMNS if c != "src"}
    types["src"] = pa.string()
    return pa.table({c: pc.cast(t.column(c), types[c]) for c in FRAPPE_COLUMNS})


def build_movielens(out_dir, source=None) -> str:
    return datasets_movielens.build(out_dir, source)


def build_criteo(out_dir, source=None) -> str:
    return _write(load_criteo(source), out_dir, "criteo.parquet")


def build_frappe(out_dir, source=None) -> str:
    return _write(load_frappe(source), out_dir, "frappe.parquet")


DATASETS: dict[str, Callable[..., str]] = {
    "movielens-100k": build_movielens,
    "criteo-10k": build_criteo,
    "frappe-86k": build_frappe,
}


def build(name: str, out_dir, source=None) -> str:
    """Convert dataset `name` into `out_dir`; return the Parquet file's path."""
    try:
        fn = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}") from None
    return fn(out_dir, source)

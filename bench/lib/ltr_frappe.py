"""`bench.ltr`'s other real data set with lists: the Frappe app-usage log (86,582 rows, ``offgraph data frappe-86k``),
one list per (user, usage context): the apps logged in that context, each used one beside the two apps the log's
makers drew as negatives for it (binary gains). 27,101 lists, median 4 rows; 13,792 hold both a used and an unused
app. No timestamps: the held-out lists are a random 20% of the lists, the validation lists a random 20% of the
training ones (whole lists on either side)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from bench.lib.ltr_data import HELD_OUT, VALIDATION, Protocol
from offgraph.data.datasets import load_frappe
from offgraph.features.spec import FeatureSpec, parse_spec
from offgraph.model.inputs import encode_table

REPO = Path(__file__).resolve().parents[2]
FRAPPE_SPEC = REPO / "examples" / "frappe.yaml"
# what makes a list: the user and every context column of the log (cost is the app's)
CONTEXT = ("user", "daytime", "weekday", "isweekend", "homework", "weather", "country", "city")


def frappe_spec() -> FeatureSpec:
    """examples/frappe.yaml with its lists: ``group`` the (user, context) list id."""
    raw = yaml.safe_load(FRAPPE_SPEC.read_text())
    raw["group"] = "list"
    return parse_spec(raw)


def list_ids(table: pa.Table) -> np.ndarray:
    """Each row's list: the index of its (user, context) among the distinct ones."""
    key = np.stack([table.column(c).to_numpy() for c in CONTEXT], axis=1)
    return np.unique(key, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


def frappe_protocol(seed: int) -> Protocol:
    table = load_frappe()
    lst = list_ids(table)
    table = table.append_column("list", pa.array(lst))
    spec = frappe_spec()
    data = encode_table(spec, table, "frappe-86k")
    items = table.column("item").to_numpy()
    rng = np.random.default_rng(2000 + seed)
    n_lists = int(lst.max()) + 1
    held_list = rng.random(n_lists) < HELD_OUT
    val_list = rng.random(n_lists) < VALIDATION  # drawn for every list, used for the training ones
    tr, te = np.flatnonzero(~held_list[lst]), np.flatnonzero(held_list[lst])
    fi, va = tr[~val_list[lst[tr]]], tr[val_list[lst[tr]]]
    return Protocol(
        "frappe",
        10,
        spec,
        data.take(tr),
        data.take(te),
        items[tr],
        items[te],
        data.take(fi),
        data.take(va),
        items[fi],
        items[va],
    )

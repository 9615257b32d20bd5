"""The raw columns a spec reads from a training table, and the check that a table has them (each missing
one named with what reads it and the closest column the table has)."""

from __future__ import annotations

from collections.abc import Sequence

from offgraph.features.spec import FeatureSpec
from offgraph.features.suggest import did_you_mean
from offgraph.features.tables import DataError


def spec_columns(spec: FeatureSpec) -> dict[str, str]:
    """{column: what reads it}, in spec order: the fields' raw inputs, then the label, group, time and
    split-key columns."""
    out: dict[str, str] = {}
    for f in spec.fields + spec.numeric:
        if f.input is not None:
            out.setdefault(f.input, f"input of field '{f.name}'")
    for what in ("label", "group", "time", "split_key"):
        col = getattr(spec, what)
        if col is not None:
            out.setdefault(col, f"the spec's {what} column")
    return out


def check_spec_columns(spec: FeatureSpec, have: Sequence[str], source: str) -> None:
    """DataError naming every column of ``spec_columns`` that ``have`` lacks, with a did-you-mean each."""
    present = set(have)
    missing = [(c, what) for c, what in spec_columns(spec).items() if c not in present]
    if not missing:
        return
    shown = "; ".join(f"'{c}' ({what}){did_you_mean(c, have)}" for c, what in missing)
    listed = list(have) if len(have) <= 60 else [*have[:60], f"... {len(have) - 60} more"]
    raise DataError(f"data {source}: no column {shown}; the table has {listed}")

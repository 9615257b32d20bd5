"""Raw table -> shared FG -> padded id/mask arrays the Keras front takes.

Hashing and FG happen here through ``features`` (never in TF ops), so the ids
a model trains on are exactly the ids the server computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from offgraph.features.fg import FeatureGenerator, FeatureValueError, RaggedIds
from offgraph.features.numeric import fit_stats
from offgraph.features.pooling import recency_weights
from offgraph.features.spec import FeatureSpec
from offgraph.features.spec_columns import check_spec_columns
from offgraph.features.value_limits import cuts

MAX_VALUES_PER_FIELD = 64
"""Values per row a field's training input holds: a row with more keeps its first ones, or its last ones for
a field with ``overflow: keep_last`` (a history, oldest first: its most recent, as the serving FG cuts it)."""

LABEL_MAX = 127.0
"""The largest label: a label is a grade g >= 0 whose gain 2^g - 1 (``offgraph.model.relevance``) must stay
finite in float32 (2^128 is not)."""


@dataclass
class Encoded:
    """Model inputs for n rows: ``x`` maps ids_<i>/mask_<i> (and ``dense`` [n, k] with numeric fields) to
    arrays; labels etc. aligned. ``numeric_pre`` [n, k]: the numeric values before standardize (NaN: no
    value), kept until training has fitted the statistics (``finish_dense``)."""

    x: dict[str, np.ndarray]
    labels: np.ndarray
    groups: np.ndarray | None
    time: np.ndarray | None
    key: np.ndarray | None
    numeric_pre: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.labels)

    def take(self, idx: np.ndarray) -> Encoded:
        pick = lambda a: None if a is None else a[idx]  # noqa: E731
        return Encoded(
            {k: v[idx] for k, v in self.x.items()},
            self.labels[idx],
            pick(self.groups),
            pick(self.time),
            pick(self.key),
            pick(self.numeric_pre),
        )


def _column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def padded_ids(rag: RaggedIds, max_len: int, last: bool) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, L] int64, mask [n, L] float32) of ``rag`` with L = min(its longest row, ``max_len``), at least
    1: a longer row keeps its first ``max_len`` values, or with ``last`` its last ones (left-aligned, in
    their order, like any row)."""
    lengths = rag.lengths
    L = max(min(int(lengths.max(initial=1)), max_len), 1)
    keep = np.minimum(lengths, L)
    starts = rag.offsets[1:] - keep if last else rag.offsets[:-1]
    col = np.arange(L)[None, :]
    mask = col < keep[:, None]
    idx = np.minimum(starts[:, None] + col, max(len(rag.ids) - 1, 0))
    ids = np.where(mask, rag.ids[idx] if len(rag.ids) else 0, 0).astype(np.int64)
    return ids, mask.astype(np.float32)


def encode_table(spec: FeatureSpec, table: pa.Table, source: str = "<table>") -> Encoded:
    """Run the shared FG over a whole table. Errors name the field and the row.

    Labels are relevance grades (``offgraph.model.relevance``): 0/1 clicks, integer grades 0..G, or a real
    gain such as a play share; any finite value in [0, ``LABEL_MAX``]. A missing, NaN, negative or larger
    label is refused, naming the first such row. The pointwise loss and AUC read the binarised label
    (label > 0), the ranking losses and NDCG the grade itself."""
    n = table.num_rows
    fg = FeatureGenerator(spec)
    check_spec_columns(spec, table.column_names, source)
    wanted = {f.input for f in spec.fields + spec.numeric if f.input}
    cols = {c: table.column(c).to_pylist() for c in table.column_names if c in wanted}
    try:
        batch = fg.transform_columns(cols, n, dense=False)
        pre = fg.numeric_columns(cols, n, finished=False) if spec.numeric else None
    except FeatureValueError as e:
        raise ValueError(f"data {source}: {e} (row numbers count data rows from 0)") from None
    x: dict[str, np.ndarray] = {}
    for i, rag in enumerate(batch.fields):
        f = spec.fields[i]
        ids, mask = padded_ids(rag, MAX_VALUES_PER_FIELD, last=cuts(f))
        if f.pooling == "recency" and f.half_life is not None:
            # the front pools by the mask (masked_pool): it holds each kept value's recency weight, summing to 1;
            # boolean indexing walks the kept values row by row in order, as recency_weights lays them out
            mask[mask > 0] = recency_weights(np.count_nonzero(mask, axis=1), f.half_life)
        x[f"ids_{i}"] = ids.astype(np.int32 if spec.fields[i].rows < 2**31 else np.int64)
        x[f"mask_{i}"] = mask
    raw_labels = _column(table, spec.label)
    labels = np.asarray([np.nan if v is None else v for v in raw_labels], dtype=np.float64)
    with np.errstate(invalid="ignore"):  # NaN compares False: refused with the others
        bad = np.flatnonzero(~((labels >= 0) & (labels <= LABEL_MAX)))
    if len(bad):
        raise ValueError(
            f"data {source}: row {bad[0]}: label '{spec.label}' must be a relevance grade in [0, {LABEL_MAX:g}] "
            f"(0/1, an integer grade or a non-negative gain), got {raw_labels[bad[0]]!r} ({len(bad)} bad rows)"
        )
    groups = np.asarray(_column(table, spec.group)) if spec.group else None
    time = np.asarray(_column(table, spec.time), dtype=np.float64) if spec.time else None
    key = np.asarray(_column(table, spec.split_key)) if spec.split_key else None
    out = Encoded(x, labels.astype(np.float32), groups, time, key, pre)
    if spec.numeric and not needs_stats(spec):
        finish_dense(spec, out)
    return out


def needs_stats(spec: FeatureSpec) -> bool:
    """Whether a numeric field standardizes without statistics yet (training fits them)."""
    return any("standardize" in f.params["transform"] and "stats" not in f.params for f in spec.numeric)


def fit_numeric_stats(spec: FeatureSpec, fit_rows: Encoded) -> FeatureSpec:
    """The spec with the standardize statistics of ``fit_rows`` (training rows only) filled in."""
    stats = {
        f.name: fit_stats(fit_rows.numeric_pre[:, j], f.name)
        for j, f in enumerate(spec.numeric)
        if "standardize" in f.params["transform"] and "stats" not in f.params
    }
    return spec.with_stats(stats) if stats else spec


def finish_dense(spec: FeatureSpec, data: Encoded) -> None:
    """Set ``data.x["dense"]`` from ``numeric_pre`` with the spec's statistics (the serving FG's maths)."""
    data.x["dense"] = FeatureGenerator(spec).finish_numeric(data.numeric_pre)

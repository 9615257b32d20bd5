"""The updater's side of feature-row deltas: check them against the live spec, write them exactly once.

The updater is the one writer of the model's feature tables while it runs (they are shared by
the versions, so they stay open across version switches). A delta is checked with the tables'
write-time checks, the bulk load's own (``offgraph.feature_tables.checks.delta_refusal``). Exactly
once, as for embedding rows: the delta's position goes into the SAME atomic WriteBatch as its rows
(``FeatureDB.write``'s ``meta``); an item whose position the table already holds was applied before
a crash and is only acknowledged. Per-key seqs make a replay harmless as well (last write wins).

The delta's wire format (``offgraph.streaming.deltas.FeatureDeltaBatch``) stays with the other delta
kinds in ``offgraph/streaming/deltas/``; this module reads it through :class:`FeatureDelta`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from offgraph.feature_tables.checks import DeltaRows, delta_refusal
from offgraph.feature_tables.db import FeatureDB, FeatureTableError, table_dir
from offgraph.features.spec import FeatureSpec


class FeatureDelta(DeltaRows, Protocol):
    """What the updater reads of a feature delta (``offgraph.streaming.deltas.FeatureDeltaBatch``)."""

    @property
    def keys(self) -> list[bytes]: ...
    @property
    def rows(self) -> list[dict[str, Any]]: ...
    @property
    def seqs(self) -> np.ndarray: ...


class FeatureTables:
    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self.dbs: dict[str, FeatureDB] = {}

    def refusal(self, b: FeatureDelta, model: str, spec: FeatureSpec, version: int) -> str | None:
        """Why ``b`` cannot be applied (None: it can): another model or table, other columns or types, or a
        value the server could not use (named: delta, key, column, rule). ``checks.delta_refusal``."""
        return delta_refusal(b, model, spec, version)

    def apply(
        self, b: FeatureDelta, spec: FeatureSpec, key: bytes, position: str, *, late: bool, sync: bool
    ) -> tuple[int, int] | None:
        """Write ``b`` with its position; None when the table already holds the position (done)."""
        db = self._db(spec, b.table)
        if not late:
            done = db.get_meta(key)
            if done is not None and done.decode() >= position:
                return None
        return db.write(b.keys, b.rows, b.seqs.tolist(), meta={key: position.encode()}, sync=sync)

    def _db(self, spec: FeatureSpec, name: str) -> FeatureDB:
        db = self.dbs.get(name)
        if db is None:
            t = next(t for t in spec.tables if t.name == name)
            db = self.dbs[name] = FeatureDB.create(table_dir(self.model_dir, name), t)
        return db

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()
        self.dbs = {}


__all__ = ["FeatureDelta", "FeatureTables", "FeatureTableError"]

"""The updater's side of feature-row deltas: check them against the live spec, write them exactly once.

The updater is the one writer of the model's feature tables while it runs (they are shared by
the versions, so they stay open across version switches). Exactly once, as for embedding rows:
the delta's position goes into the SAME atomic WriteBatch as its rows (``FeatureDB.write``'s
``meta``); an item whose position the table already holds was applied before a crash and is
only acknowledged. Per-key seqs make a replay harmless as well (last write wins).
"""

from __future__ import annotations

from pathlib import Path

from offgraph.features.spec import FeatureSpec
from offgraph.store.feature_db import FeatureDB, FeatureTableError, table_dir
from offgraph.store.feature_load import check_rows, check_schema
from offgraph.streaming.deltas import FeatureDeltaBatch


class FeatureTables:
    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self.dbs: dict[str, FeatureDB] = {}

    def refusal(self, b: FeatureDeltaBatch, model: str, spec: FeatureSpec, version: int) -> str | None:
        """Why ``b`` cannot be applied (None: it can): another model or table, other columns or types, or a
        value the server could not use (named: delta, key, column, rule)."""
        if b.model != model:
            return f"addressed to model {b.model!r}; this updater serves {model!r}"
        tables = {t.name: t for t in spec.tables}
        t = tables.get(b.table)
        if t is None:
            return (
                f"feature delta for table {b.table!r}, which the live version {version}'s spec does not declare "
                f"(its tables: {sorted(tables) or 'none'})"
            )
        if b.key != t.key:
            return f"feature delta for table {t.name!r} keyed by {b.key!r}; the table's key is {t.key!r}"
        missing = [c for c in t.columns if c not in b.columns]
        extra = [c for c in b.columns if c not in t.columns]
        if missing or extra:
            return (
                f"feature delta for table {t.name!r}: a row is the whole row, columns {list(t.columns)}; "
                + (f"missing {missing}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"unknown {extra}" if extra else "")
            )
        try:
            check_schema(b.schema.empty_table(), t, spec, f"feature delta for table {t.name!r}")
            # the values: FG's own rules and the table's size bounds, as `offgraph features load` checks them
            check_rows(b.data, t, spec, f"feature delta for table {t.name!r}", where=lambda i: f"delta {i}")
        except FeatureTableError as e:
            return str(e)
        return None

    def apply(
        self, b: FeatureDeltaBatch, spec: FeatureSpec, key: bytes, position: str, *, late: bool, sync: bool
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


__all__ = ["FeatureTables", "FeatureTableError"]

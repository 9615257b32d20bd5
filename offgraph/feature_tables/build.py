"""The exporter's feature tables: built from the training data, or created empty.

Each table of the spec gets the latest value per key (by the spec's ``time``) among the run's
TRAINING rows, i.e. the values known before the held-out cut (the exporter passes them as a mask:
``offgraph.export.run_split.run_held_out_mask``, the split the run used, recomputed from its
``train_config.json``). A key seen only in held-out rows
is not loaded: the server reports it as unknown (load the catalog with ``offgraph features load``
to serve it). Rows a stream wrote (seq >= 0) are kept: they are newer than any training cut. Loading
needs the tables' write lock (stop ``offgraph update`` first); without data the tables are only
created (empty) or their ``table.json`` extended, never opened, so exporting a version beside a
running updater works, and every key is unknown until a load or a streamed row fills it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa

from offgraph.feature_tables.db import ensure_table, table_dir
from offgraph.feature_tables.load import latest_per_key, load_table
from offgraph.features.spec import FeatureSpec

log = logging.getLogger("offgraph.export")


def build_feature_tables(
    model_dir: str | Path,
    spec: FeatureSpec,
    table: pa.Table | None = None,
    train_mask: np.ndarray | None = None,
    *,
    source: str = "<data>",
    progress: bool = True,
) -> dict[str, dict]:
    """Create every table of ``spec`` under MODELS/NAME/features/, loading each from ``table`` when
    given (the latest value per key among the ``train_mask`` rows; all rows without a mask).
    Returns per table {rows, path} (rows None: created or kept, nothing loaded)."""
    out: dict[str, dict] = {}
    for t in spec.tables:
        if table is None:  # never opens an existing DB: the updater may hold it
            ensure_table(table_dir(model_dir, t.name), t)
            out[t.name] = {"rows": None, "path": str(table_dir(model_dir, t.name))}
            continue
        latest = latest_per_key(table, t.key, spec.time, train_mask)
        res = load_table(
            model_dir, t, spec, latest.select([t.key, *t.columns]), source=source, progress=progress, keep_streamed=True
        )
        log.info(
            "feature table %s: %d keys (latest value per key of %s of %s)",
            t.name,
            res["rows"],
            "the training rows" if train_mask is not None else "every row",
            source,
        )
        out[t.name] = {"rows": res["rows"], "path": res["path"]}
    return out


def manifest_record(spec: FeatureSpec) -> list[dict]:
    """What the server needs to join a version's tables (the manifest's ``feature_tables``)."""
    from offgraph.feature_tables.db import FEATURES_DIR, KEY_ENCODING, VALUE_ENCODING

    return [
        {
            **t.to_dict(),
            "path": f"../{FEATURES_DIR}/{t.name}",
            "key_encoding": KEY_ENCODING,
            "value_encoding": VALUE_ENCODING,
        }
        for t in spec.tables
    ]

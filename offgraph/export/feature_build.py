"""The exporter's feature tables: built from the training data, or created empty.

Each table of the spec gets the latest value per key (by the spec's ``time``) among the run's
TRAINING rows, i.e. the values known before the held-out cut (``offgraph.model.splits``: the same
split the run used, recomputed from its ``train_config.json``). A key seen only in held-out rows
is not loaded: the server reports it as unknown (load the catalog with ``offgraph features load``
to serve it). Rows a stream wrote (seq >= 0) are kept: they are newer than any training cut. Loading
needs the tables' write lock (stop ``offgraph update`` first); without data the tables are only
created (empty) or their ``table.json`` extended, never opened, so exporting a version beside a
running updater works, and every key is unknown until a load or a streamed row fills it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa

from offgraph.features.spec import FeatureSpec
from offgraph.store.feature_db import ensure_table, table_dir
from offgraph.store.feature_load import latest_per_key, load_table

log = logging.getLogger("offgraph.export")


def run_held_out_mask(run_dir: str | Path, spec: FeatureSpec, table: pa.Table) -> np.ndarray:
    """The held-out rows of ``table`` as the run split them (True = held out)."""
    from offgraph.model.splits import held_out_mask
    from offgraph.model.train import TrainConfig

    cfg_path = Path(run_dir) / "train_config.json"
    cfg, _ = (TrainConfig(**json.loads(cfg_path.read_text())) if cfg_path.exists() else TrainConfig()).for_spec(spec)
    time = np.asarray(table.column(spec.time).to_pylist(), dtype=np.float64) if spec.time else None
    key = np.asarray(table.column(spec.split_key).to_pylist()) if spec.split_key else None
    return held_out_mask(cfg.split, table.num_rows, cfg.held_out, cfg.seed, time=time, key=key)


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
    from offgraph.store.feature_db import FEATURES_DIR, KEY_ENCODING, VALUE_ENCODING

    return [
        {
            **t.to_dict(),
            "path": f"../{FEATURES_DIR}/{t.name}",
            "key_encoding": KEY_ENCODING,
            "value_encoding": VALUE_ENCODING,
        }
        for t in spec.tables
    ]

"""A training run's split, recomputed: which rows of the data the run held out.

The exporter loads the feature tables from the run's TRAINING rows only (the values known before
the held-out cut, ``offgraph.feature_tables.build``), and its checks score the held-out rows
(``offgraph.export.check``): both recompute the split the run used from its ``train_config.json``
(``offgraph.model.splits``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from offgraph.features.spec import FeatureSpec


def run_held_out_mask(run_dir: str | Path, spec: FeatureSpec, table: pa.Table) -> np.ndarray:
    """The held-out rows of ``table`` as the run split them (True = held out)."""
    from offgraph.model.splits import held_out_mask
    from offgraph.model.train import TrainConfig

    cfg_path = Path(run_dir) / "train_config.json"
    cfg, _ = (TrainConfig(**json.loads(cfg_path.read_text())) if cfg_path.exists() else TrainConfig()).for_spec(spec)
    time = np.asarray(table.column(spec.time).to_pylist(), dtype=np.float64) if spec.time else None
    key = np.asarray(table.column(spec.split_key).to_pylist()) if spec.split_key else None
    return held_out_mask(cfg.split, table.num_rows, cfg.held_out, cfg.seed, time=time, key=key)


__all__ = ["run_held_out_mask"]

"""The library scorer: THE request path. The HTTP server wraps it and adds nothing to the maths.

    scorer = exporter.load("models/movielens")       # newest complete version
    ctr = scorer.score(request, candidates)          # float32 [N]

FG -> unique keys -> (row cache) -> store read -> pool into [N, F, D] and [N, F]
-> one signature call -> calibration.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from embstore import StoreConfig, open_store
from exporter import scorer_impl
from exporter.calibration import calibrate
from exporter.dense_saved_model import load_dense
from exporter.manifest import DENSE_DIR, STORE_DIR, ModelDirError, complete_versions, load_manifest
from features.fg import FeatureGenerator
from features.spec import parse_spec

log = logging.getLogger("offgraph.scorer")


class Scorer:
    """One loaded model version. Thread-safe for concurrent ``score`` calls."""

    def __init__(self, version_dir: str | Path, *, store_mode: str = "r", item_cache_size: int = 100_000,
                 block_cache_mb: int | None = None, verify: bool = True):
        self.version_dir = Path(version_dir)
        self.manifest = load_manifest(self.version_dir, verify_dense=verify)
        m = self.manifest
        self.version = int(self.version_dir.name) if self.version_dir.name.isdigit() else 0
        self.spec = parse_spec(m["spec"], source=str(self.version_dir / "manifest.json"))
        self.dim = int(m["embedding_dim"])
        self.poolings = [f.pooling for f in self.spec.fields]
        if [f["name"] for f in m["fields"]] != self.spec.field_names:
            raise ModelDirError(f"{self.version_dir}: manifest field order differs from its spec")
        if max(f.rows for f in self.spec.fields) >= 1 << 48:
            raise ModelDirError(f"{self.version_dir}: tables of 2**48 rows or more are not supported")
        self.calibration = self.spec.model.calibration
        self.fg = FeatureGenerator(self.spec, item_cache_size=item_cache_size)
        self._fg_lock = threading.Lock()
        cfg = StoreConfig.from_dict({k: v for k, v in m["store"].items()
                                     if k in StoreConfig.__dataclass_fields__})
        if block_cache_mb is not None:
            cfg = StoreConfig.from_dict({**cfg.to_dict(), "block_cache_mb": block_cache_mb})
        try:
            self.store = open_store(self.version_dir / STORE_DIR, cfg, mode=store_mode)
        except ValueError as e:
            raise ModelDirError(f"{self.version_dir}: store does not open: {e}") from None
        self._loaded, self._serve = load_dense(self.version_dir / DENSE_DIR)

    # -- the request path -------------------------------------------------------------------
    def features(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]):
        with self._fg_lock:  # the item cache is shared state
            return self.fg.transform(request, candidates)

    def pooled(self, request, candidates) -> tuple[np.ndarray, np.ndarray, dict]:
        batch = self.features(request, candidates)
        keys = scorer_impl.batch_keys(batch)
        vec, w, found = self.store.read_unique(keys.unique_tables, keys.unique_rows)
        emb, fo = scorer_impl.pool_batch(batch, keys, vec, w, self.poolings, self.dim)
        stats = {"lookups": int(len(keys.inverse)), "unique_rows": int(len(keys.unique_rows)),
                 "found_rows": int(found.sum())}
        return emb, fo, stats

    def dense(self, emb: np.ndarray, first_order: np.ndarray) -> np.ndarray:
        out = self._serve(emb=tf.constant(emb), first_order=tf.constant(first_order))
        return out["ctr"].numpy()

    def score(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> np.ndarray:
        if len(candidates) == 0:
            return np.zeros(0, np.float32)
        emb, fo, _ = self.pooled(request, candidates)
        return calibrate(self.dense(emb, fo), self.calibration)

    def close(self) -> None:
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def resolve_version(path: str | Path) -> Path:
    """A version directory itself, or a model directory's newest complete version."""
    path = Path(path)
    if (path / "manifest.json").exists() or path.name.isdigit():
        return path
    versions = complete_versions(path)
    if not versions:
        raise ModelDirError(f"{path}: no complete version (a version is complete once its manifest.json exists)")
    return path / str(versions[-1])


def load(model_dir: str | Path, **kwargs) -> Scorer:
    return Scorer(resolve_version(model_dir), **kwargs)

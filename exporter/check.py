"""`offgraph check`: the skew checker. Scores the same rows with the trained Keras
model and with the library scorer (out-of-graph path) and compares them."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from dense_model.inputs import encode_table
from dense_model.metrics_impl import auc
from dense_model.model import load_run, predict_proba
from dense_model.splits import held_out_mask
from dense_model.train import TrainConfig
from server.calibration import calibrate
from server.scorer import Scorer, resolve_version
from features.fg import freeze_value


def requests_from_rows(spec, columns: dict[str, list], idx: np.ndarray):
    """Group rows into (request, candidates, row positions) by their request-scope raw inputs."""
    req_inputs, item_inputs = spec.raw_inputs("request"), spec.raw_inputs("item")
    groups: dict[tuple, list[int]] = {}
    for pos, i in enumerate(idx.tolist()):
        key = tuple(freeze_value(columns[c][i]) for c in req_inputs)
        groups.setdefault(key, []).append(pos)
    for positions in groups.values():
        first = idx[positions[0]]
        request = {c: columns[c][first] for c in req_inputs}
        cands = [{c: columns[c][idx[p]] for c in item_inputs} for p in positions]
        yield request, cands, np.asarray(positions)


def run_check(model_dir, run_dir, table, limit: int = 10000, rows: str = "held-out", scorer: Scorer | None = None,
              source: str = "<table>") -> dict:
    model, spec, _ = load_run(run_dir)
    own_scorer = scorer is None
    scorer = scorer or Scorer(resolve_version(model_dir))
    try:
        if scorer.spec.fingerprint() != spec.fingerprint():
            raise ValueError(f"model {scorer.version_dir} was not exported from run {run_dir}: their specs differ")
        data = encode_table(spec, table, source)
        if rows == "held-out":
            cfg_path = Path(run_dir) / "train_config.json"
            cfg = TrainConfig(**json.loads(cfg_path.read_text())) if cfg_path.exists() else TrainConfig()
            mask = held_out_mask(cfg.split, data.n, cfg.held_out, cfg.seed, time=data.time, key=data.key)
            idx = np.flatnonzero(mask)
        elif rows == "all":
            idx = np.arange(data.n)
        else:
            raise ValueError(f"rows must be 'held-out' or 'all', got {rows!r}")
        idx = idx[:limit] if limit else idx
        sub = data.take(idx)
        t0 = time.perf_counter()
        p_keras = calibrate(predict_proba(model, sub.x), spec.model.calibration)
        keras_s = time.perf_counter() - t0
        inputs = set(spec.raw_inputs("request")) | set(spec.raw_inputs("item"))
        columns = {c: table.column(c).to_pylist() for c in inputs}
        p_served = np.zeros(len(idx), np.float32)
        t0 = time.perf_counter()
        n_requests = 0
        for request, cands, pos in requests_from_rows(spec, columns, idx):
            p_served[pos] = scorer.score(request, cands)
            n_requests += 1
        served_s = time.perf_counter() - t0
        dp = np.abs(p_keras.astype(np.float64) - p_served.astype(np.float64))
        auc_k, auc_s = auc(sub.labels, p_keras), auc(sub.labels, p_served)
        return {"rows": int(len(idx)), "requests": n_requests, "max_abs_dp": float(dp.max(initial=0.0)),
                "mean_abs_dp": float(dp.mean()) if len(dp) else 0.0, "auc_keras": auc_k, "auc_served": auc_s,
                "auc_delta": auc_s - auc_k, "quant": scorer.manifest["store"]["quant"],
                "keras_seconds": keras_s, "served_seconds": served_s, "version": str(scorer.version_dir)}
    finally:
        if own_scorer:
            scorer.close()

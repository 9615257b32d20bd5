"""`offgraph check`: the skew checker. Scores the same rows with the trained Keras
model and with the library scorer (out-of-graph path) and compares them.

Defaults a user will not trip over:

- the tolerance (``derived_max_diff``) comes from the model's quantization: the Keras model is
  also scored with its tables passed through the store's codec (encode + decode, ``fp16`` /
  ``int8``), and the largest |dp| that quantization alone makes on the checked rows, plus 1e-5
  for float summation order, is what the served scores may differ by (fp32: 1e-5);
- rows: the held-out rows when ``--data`` is the file the run was trained on (its split is
  recomputed), every row of any other file (a held-out mask means nothing there).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from offgraph.calibration import calibrate
from offgraph.export.run_split import run_held_out_mask
from offgraph.feature_tables.join import ids_only as ids_only_form
from offgraph.features.fg import freeze_value
from offgraph.model.inputs import encode_table
from offgraph.model.metrics import auc
from offgraph.model.model import load_run, predict_proba
from offgraph.scoring.scorer import Scorer, resolve_version


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


FLOAT_SLACK = 1e-5
"""|dp| between two exact float32 paths that sum in different orders (the fp32 tolerance)."""


def is_training_file(metrics: dict, data_path) -> bool:
    """Whether ``data_path`` is the file the run was trained on (``metrics.json``'s ``data_file``, or for
    runs before it, its ``source`` as a path)."""
    if data_path is None:
        return False
    recorded = metrics.get("data_file") or metrics.get("source")
    try:
        return recorded is not None and Path(recorded).resolve() == Path(data_path).resolve()
    except OSError:
        return False


def default_rows(metrics: dict, data_path) -> str:
    """Held-out rows of the training file, every row of another; a table given without its path (the library
    call) is taken as the training table, as before this default existed."""
    if data_path is None:
        return "held-out"
    return "held-out" if is_training_file(metrics, data_path) else "all"


def quantized_model(model, spec, quant: str):
    """A copy of the Keras model whose tables went through the store codec ``quant`` (what the store holds)."""
    from offgraph.model.model import build_deepfm
    from offgraph.store.quant import get_codec

    codec = get_codec(quant, spec.model.embedding_dim)
    q = build_deepfm(spec)
    q.set_weights(model.get_weights())
    for et, wt in zip(q.front.emb_tables, q.front.w_tables):
        v, w = et.embeddings.numpy(), wt.embeddings.numpy()
        for s in range(0, len(v), 1 << 18):  # bounded memory for big tables
            dv, dw = codec.decode(codec.encode(v[s : s + (1 << 18)], w[s : s + (1 << 18), 0]))
            v[s : s + len(dv)], w[s : s + len(dw), 0] = dv, dw
        et.embeddings.assign(v)
        wt.embeddings.assign(w)
    return q


class RunReference:
    """The scores of a trained run's Keras model (``run_check``'s reference by default)."""

    def __init__(self, run_dir):
        self.model, self.spec, self.metrics = load_run(run_dir)

    def proba(self, x: dict, quant: str | None = None) -> np.ndarray:
        """Sigmoid scores of padded inputs ``x``; with ``quant``, of the tables through that store codec."""
        model = self.model if quant in (None, "fp32") else quantized_model(self.model, self.spec, quant)
        return predict_proba(model, x)


def run_check(
    model_dir,
    run_dir,
    table,
    limit: int = 10000,
    rows: str | None = None,
    scorer: Scorer | None = None,
    source: str = "<table>",
    data_path=None,
    ids_only: bool = False,
    reference=None,
) -> dict:
    """``rows`` None: ``default_rows`` (held-out rows of the training file, else all). ``ids_only``: also
    score each request in its ids-only form (the columns the feature tables fill left out: the server
    joins them) and compare with the full-feature form (``ids_only_max_abs_dp``; 0 when the tables
    hold the rows' values) and with Keras. The keys the tables lack are counted apart: candidates whose
    item key has no row (``ids_only_unknown_candidates``) and requests whose request-scope key (user,
    site, app) has none (``ids_only_unknown_requests``).

    ``reference``: what the served scores are compared with instead of run ``run_dir``'s Keras model (None
    then): an object with ``spec``, ``metrics`` and ``proba(x, quant)`` (an imported version's sources,
    ``offgraph.export.import_model.SourceReference``); its rows are "all" (no run, no held-out split)."""
    if reference is None:
        reference = RunReference(run_dir)
    elif rows == "held-out":
        raise ValueError("held-out rows are a training run's: a version checked against its sources takes 'all'")
    spec, metrics = reference.spec, reference.metrics
    rows = rows or ("all" if run_dir is None else default_rows(metrics, data_path))
    own_scorer = scorer is None
    scorer = scorer or Scorer(resolve_version(model_dir))
    try:
        if scorer.spec.fingerprint() != spec.fingerprint():
            raise ValueError(f"model {scorer.version_dir} was not exported from run {run_dir}: their specs differ")
        data = encode_table(spec, table, source)
        if rows == "held-out":
            idx = np.flatnonzero(run_held_out_mask(run_dir, spec, table))
        elif rows == "all":
            idx = np.arange(data.n)
        else:
            raise ValueError(f"rows must be 'held-out' or 'all', got {rows!r}")
        idx = idx[:limit] if limit else idx
        sub = data.take(idx)
        t0 = time.perf_counter()
        p_keras = calibrate(reference.proba(sub.x), spec.model.calibration)
        keras_s = time.perf_counter() - t0
        inputs = set(spec.raw_inputs("request")) | set(spec.raw_inputs("item"))
        columns = {c: table.column(c).to_pylist() for c in inputs}
        if ids_only and not scorer.spec.tables:
            raise ValueError(
                f"model {scorer.version_dir} declares no feature tables: it cannot score ids-only requests"
            )
        p_served = np.zeros(len(idx), np.float32)
        p_ids = np.zeros(len(idx), np.float32)
        unknown = unknown_requests = 0
        t0 = time.perf_counter()
        n_requests = 0
        for request, cands, pos in requests_from_rows(spec, columns, idx):
            p_served[pos] = scorer.score(request, cands)
            if ids_only:
                p_ids[pos], joined = scorer.score_joined(*ids_only_form(scorer.spec, request, cands))
                unknown += joined.unknown_candidates
                unknown_requests += joined.unknown_request  # its user/site/app key has no row: all its rows differ
            n_requests += 1
        served_s = time.perf_counter() - t0
        dp = np.abs(p_keras.astype(np.float64) - p_served.astype(np.float64))
        auc_k, auc_s = auc(sub.labels, p_keras), auc(sub.labels, p_served)
        quant = scorer.manifest.store.quant
        quant_dp = 0.0
        if quant != "fp32":
            p_quant = calibrate(reference.proba(sub.x, quant), spec.model.calibration)
            quant_dp = float(np.abs(p_quant.astype(np.float64) - p_keras).max(initial=0.0))
        extra = {}
        if ids_only:
            d_ids = np.abs(p_ids.astype(np.float64) - p_served.astype(np.float64))
            extra = {
                "ids_only_max_abs_dp": float(d_ids.max(initial=0.0)),
                "ids_only_vs_keras_max_abs_dp": float(np.abs(p_ids.astype(np.float64) - p_keras).max(initial=0.0)),
                "ids_only_unknown_candidates": int(unknown),
                "ids_only_unknown_requests": int(unknown_requests),
            }
        return {
            **extra,
            "rows": int(len(idx)),
            "row_set": rows,
            "requests": n_requests,
            "quant_max_abs_dp": quant_dp,
            "derived_max_diff": FLOAT_SLACK + quant_dp,
            "max_abs_dp": float(dp.max(initial=0.0)),
            "mean_abs_dp": float(dp.mean()) if len(dp) else 0.0,
            "auc_keras": auc_k,
            "auc_served": auc_s,
            "auc_delta": auc_s - auc_k,
            "quant": scorer.manifest.store.quant,
            "keras_seconds": keras_s,
            "served_seconds": served_s,
            "version": str(scorer.version_dir),
        }
    finally:
        if own_scorer:
            scorer.close()

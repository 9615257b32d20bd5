"""Listwise models and what a score is.

A listwise loss (softmax over a request's candidates) leaves the sigmoid of the logit uncalibrated, so
training fits Platt scaling on the validation rows (offgraph.model.platt), records it in the run's spec and
metrics, the export records the loss and the score kind, and the server and library scorer apply it
like the other calibration steps. A listwise version without a fit says its scores are "ranking"
scores; a version exported before these fields keeps serving (pointwise CTRs unless its training
config says otherwise).
"""

import json
import math
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from server_helpers import ThreadServer, copy_version, score, server_config

from offgraph.calibration import calibrate, score_kind
from offgraph.features.spec import Calibration, SpecError, parse_spec
from offgraph.model.metrics import logloss
from offgraph.model.platt import fit_platt
from offgraph.modeldir.manifest import ModelDirError, training_loss

REPO = Path(__file__).resolve().parents[2]


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, np.float64)))


def _tiny_raw() -> dict:
    """The example MovieLens spec with tables 1/50 of its size (as conftest's tiny_model)."""
    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    return raw


# -- the fit and the calibration maths (fast) ------------------------------------------------------
def test_platt_fit_recovers_a_known_scale_and_shift():
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, 200_000)
    y = (rng.random(len(z)) < _sigmoid(0.4 * z - 0.7)).astype(np.float64)
    fit = fit_platt(_sigmoid(z).astype(np.float32), y)
    assert fit is not None
    assert abs(fit.logit_scale - 0.4) < 0.02 and abs(fit.logit_shift + 0.7) < 0.03, fit
    # nothing to fit: one class; a fit that would reverse the model's order is refused, not served
    assert fit_platt(_sigmoid(z), np.ones(len(z))) is None
    assert fit_platt(_sigmoid(z), 1.0 - y) is None


def test_platt_fit_is_finite_on_separable_rows():
    z = np.r_[-np.ones(50), np.ones(50)]
    fit = fit_platt(_sigmoid(z), np.r_[np.zeros(50), np.ones(50)])
    assert fit is not None and math.isfinite(fit.logit_scale) and fit.logit_scale > 0


def test_calibrate_applies_platt_first_then_the_declared_steps():
    p = np.array([1e-6, 0.1, 0.5, 0.9, 1.0 - 1e-6], np.float32)
    z = np.log(p.astype(np.float64) / (1.0 - p.astype(np.float64)))
    got = calibrate(p, Calibration(logit_scale=0.5, logit_shift=-1.0))
    np.testing.assert_allclose(got, _sigmoid(0.5 * z - 1.0), rtol=1e-5)
    q = _sigmoid(0.5 * z - 1.0)
    r = 0.25  # then the down-sampling correction, on the Platt output
    np.testing.assert_allclose(
        calibrate(p, Calibration(negative_rate=r, logit_scale=0.5, logit_shift=-1.0)), q / (q + (1 - q) / r), rtol=1e-5
    )
    # a saturated float32 sigmoid (|logit| > ~17) still maps to a finite, ordered score
    edge = calibrate(np.array([0.0, 1.0], np.float32), Calibration(logit_scale=0.3, logit_shift=0.0))
    assert 0.0 < edge[0] < 0.5 < edge[1] < 1.0


def test_spec_calibration_keys_are_checked_and_set_by_training():
    raw = _tiny_raw()
    spec = parse_spec(raw)
    assert not spec.model.calibration.platt and spec.model.calibration.identity
    fitted = spec.with_calibration(logit_scale=2.5, logit_shift=-0.25)
    c = fitted.model.calibration
    assert (c.logit_scale, c.logit_shift, c.platt, c.identity) == (2.5, -0.25, True, False)
    assert parse_spec(fitted.to_dict()).model.calibration == c  # the run's spec.yaml reads back the same
    for bad in (
        {"logit_scale": 0},
        {"logit_scale": -1.0},
        {"logit_scale": float("nan")},
        {"logit_shift": float("inf")},
        {"logit_shift": "x"},
    ):
        raw = _tiny_raw()
        raw["model"]["calibration"] = bad
        with pytest.raises(SpecError, match=f"model.calibration.{next(iter(bad))}"):
            parse_spec(raw)


def test_score_kind_and_the_loss_of_manifests_without_the_fields():
    plain, fitted = Calibration(), Calibration(logit_scale=2.0, logit_shift=0.1)
    assert score_kind("pointwise", plain) == "ctr"
    assert score_kind("listwise", plain) == "ranking" and score_kind("both", plain) == "ranking"
    assert score_kind("listwise", fitted) == "ctr" and score_kind("both", fitted) == "ctr"
    assert training_loss({}) == "pointwise"  # exported before the loss was recorded: a pointwise CTR
    assert training_loss({"training": {"config": {"loss": "listwise"}}}) == "listwise"  # ... unless recorded
    assert training_loss({"training": None}) == "pointwise"
    assert training_loss({"training_loss": "both", "training": {"config": {"loss": "listwise"}}}) == "both"
    with pytest.raises(ModelDirError, match="training loss 'softmax'"):
        training_loss({"training_loss": "softmax"})


def test_listwise_without_validation_rows_fits_nothing_and_says_ranking(capsys):
    from offgraph.model.train import TrainConfig, fit_calibration

    spec = parse_spec(_tiny_raw())
    cfg = TrainConfig(loss="listwise", validation=0)
    out, rec = fit_calibration(spec, cfg, trainer=None, validation=None, held=None, trained_on_validation=False)
    assert out is spec and rec == {"method": None, "reason": "no validation rows (--validation 0)"}
    assert score_kind(cfg.loss, out.model.calibration) == "ranking"
    assert "not CTRs" in capsys.readouterr().out
    # pointwise: nothing to fit, the sigmoid is the CTR
    assert fit_calibration(spec, TrainConfig(), None, None, None, False) == (spec, None)


# -- a trained listwise model, exported and served (slow) ------------------------------------------
@pytest.fixture(scope="module")
def listwise(movielens_table, tmp_path_factory):
    """(MODELS, run dir, table, metrics): a 1-epoch listwise DeepFM (then its refit) with tiny tables on the first
    20k MovieLens ratings, exported as lw/1; lw_old/1 is that version with a manifest as exported before the
    loss and score kind were recorded (no training_loss / score_kind, no fitted calibration)."""
    from offgraph.export.export import export_run
    from offgraph.model.train import TrainConfig, train_run

    root = tmp_path_factory.mktemp("listwise")
    table = movielens_table.slice(0, 20000)
    _, metrics = train_run(
        parse_spec(_tiny_raw()),
        table,
        TrainConfig(epochs=1, loss="listwise", split="per-key-time"),
        root / "run",
        progress=False,
    )
    models = root / "models"
    export_run(root / "run", models / "lw" / "1", shards=2, quant="fp32", progress=False)

    def as_before(m):
        del m["training_loss"], m["score_kind"]
        m["spec"]["model"]["calibration"] = {}
        m["calibration"] = {"negative_rate": 1.0, "scale": 1.0, "power": 1.0}

    (models / "lw_old").mkdir()
    copy_version(models / "lw" / "1", models / "lw_old" / "1", manifest_edit=as_before)
    return models, root / "run", table, metrics


@pytest.fixture(scope="module")
def served(listwise, tiny_model, tmp_path_factory):
    """A real server over the listwise versions and conftest's pointwise tiny model (pw/1 as exported now,
    pw_old/1 with a manifest without the new fields)."""
    models = listwise[0]
    for name in ("pw", "pw_old"):
        (models / name).mkdir()
    shutil.copytree(tiny_model[0] / "ml" / "1", models / "pw" / "1")

    def as_before(m):
        del m["training_loss"], m["score_kind"]

    copy_version(tiny_model[0] / "ml" / "1", models / "pw_old" / "1", manifest_edit=as_before)
    srv = ThreadServer(server_config(models))
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client
    srv.stop()


def _held_out_requests(run_dir, table):
    from offgraph.export.check import requests_from_rows
    from offgraph.export.run_split import run_held_out_mask
    from offgraph.model.model import load_run

    _, spec, _ = load_run(run_dir)
    idx = np.flatnonzero(run_held_out_mask(run_dir, spec, table))
    inputs = set(spec.raw_inputs("request")) | set(spec.raw_inputs("item"))
    columns = {c: table.column(c).to_pylist() for c in inputs}
    labels = np.asarray(table.column(spec.label).to_numpy(), np.float64)[idx]
    return list(requests_from_rows(spec, columns, idx)), labels


def _serve_all(client, name, requests, n):
    out = np.zeros(n, np.float64)
    kinds = set()
    for request, cands, pos in requests:
        r = score(client, {"request": request, "candidates": cands}, name=name)
        assert r.status_code == 200, r.text
        out[pos] = r.json()["scores"]
        kinds.add(r.json()["score_kind"])
    return out, kinds


def test_training_fits_and_records_the_calibration(listwise):
    models, run_dir, _, metrics = listwise
    rec = metrics["calibration"]
    assert rec["method"] == "platt" and rec["fitted_on"] == "validation" and rec["rows"] == metrics["validation_rows"]
    assert rec["trained_on_fit_rows"] is True  # the default refit trained on the validation rows too
    assert metrics["score_kind"] == "ctr"
    run_spec = yaml.safe_load((run_dir / "spec.yaml").read_text())
    assert run_spec["model"]["calibration"] == {"logit_scale": rec["logit_scale"], "logit_shift": rec["logit_shift"]}
    m = json.loads((models / "lw" / "1" / "manifest.json").read_text())
    assert m["training_loss"] == "listwise" and m["score_kind"] == "ctr"
    assert (m["calibration"]["logit_scale"], m["calibration"]["logit_shift"]) == (
        rec["logit_scale"],
        rec["logit_shift"],
    )
    assert m["training"]["calibration"] == rec  # GET /v1/models/{name} shows it under loaded.training


def test_served_listwise_scores_are_ctrs(served, listwise):
    _, run_dir, table, _ = listwise
    requests, labels = _held_out_requests(run_dir, table)
    cal, kinds = _serve_all(served, "lw", requests, len(labels))
    raw, old_kinds = _serve_all(served, "lw_old", requests, len(labels))
    assert kinds == {"ctr"} and old_kinds == {"ranking"}
    rate = labels.mean()
    # the raw listwise sigmoid is off the positive rate; the calibrated score is on it (the fit saw other rows)
    assert abs(cal.mean() - rate) < 0.03, (cal.mean(), raw.mean(), rate)
    assert abs(cal.mean() - rate) < abs(raw.mean() - rate), (cal.mean(), raw.mean(), rate)
    assert logloss(labels, cal) < logloss(labels, raw) - 0.005, (logloss(labels, cal), logloss(labels, raw))
    # the calibration is monotone: it keeps the listwise model's order of the candidates
    assert np.all(np.diff(cal[np.argsort(raw, kind="stable")]) >= -1e-7)


def test_get_model_says_the_loss_and_the_score_kind(served):
    want = {
        "lw": ("listwise", "ctr"),
        "lw_old": ("listwise", "ranking"),
        "pw": ("pointwise", "ctr"),
        "pw_old": ("pointwise", "ctr"),
    }
    for name, (loss, kind) in want.items():
        r = served.get(f"/v1/models/{name}")
        assert r.status_code == 200, r.text
        loaded = r.json()["loaded"]
        assert (loaded["training_loss"], loaded["score_kind"]) == (loss, kind), name
    schema = served.get("/openapi.json").json()["components"]["schemas"]
    assert schema["ScoreResponse"]["properties"]["score_kind"]["enum"] == ["ctr", "ranking"]


def test_pointwise_versions_old_and_new_say_ctr(served, requests_):
    for name in ("pw", "pw_old"):
        req, cands = requests_[0]
        r = score(served, {"request": req, "candidates": cands}, name=name)
        assert r.status_code == 200, r.text
        assert r.json()["score_kind"] == "ctr", name


def test_check_parity_holds_with_the_fitted_calibration(listwise):
    from offgraph.export.check import run_check

    models, run_dir, table, _ = listwise
    res = run_check(models / "lw", run_dir, table, limit=2000)
    assert res["rows"] > 0 and res["max_abs_dp"] <= res["derived_max_diff"], res


def test_a_listwise_run_written_by_hand_exports_as_ranking(tmp_path):
    """A run from the library's writer with no metrics (so no fit, no config in them): its train_config.json's
    loss decides, and a listwise model without a calibration says "ranking"."""
    from offgraph.export.export import export_run
    from offgraph.model.model import build_deepfm
    from offgraph.model.train import TrainConfig, write_run
    from offgraph.scoring.scorer import load

    spec = parse_spec(_tiny_raw())
    write_run(tmp_path / "run", build_deepfm(spec), spec, TrainConfig(loss="listwise"), {})
    m = export_run(tmp_path / "run", tmp_path / "models" / "x" / "1", shards=1, quant="fp32", progress=False)
    assert (m["training_loss"], m["score_kind"]) == ("listwise", "ranking")
    with load(tmp_path / "models" / "x") as s:
        assert (s.training_loss, s.score_kind) == ("listwise", "ranking")

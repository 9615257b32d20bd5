"""Every training loss's model serves what Keras scores, and the response says what the score is.

One small DeepFM per part of ``make_loss_fn``'s losses and one mixture (the example MovieLens spec with tiny
tables, 1 epoch on the first 4,000 ratings, lists = the spec's user-days), exported fp32 and int8: ``offgraph check`` (its library call) on the
held-out rows must find the served scores within 1e-5 of Keras's at fp32 and within the int8 codec's own
effect at int8; a real server over the fp32 versions answers ``score_kind`` "ctr" for the pointwise model and
"ranking" for every loss that compares a list's candidates (trained with ``--validation 0``: no Platt fit maps
them to CTRs), and the int8 versions' scorers say the same.
"""

from pathlib import Path

import httpx
import pytest
import yaml
from server_helpers import ThreadServer, score, server_config

from offgraph.model.losses import LossKey

REPO = Path(__file__).resolve().parents[2]
# the served model is the same DeepFM whatever trained it: one model per part of a loss (pointwise, pairwise,
# lambdarank, listwise) and one mixture; the other mixtures' score kinds are checked without a model
LOSSES = ["pointwise", "pairwise", "lambdarank", "listwise", "pointwise+lambdarank"]
ROWS = 4000


def _name(loss: str) -> str:
    return loss.replace("+", "_")  # a model name is [A-Za-z0-9_.-]


@pytest.fixture(scope="module")
def per_loss(movielens_table, tmp_path_factory):
    """A function of a loss -> (the fp32 MODELS dir holding NAME/1, the int8 one holding NAME/1, the run dir, the
    table): each model trained and exported when first asked for (each parametrized test trains its own)."""
    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    spec = parse_spec(raw, source="tiny movielens")
    table = movielens_table.slice(0, ROWS)
    root = tmp_path_factory.mktemp("loss_parity")
    models, int8 = root / "models", root / "int8"
    runs: dict[str, Path] = {}

    def trained(loss: str):
        if loss not in runs:
            run = root / "runs" / _name(loss)
            cfg = TrainConfig(epochs=1, batch_size=512, loss=loss, validation=0, split="per-key-time")
            train_run(spec, table, cfg, run, progress=False)
            export_run(run, models / _name(loss) / "1", shards=1, quant="fp32", progress=False)
            export_run(run, int8 / _name(loss) / "1", shards=1, quant="int8", progress=False)
            runs[loss] = run
        return models, int8, runs[loss], table

    return trained


@pytest.mark.parametrize("loss", LOSSES)
def test_served_scores_equal_keras(per_loss, loss):
    from offgraph.export.check import run_check

    models, int8_models, run, table = per_loss(loss)
    fp32 = run_check(models / _name(loss), run, table, limit=1000)
    assert fp32["rows"] > 400 and fp32["requests"] > 20 and fp32["quant"] == "fp32", fp32
    assert fp32["max_abs_dp"] <= 1e-5, fp32
    int8 = run_check(int8_models / _name(loss), run, table, limit=1000)
    assert int8["quant"] == "int8" and int8["rows"] == fp32["rows"], int8
    # int8's bound is what the codec alone does to Keras's scores (+1e-5): it must be a real, small effect
    assert 0.0 < int8["quant_max_abs_dp"] < 0.05, int8
    assert int8["max_abs_dp"] <= int8["derived_max_diff"], int8


@pytest.fixture(scope="module")
def client(per_loss):
    for loss in LOSSES:  # trained by the parity tests before this one, when they ran
        models = per_loss(loss)[0]
    srv = ThreadServer(server_config(models))
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
    srv.stop()


def test_every_loss_without_a_fit_is_a_ranking_score_but_pointwise():
    from offgraph.calibration import score_kind
    from offgraph.features.spec import Calibration

    kinds = {str(k): score_kind(str(k), Calibration()) for k in LossKey}
    assert kinds == {
        "pointwise": "ctr",
        "listwise": "ranking",
        "both": "ranking",
        "pairwise": "ranking",
        "lambdarank": "ranking",
        "pointwise+pairwise": "ranking",
        "pointwise+lambdarank": "ranking",
    }
    # a Platt fit (training's, on the validation rows) makes any of them a CTR
    assert {score_kind(str(k), Calibration(logit_scale=0.5, logit_shift=0.1)) for k in LossKey} == {"ctr"}


def test_the_response_says_ctr_or_ranking(client, per_loss):
    import numpy as np

    from offgraph.export.check import requests_from_rows
    from offgraph.features import load_spec
    from offgraph.scoring.scorer import load

    _, _, run, table = per_loss("pointwise")
    spec = load_spec(run / "spec.yaml")
    inputs = spec.raw_inputs("request") + spec.raw_inputs("item")
    request, cands, _ = next(requests_from_rows(spec, table.select(inputs).to_pydict(), np.arange(50)))
    for loss in LOSSES:
        want = "ctr" if loss == "pointwise" else "ranking"
        r = score(client, {"request": request, "candidates": cands}, name=_name(loss))
        assert r.status_code == 200, r.text
        assert (r.json()["score_kind"], len(r.json()["scores"])) == (want, len(cands)), loss
        got = client.get(f"/v1/models/{_name(loss)}").json()["loaded"]
        assert (got["training_loss"], got["score_kind"]) == (loss, want), loss
        # the int8 version says the same (what the server reports is the library scorer's)
        with load(per_loss(loss)[1] / _name(loss)) as s:
            assert (s.training_loss, s.score_kind) == (loss, want), loss

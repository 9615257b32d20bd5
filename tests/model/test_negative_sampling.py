"""Negative sampling in training: each epoch a fresh share r of the negative rows, the rate recorded in the run's
config and stated in its spec (the served correction), a spec stating another rate refused naming both."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from offgraph.calibration import calibrate
from offgraph.export.export import export_run
from offgraph.features.spec import parse_spec
from offgraph.model.inputs import encode_table
from offgraph.model.metrics import logloss
from offgraph.model.model import load_run, predict_proba
from offgraph.model.train import TrainConfig, _batches, train_run

RAW = {
    "label": "y",
    "model": {"embedding_dim": 4, "mlp": [8]},
    "fields": [{"name": "item", "scope": "item", "op": "id", "input": "item", "rows": 97}],
}


def _rows(n=6000, seed=0):
    """Items 0..19; item i is clicked with chance 0.02 + 0.01 i (mean 0.115)."""
    rng = np.random.default_rng(seed)
    item = rng.integers(0, 20, n)
    y = (rng.random(n) < 0.02 + 0.01 * item).astype(np.int64)
    return pa.table({"y": y, "item": item})


def test_each_epoch_keeps_every_positive_and_a_fresh_share_of_the_negatives():
    spec = parse_spec(RAW)
    data = encode_table(spec, _rows(4000))
    cfg = TrainConfig(batch_size=10_000, negative_rate=0.25, split="random")
    rng = np.random.default_rng(0)
    epochs = [next(_batches(data, cfg, rng, listwise=False))[1] for _ in range(2)]
    pos, neg = int(data.labels.sum()), int((data.labels == 0).sum())
    for labels in epochs:
        assert int(labels.sum()) == pos  # every positive
        assert abs(int((labels == 0).sum()) - 0.25 * neg) < 4 * np.sqrt(neg * 0.25 * 0.75)  # r of the negatives
    assert len(epochs[0]) != len(epochs[1]) or (epochs[0] != epochs[1]).any()


def test_a_sampled_run_states_its_rate_and_its_scores_stay_ctrs(tmp_path):
    spec = parse_spec(RAW)
    cfg = TrainConfig(epochs=4, batch_size=256, lr=0.01, negative_rate=0.2, split="random", validation=0)
    _, m = train_run(spec, _rows(), cfg, tmp_path / "run", progress=False)
    assert m["config"]["negative_rate"] == 0.2
    model, run_spec, _ = load_run(tmp_path / "run")
    assert run_spec.model.calibration.negative_rate == 0.2  # what the export carries to the server
    # on fresh rows of the same law: the model's own sigmoid saw one negative in five, so it sits near
    # 0.115 / (0.115 + 0.885 * 0.2) = 0.39; corrected by the run spec's calibration (the server's maths) it is
    # a CTR again, near the observed positive rate
    fresh = encode_table(run_spec, _rows(seed=1))
    p = predict_proba(model, fresh.x)
    assert 0.3 < p.mean() < 0.5
    served = calibrate(p, run_spec.model.calibration)
    assert abs(served.mean() - fresh.labels.mean()) < 0.02
    assert m["held_out"]["logloss"] < 0.4  # of the corrected scores; the raw sigmoid's is above 0.5
    assert logloss(fresh.labels, p) > 0.5
    # the exported version's manifest: the rate in the training config and in the spec the server calibrates by
    manifest = export_run(tmp_path / "run", tmp_path / "models" / "ns" / "1", shards=1, quant="fp32", progress=False)
    assert manifest.training["config"]["negative_rate"] == 0.2
    assert manifest.spec["model"]["calibration"]["negative_rate"] == 0.2


def test_a_spec_stating_another_rate_is_refused_naming_both():
    raw = {**RAW, "model": {**RAW["model"], "calibration": {"negative_rate": 0.5}}}
    cfg = TrainConfig(negative_rate=0.2, split="random")
    with pytest.raises(ValueError, match=r"negative_rate 0.5.*--negative-rate 0.2"):
        cfg.validate(parse_spec(raw))
    cfg.replace(negative_rate=0.5).validate(parse_spec(raw))  # the same rate: fine
    TrainConfig(split="random").validate(parse_spec(raw))  # data sampled outside training, stated by hand: as before
    with pytest.raises(ValueError, match=r"--negative-rate 0.2 needs --loss pointwise"):
        TrainConfig(negative_rate=0.2, loss="listwise", split="random").validate(parse_spec({**RAW, "group": "y"}))

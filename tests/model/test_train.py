import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from offgraph.features import load_spec
from offgraph.model.curves import write_curves
from offgraph.model.metrics import auc, logloss, ndcg_at_k
from offgraph.model.model import load_run
from offgraph.model.splits import held_out_mask
from offgraph.model.train import TrainConfig, train_run

REPO = Path(__file__).resolve().parents[2]


def test_auc_against_pairwise_count():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.random(300), 1)  # many ties
    pos, neg = s[y == 1], s[y == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc(y, s) == pytest.approx(pairs / (len(pos) * len(neg)))


def test_logloss_and_ndcg_by_hand():
    assert logloss([1, 0], [0.8, 0.4]) == pytest.approx(-(np.log(0.8) + np.log(0.6)) / 2)
    # group a: positive ranked 2nd of 3 -> 1/log2(3); group b: perfect; group c: no positive (ignored)
    y = [0, 1, 0, 1, 0, 0]
    s = [0.9, 0.5, 0.1, 0.7, 0.2, 0.3]
    g = ["a", "a", "a", "b", "b", "c"]
    assert ndcg_at_k(y, s, g, 10) == pytest.approx((1 / np.log2(3) + 1.0) / 2)


def test_per_key_time_split_holds_out_each_keys_last_20_percent():
    key = np.array([1] * 10 + [2] * 5)
    time = np.r_[np.arange(10)[::-1], np.arange(5)].astype(float)
    test = held_out_mask("per-key-time", 15, 0.2, time=time, key=key)
    assert sorted(np.flatnonzero(test[:10])) == [0, 1]  # user 1's latest two are rows 0 and 1
    assert np.flatnonzero(test[10:]).tolist() == [4]
    with pytest.raises(ValueError, match="unknown split"):
        held_out_mask("kfold", 10)


def test_small_movielens_training_beats_chance(movielens_table, tmp_path):
    spec = load_spec(REPO / "examples" / "movielens_numeric.yaml")
    table = movielens_table.slice(0, 30000)
    cfg = TrainConfig(epochs=2, batch_size=512, split="per-key-time")
    model, metrics = train_run(spec, table, cfg, tmp_path / "run", progress=False)
    assert metrics["held_out"]["auc"] > 0.68, metrics["held_out"]
    assert 0 < metrics["held_out"]["ndcg@10"] <= 1
    # the run directory rebuilds the same model
    model2, spec2, m2 = load_run(tmp_path / "run")
    assert spec2.fingerprint() == model.spec.fingerprint()  # the run's spec: with the standardize statistics
    assert spec2.numeric[0].params["stats"] == m2["numeric_stats"]["movie_prior_mean"]
    assert m2["held_out"]["auc"] == pytest.approx(metrics["held_out"]["auc"])
    for a, b in zip(model.front.emb_tables, model2.front.emb_tables):
        np.testing.assert_array_equal(a.embeddings.numpy(), b.embeddings.numpy())
    # and pictures its per-epoch curves: a real PNG (its signature and IHDR header), of a readable size
    png = (tmp_path / "run" / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert int.from_bytes(png[16:20], "big") >= 400 and int.from_bytes(png[20:24], "big") >= 200


def test_curves_of_no_epochs_write_nothing(tmp_path):
    assert write_curves([], tmp_path / "c.png") is None and not (tmp_path / "c.png").exists()
    one = [{"epoch": 1, "train_loss": 0.6, "seconds": 1.0}]  # no validation split: loss only
    assert write_curves(one, tmp_path / "c.png") == tmp_path / "c.png"


def test_early_stopping_keeps_the_best_validation_epoch(movielens_table):
    """The epoch is picked on validation rows carved from the training rows (never the held-out ones), and
    the model kept is that epoch's: its validation AUC, recomputed, is the best one in the history."""
    from offgraph.model.inputs import encode_table
    from offgraph.model.metrics import auc
    from offgraph.model.model import predict_proba
    from offgraph.model.train import carve_validation, split_encoded

    spec = load_spec(REPO / "examples" / "movielens.yaml")
    table = movielens_table.slice(0, 20000)
    cfg = TrainConfig(epochs=5, lr=0.01, patience=1, refit=False, split="per-key-time")
    model, m = train_run(spec, table, cfg, None, progress=False)
    es = m["early_stopping"]
    aucs = [h["validation"]["auc"] for h in m["history"]]
    assert es["best_epoch"] == 1 + int(np.argmax(aucs)) and es["best_validation_auc"] == max(aucs)
    assert es["epochs_run"] == len(aucs)
    if es["stopped_early_at"] is not None:  # patience 1: the first epoch not better than the best stops
        assert es["stopped_early_at"] == es["best_epoch"] + 1 == len(aucs) < 5
    data = encode_table(model.spec, table)
    train, held = split_encoded(model.spec, data, cfg)
    _, val = carve_validation(train, cfg)
    assert val.n == es["validation_rows"] == m["validation_rows"] and m["held_out_rows"] == held.n
    assert auc(val.labels, predict_proba(model, val.x)) == pytest.approx(max(aucs), abs=1e-6)
    # refit: the same epoch count again, on all the training rows
    cfg2 = cfg.replace(epochs=2, refit=True)
    _, m2 = train_run(spec, table, cfg2, None, progress=False)
    es2 = m2["early_stopping"]
    assert es2["refit_epochs"] == es2["best_epoch"] and m2["train_rows"] == es2["refit_rows"] == train.n


def test_listwise_training_runs(movielens_table):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    cfg = TrainConfig(epochs=1, loss="listwise", split="per-key-time")
    _, metrics = train_run(spec, movielens_table.slice(0, 8000), cfg, None, progress=False)
    assert np.isfinite(metrics["held_out"]["ndcg@10"])


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "offgraph.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_cli_broken_spec_names_field(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("label: y\nfields:\n  - {name: f1, scope: item, op: nope, input: a, rows: 3}\n")
    data = tmp_path / "d.csv"
    data.write_text("y,a\n1,2\n")
    r = run_cli("train", "--spec", str(spec), "--data", str(data), "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert "field 'f1': unknown op 'nope'" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_malformed_rows_name_the_line(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "label: y\nmodel: {mlp: [4]}\nfields:\n  - {name: price, scope: item, op: log_bucket, input: p, rows: 16}\n"
    )
    bad = tmp_path / "bad.csv"
    bad.write_text("y,p\n1,2\n0,3,4\n1,5\n")
    r = run_cli("train", "--spec", str(spec), "--data", str(bad), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "line 3" in r.stderr and "Traceback" not in r.stderr
    text = tmp_path / "text.csv"
    text.write_text("y,p\n1,2\n0,cheap\n")
    r = run_cli("train", "--spec", str(spec), "--data", str(text), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "field 'price', row 1" in r.stderr and "Traceback" not in r.stderr
    lab = tmp_path / "lab.csv"
    lab.write_text("y,p\n1,2\n-1,3\n")  # a grade 7 is a label; a negative one is not
    r = run_cli("train", "--spec", str(spec), "--data", str(lab), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "row 1: label 'y' must be a relevance grade" in r.stderr


def test_cli_headerless_file_needs_columns(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("label: y\nmodel: {mlp: [4]}\nfields:\n  - {name: c, scope: item, op: id, input: c, rows: 16}\n")
    data = tmp_path / "d.tsv"
    data.write_text("1\t1\n" + "".join(f"{i % 2}\tv{i % 3}\n" for i in range(40)))  # first row read as a header
    r = run_cli("train", "--spec", str(spec), "--data", str(data), "--out", str(tmp_path / "run"), "--epochs", "1")
    assert r.returncode == 2 and "appear more than once" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(
        "train",
        "--spec",
        str(spec),
        "--data",
        str(data),
        "--columns",
        "y,c",
        "--out",
        str(tmp_path / "run"),
        "--epochs",
        "1",
        "--split",
        "random",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["held_out_rows"] > 0

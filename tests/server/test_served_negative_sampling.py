"""A model trained on a sample of its negatives serves CTRs, with the correction taken from its run.

``offgraph train --negative-rate 0.3`` on MovieLens (label: rating >= 4, 55% positive) with the example spec
unedited (tiny tables): each epoch trains on every positive and a fresh 30% of the negatives, so the model's own
sigmoid sits near the sampled positive rate, 0.55 / (0.55 + 0.45 * 0.3) = 0.8. Training writes the rate into the
run's spec, the export carries it into the manifest, and a real server corrects each score by
p / (p + (1 - p) / 0.3): on the held-out rows, served over HTTP, the mean CTR must be within 2% of the observed
positive rate. The split is random, so the held-out rows follow the training rows' law (a time split adds the
drift of MovieLens's later ratings, which no correction of the sampling can know about). A spec stating another
rate than the run sampled at is refused at export and at load, naming both.
"""

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from server_helpers import ThreadServer, copy_version, score, server_config

from offgraph.modeldir.manifest import ModelDirError

REPO = Path(__file__).resolve().parents[2]
RATE = 0.3
ROWS = 100_000  # all of MovieLens-100K: 20,000 held-out rows, so the observed rate's own noise is ~0.6%
EPOCHS = 4  # fewer leave the sampled model's sigmoid squeezed toward its base rate (deciles 0.41..0.68 at 2 epochs)


@pytest.fixture(scope="module")
def sampled(movielens_table, tmp_path_factory):
    """(MODELS dir holding ns/1, the run dir, the table)."""
    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    assert "calibration" not in raw["model"]  # the rate is never typed into the spec
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    table = movielens_table.slice(0, ROWS)
    root = tmp_path_factory.mktemp("negative_sampling")
    cfg = TrainConfig(epochs=EPOCHS, batch_size=512, negative_rate=RATE, split="random", validation=0)
    train_run(parse_spec(raw, source="tiny movielens"), table, cfg, root / "run", progress=False)
    export_run(root / "run", root / "models" / "ns" / "1", shards=2, quant="fp32", progress=False)
    return root / "models", root / "run", table


def _held_out(run_dir, table):
    """(requests grouped from the held-out rows, each row's binarised label)."""
    from offgraph.export.check import requests_from_rows
    from offgraph.export.run_split import run_held_out_mask
    from offgraph.model.model import load_run

    _, spec, _ = load_run(run_dir)
    idx = np.flatnonzero(run_held_out_mask(run_dir, spec, table))
    inputs = spec.raw_inputs("request") + spec.raw_inputs("item")
    columns = table.select(inputs).to_pydict()
    labels = np.asarray(table.column(spec.label).to_numpy(), np.float64)[idx] > 0
    return list(requests_from_rows(spec, columns, idx)), labels


def _reliability(p: np.ndarray, y: np.ndarray) -> str:
    """Deciles of the served score: mean score vs observed rate, one line each."""
    lines = []
    for d, part in enumerate(np.array_split(np.argsort(p, kind="stable"), 10)):
        lines.append(f"decile {d}: mean score {p[part].mean():.3f}, observed {y[part].mean():.3f} ({len(part)} rows)")
    return "\n".join(lines)


def test_served_ctrs_are_calibrated_without_editing_the_spec(sampled):
    models, run_dir, table = sampled
    manifest = json.loads((models / "ns" / "1" / "manifest.json").read_text())
    assert manifest["training"]["config"]["negative_rate"] == RATE
    assert manifest["spec"]["model"]["calibration"] == {"negative_rate": RATE}
    requests, y = _held_out(run_dir, table)
    served = np.zeros(len(y), np.float64)
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            for request, cands, pos in requests:
                r = score(client, {"request": request, "candidates": cands}, name="ns")
                assert r.status_code == 200, r.text
                assert r.json()["score_kind"] == "ctr"
                served[pos] = r.json()["scores"]
    finally:
        srv.stop()
    rate = y.mean()
    # the same scores before the correction: p = q / (q + r (1 - q)) inverts q = p / (p + (1 - p) / r)
    uncorrected = served / (served + RATE * (1 - served))
    curve = _reliability(served, y)
    detail = (
        f"held-out rows {len(y)}, observed positive rate {rate:.4f}, served mean {served.mean():.4f} "
        f"(uncorrected sigmoid {uncorrected.mean():.4f})\n{curve}"
    )
    assert abs(served.mean() - rate) / rate <= 0.02, detail
    assert uncorrected.mean() > rate + 0.15, detail  # the correction did the work: the sigmoid saw 30% of negatives


def test_a_spec_stating_another_rate_is_refused_at_export_and_at_load(sampled, tmp_path):
    from offgraph.export.export import export_run
    from offgraph.scoring.scorer import Scorer

    models, run_dir, _ = sampled
    # the run's spec.yaml edited after training: export refuses before writing anything
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    spec["model"]["calibration"] = {"negative_rate": 0.5}
    (run / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(
        ModelDirError, match=r"negative_rate 0\.5, and the run sampled negatives at --negative-rate 0\.3"
    ):
        export_run(run, tmp_path / "models" / "x" / "1", shards=1, quant="fp32", progress=False)
    assert not (tmp_path / "models" / "x" / "1" / "manifest.json").exists()

    # a version whose manifest's spec states another rate (or none) is not loaded
    def stating(rate):
        def edit(m):
            m["spec"]["model"]["calibration"] = {} if rate is None else {"negative_rate": rate}

        return edit

    for rate, stated in ((0.5, "0.5"), (None, "1")):
        dst = tmp_path / "served" / f"v{stated}" / "1"
        copy_version(models / "ns" / "1", dst, manifest_edit=stating(rate))
        with pytest.raises(ModelDirError, match=rf"negative_rate {stated}, and the run sampled negatives at"):
            Scorer(dst)

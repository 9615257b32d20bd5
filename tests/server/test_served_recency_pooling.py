"""A request-scope history pooled by recency, trained and served: a MovieLens DeepFM whose ``recent_movies`` (each
rating's user's earlier movies, oldest first, cut to the last 5) pools with ``pooling: recency, half_life: 2``.
Served scores equal Keras's on training rows with long histories (``offgraph check``, fp32), and over real HTTP
the order of a history now matters: its most recent movie weighs most."""

from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import ThreadServer, score, server_config
from test_served_history_cut import CANDS, REQ, with_history

REPO = Path(__file__).resolve().parents[2]
CAP = 5


@pytest.fixture(scope="module")
def recency_model(movielens_table, tmp_path_factory):
    """(MODELS dir holding ml/1, the run, its table): a 1-epoch DeepFM with a recency-pooled history field."""
    import yaml

    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    history = {"name": "recent_movies", "scope": "request", "op": "id", "input": "recent_movies", "rows": 200}
    history.update(max_values=CAP, overflow="keep_last", pooling="recency", half_life=2)
    raw["fields"].insert(5, history)
    spec = parse_spec(raw, source="recency movielens")
    table = with_history(movielens_table.slice(0, 6000))
    root = tmp_path_factory.mktemp("recency_model")
    train_run(spec, table, TrainConfig(epochs=1, batch_size=512, split="per-key-time"), root / "run", progress=False)
    export_run(root / "run", root / "models" / "ml" / "1", shards=2, quant="fp32", progress=False)
    return root / "models", root / "run", table


def test_served_scores_equal_keras(recency_model):
    from offgraph.export.check import run_check

    models, run, table = recency_model
    out = run_check(models / "ml" / "1", run, table.slice(0, 1500), rows="all", limit=1500)
    assert out["rows"] == 1500 and out["max_abs_dp"] <= 1e-5, out
    hist = table.column("recent_movies").to_pylist()[:1500]
    assert sum(len(h) > 1 for h in hist) > 1000  # most rows pool several movies, weighted


def test_a_histories_order_matters_and_its_cut_is_the_last_values(recency_model):
    models, _, table = recency_model
    movies = list(dict.fromkeys(table.column("movie_id").to_pylist()))[:20]
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:

            def scores(history):
                r = score(client, {"request": {**REQ, "recent_movies": history}, "candidates": CANDS})
                assert r.status_code == 200, r.text
                return np.asarray(r.json()["scores"], np.float32)

            three = movies[:3]
            # a mean would pool [a, b, c] and [c, b, a] alike; recency weighs the last most
            assert np.abs(scores(three) - scores(three[::-1])).max() > 1e-6
            # a history 4x max_values scores as its last five, weighted as sent alone
            np.testing.assert_array_equal(scores(movies), scores(movies[-CAP:]))
    finally:
        srv.stop()

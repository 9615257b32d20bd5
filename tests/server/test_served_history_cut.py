"""A request-scope history (``overflow: keep_last``) served over real HTTP: a model trained on MovieLens rows
whose ``recent_movies`` (the user's earlier ratings, oldest first) is often far longer than the field's
``max_values`` of 5. A history ten times that long is scored (200), with the scores of its last five sent
alone; the training inputs were cut the same way (the served scores equal Keras's on the training rows);
a field without the option still answers 422 with its message."""

from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import ThreadServer, score, server_config

REPO = Path(__file__).resolve().parents[2]
CAP = 5
HISTORY_ROWS = 200


def with_history(table):
    """``table`` (sorted by time) with ``recent_movies``: each row's user's earlier movies, oldest first."""
    import pyarrow as pa

    seen: dict[int, list[int]] = {}
    hist = []
    for u, m in zip(table.column("user_id").to_pylist(), table.column("movie_id").to_pylist()):
        past = seen.setdefault(u, [])
        hist.append(list(past))
        past.append(m)
    return table.append_column("recent_movies", pa.array(hist, pa.list_(pa.int64())))


@pytest.fixture(scope="module")
def history_model(movielens_table, tmp_path_factory):
    """(MODELS dir holding ml/1, the run, its table): a 1-epoch DeepFM with a keep_last history field."""
    import yaml

    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    history = {"name": "recent_movies", "scope": "request", "op": "id", "input": "recent_movies", "rows": HISTORY_ROWS}
    raw["fields"].insert(5, {**history, "max_values": CAP, "overflow": "keep_last", "pooling": "mean"})
    spec = parse_spec(raw, source="history movielens")
    table = with_history(movielens_table.slice(0, 6000))
    root = tmp_path_factory.mktemp("history_model")
    train_run(spec, table, TrainConfig(epochs=1, batch_size=512, split="per-key-time"), root / "run", progress=False)
    export_run(root / "run", root / "models" / "ml" / "1", shards=2, quant="fp32", progress=False)
    return root / "models", root / "run", table


@pytest.fixture(scope="module")
def client(history_model):
    srv = ThreadServer(server_config(history_model[0]))
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
    srv.stop()


REQ = {"user_id": 13, "age": 47, "gender": "M", "occupation": "educator", "zip_prefix": "291"}
CANDS = [
    {"movie_id": 50, "genres": ["Action", "Sci-Fi"], "title_words": ["star", "wars"], "release_year": 1977},
    {"movie_id": 100, "genres": ["Crime", "Drama", "Thriller"], "title_words": ["fargo"], "release_year": 1996},
    {"movie_id": 1, "genres": ["Animation", "Comedy"], "title_words": ["toy", "story"], "release_year": 1995},
]


def scores(client, history) -> np.ndarray:
    r = score(client, {"request": {**REQ, "recent_movies": history}, "candidates": CANDS})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["scores"], np.float32)


def test_a_history_ten_times_max_values_scores_as_its_most_recent_part(client, history_model):
    table = history_model[2]
    movies = list(dict.fromkeys(table.column("movie_id").to_pylist()))[: 10 * CAP]  # 50 distinct trained ids
    long = scores(client, movies)
    np.testing.assert_array_equal(long, scores(client, movies[-CAP:]))  # the last five: the most recent
    # another past before the same five most recent: the same scores; the oldest five instead: other scores
    np.testing.assert_array_equal(long, scores(client, movies[-2 * CAP : -CAP][::-1] + movies[-CAP:]))
    assert np.abs(long - scores(client, movies[:CAP])).max() > 1e-6


def test_a_field_without_the_option_still_answers_422(client):
    long_title = dict(CANDS[0], title_words=[f"w{i}" for i in range(1001)])  # the spec's default max_values
    r = score(client, {"request": {**REQ, "recent_movies": [1, 2]}, "candidates": [CANDS[0], long_title]})
    assert r.status_code == 422, r.text
    assert (
        "field 'title_words', candidates[1]: 1001 values, more than the field's max_values of 1000 "
        "(the model's feature spec)" in r.json()["detail"]
    )


def test_training_cut_the_histories_as_serving_does(history_model):
    from offgraph.export.check import run_check
    from offgraph.features import load_spec
    from offgraph.features.hashing import row_of
    from offgraph.model.inputs import encode_table

    models, run, table = history_model
    hist = table.column("recent_movies").to_pylist()
    longest = max(range(len(hist)), key=lambda r: len(hist[r]))
    assert len(hist[longest]) > 10 * CAP  # the training data holds histories far past max_values
    # what Keras was fed for that row: its last five movies, hashed
    spec = load_spec(run / "spec.yaml")
    x = encode_table(spec, table.slice(longest, 1)).x
    i = spec.field_index("recent_movies")
    assert x[f"ids_{i}"][0].tolist() == [row_of(m, "xxh64", HISTORY_ROWS) for m in hist[longest][-CAP:]]
    # served scores equal Keras's on training rows, the long histories among them (fp32)
    out = run_check(models / "ml" / "1", run, table.slice(0, 1500), rows="all", limit=1500)
    assert out["rows"] == 1500 and out["max_abs_dp"] <= 1e-5, out
    assert sum(len(h) > CAP for h in hist[:1500]) > 500

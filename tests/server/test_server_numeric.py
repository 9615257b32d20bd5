"""A model with a continuous input (examples/movielens_numeric.yaml) served over real HTTP: the numeric
value reaches the dense input (the score moves with it, as the library scorer says), no value is the
documented default, and a value of the wrong type is a 422 naming the field."""

import httpx
import numpy as np
import pytest
from server_helpers import ThreadServer, score, server_config


@pytest.fixture(scope="module")
def served(numeric_run, tmp_path_factory):
    from offgraph.export.export import export_run
    from offgraph.scoring.scorer import load

    models = tmp_path_factory.mktemp("num_models")
    export_run(numeric_run[0], models / "ml" / "1", shards=2, quant="fp32", progress=False)
    srv = ThreadServer(server_config(models))
    lib = load(models / "ml")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c, lib
    lib.close()
    srv.stop()


REQ = {"user_id": 13, "age": 47, "gender": "M", "occupation": "educator", "zip_prefix": "291"}
CAND = {"movie_id": 50, "genres": ["Action", "Sci-Fi"], "title_words": ["star", "wars"], "release_year": 1977}


def test_numeric_input_is_scored_like_the_library(served):
    client, lib = served
    cands = [{**CAND, "movie_prior_mean": v} for v in (1.5, 3.0, 4.6)] + [CAND, {**CAND, "movie_prior_mean": None}]
    r = score(client, {"request": REQ, "candidates": cands})
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["scores"], np.float32)
    np.testing.assert_array_equal(got, lib.score(REQ, cands))
    assert len(set(got[:3].tolist())) == 3  # the value is a model input: the score moves with it
    assert got[3] == got[4]  # a missing key and null are both no value: the documented default
    stats = lib.spec.numeric[0].params["stats"]
    at_mean = score(client, {"request": REQ, "candidates": [{**CAND, "movie_prior_mean": stats["mean"]}]})
    assert abs(at_mean.json()["scores"][0] - got[3]) < 1e-6  # default 0 after standardize = the training mean


@pytest.mark.parametrize("bad", ["high", True, [3.5]])
def test_numeric_bad_type_is_422_naming_the_field(served, bad):
    client, _ = served
    r = score(client, {"request": REQ, "candidates": [CAND, {**CAND, "movie_prior_mean": bad}]})
    assert r.status_code == 422, r.text
    assert "field 'movie_prior_mean', candidates[1]: expected a number" in r.json()["detail"], r.text

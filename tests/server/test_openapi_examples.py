"""/openapi.json through a real uvicorn on 127.0.0.1 serving the tiny real model: the score and predict bodies
carry the served model's own examples (from its spec), each one the server scores as is, refreshed when
another version serves; the generic example names no model's inputs; the numeric bounds are plain numbers."""

import re
import sys

import jsonschema_rs  # schemathesis' validator
import pytest
from server_helpers import client, copy_version, model_server, resolve_refs, score, wait_for  # noqa: F401 - client: a fixture

SCORE = "/v1/models/{name}:score"
PREDICTS = ("/v1/models/{name}:predict", "/v1/models/{name}/versions/{version}:predict")


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with model_server(tiny_model[0], tmp_path_factory.mktemp("openapi_examples"), max_candidates=20) as srv:
        yield srv


def _media(spec, path):
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]


def test_the_score_body_examples_are_the_served_models_own(client):
    spec = client.get("/openapi.json").json()
    inputs = client.get("/v1/models/ml").json()["inputs"]
    media = _media(spec, SCORE)
    examples = media["examples"]
    assert set(examples) == {"ml", "ml, ids only"}
    full, ids = examples["ml"]["value"], examples["ml, ids only"]["value"]
    assert list(full["request"]) == inputs["request"]
    assert len(full["candidates"]) == 2 and all(list(c) == inputs["item"] for c in full["candidates"])
    assert full["candidates"][0] != full["candidates"][1]
    assert ids == {
        "request": {"user_id": full["request"]["user_id"]},
        "candidates": [{"movie_id": c["movie_id"]} for c in full["candidates"]],
    }
    validator = jsonschema_rs.Draft202012Validator(resolve_refs(media["schema"], spec))
    for body in (full, ids):
        assert list(validator.iter_errors(body)) == [], body
        r = score(client, body)
        assert r.status_code == 200 and len(r.json()["scores"]) == 2, r.text
    assert score(client, ids).json()["unknown_candidates"] == 2  # placeholder keys: no stored row
    # the path's model name is offered too
    (name,) = [p for p in spec["paths"][SCORE]["post"]["parameters"] if p["name"] == "name"]
    assert [e["value"] for e in name["examples"].values()] == ["ml"]
    # the generic example names no input of the model's items
    (generic,) = resolve_refs(media["schema"], spec)["examples"]
    assert not set(inputs["item"]) & {k for c in generic["candidates"] for k in c}


def test_the_predict_examples_score_as_the_score_examples(client):
    spec = client.get("/openapi.json").json()
    scored = {k: score(client, e["value"]).json()["scores"] for k, e in _media(spec, SCORE)["examples"].items()}
    for path in PREDICTS:
        examples = _media(spec, path)["examples"]
        assert set(examples) == set(scored)
        for label, e in examples.items():
            r = client.post(path.format(name="ml", version=1), json=e["value"])
            assert r.status_code == 200 and r.json()["predictions"] == scored[label], (path, label, r.text)


def test_the_examples_follow_the_served_version(server, client):
    def summary():
        return _media(client.get("/openapi.json").json(), SCORE)["examples"]["ml"]["summary"]

    assert "version 1" in summary()
    copy_version(server.models / "ml" / "1", server.models / "ml" / "2")
    wait_for(lambda: client.get("/v1/models/ml").json()["loaded"]["version"] == 2, 60, "version 2 served")
    assert "version 2" in summary()


def test_the_numeric_bounds_are_plain_numbers(client):
    text = client.get("/openapi.json").text
    assert re.search(r"\d{20}", text) is None  # no integer of hundreds of digits
    spec = client.get("/openapi.json").json()
    numbers = [
        s
        for s in resolve_refs(_media(spec, SCORE)["schema"], spec)["properties"]["request"]["additionalProperties"][
            "anyOf"
        ]
        if s.get("type") == "number"
    ]
    assert numbers == [{"type": "number", "minimum": -sys.float_info.max, "maximum": sys.float_info.max}]

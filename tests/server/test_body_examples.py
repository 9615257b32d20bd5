"""Example bodies built from a spec (``offgraph.server.api.body_examples``): for every shipped example spec, every raw
input in its own scope, with values its feature generation takes (a value for every field)."""

from pathlib import Path

import pytest

from offgraph.features import load_spec
from offgraph.features.fg import FeatureGenerator
from offgraph.server.api.body_examples import example_body, ids_only_body

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def _servable(spec):
    """The spec as an export carries it: standardize statistics filled in (training computes them)."""
    stats = {f.name: {"mean": 3.5, "std": 1.0} for f in spec.numeric if "standardize" in f.params.get("transform", [])}
    return spec.with_stats(stats) if stats else spec


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_example_body_has_every_input_in_its_scope_and_generates_features(path):
    spec = _servable(load_spec(path))
    body = example_body(spec, candidates=3)
    assert list(body["request"]) == spec.raw_inputs("request")
    assert len(body["candidates"]) == 3
    assert all(list(c) == spec.raw_inputs("item") for c in body["candidates"])
    fg = FeatureGenerator(spec)
    assert fg.check_scopes(body["request"], body["candidates"]) == 0  # no key ignored, none misplaced
    batch = fg.transform(body["request"], body["candidates"])
    assert batch.n == 3
    assert all(r.lengths.min() > 0 for r in batch.per_row().fields)  # every field has a value (no zero embedding)


def test_values_follow_the_ops():
    spec = load_spec(EXAMPLES[0].parent / "movielens.yaml")
    body = example_body(spec)
    req, (c1, c2) = body["request"], body["candidates"]
    assert isinstance(req["age"], int) and 18 <= req["age"] <= 56  # bucketize (and id): a number in its boundaries
    assert isinstance(c1["release_year"], int) and 1940 <= c1["release_year"] <= 1998
    assert isinstance(c1["genres"], list) and len(c1["genres"]) == 2  # a pooled id field: several values
    assert isinstance(c1["movie_id"], str) and c1["movie_id"] != c2["movie_id"]
    assert ids_only_body(spec) == {
        "request": {"user_id": req["user_id"]},
        "candidates": [{"movie_id": c1["movie_id"]}, {"movie_id": c2["movie_id"]}],
    }
    assert ids_only_body(load_spec(EXAMPLES[0].parent / "criteo.yaml")) is None  # no feature tables

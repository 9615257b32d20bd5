"""``split_instances``: TensorFlow Serving rows as one request and its candidates (pure: no server)."""

import pytest

from offgraph.server.api.tfserving_body import split_instances
from offgraph.server.http.errors import ApiError

REQUEST, ITEM = {"user_id", "age"}, {"movie_id", "genres"}


def split(instances, context=None):
    return split_instances(instances, context or {}, REQUEST, ITEM)


def test_rows_split_into_the_request_and_the_candidates():
    rows = [{"user_id": 7, "age": 21, "movie_id": 1, "x": "y"}, {"user_id": 7, "age": 21, "movie_id": 2}]
    assert split(rows) == ({"user_id": 7, "age": 21}, [{"movie_id": 1, "x": "y"}, {"movie_id": 2}])
    # context and rows agreeing; rows without the request inputs are kept as they are
    assert split(rows, {"user_id": 7, "other": 1}) == (
        {"user_id": 7, "other": 1, "age": 21},
        [{"movie_id": 1, "x": "y"}, {"movie_id": 2}],
    )
    items = [{"movie_id": 1}, {"movie_id": 2}]
    request, candidates = split(items, {"user_id": 7})
    assert request == {"user_id": 7} and candidates == items
    # a key in context covers the rows that leave it out; lists compare item by item
    assert split([{"age": [1, "a"]}, {}], {"age": [1, "a"]}) == ({"age": [1, "a"]}, [{}, {}])


@pytest.mark.parametrize(
    "rows, context, words",
    [
        ([{"user_id": 7}, {"user_id": 8}], {}, ["'user_id'", "instances[0] has 7", "instances[1] has 8"]),
        ([{"user_id": 7}, {}], {}, ["'user_id'", "instances[1] does not send it"]),
        ([{}, {"user_id": 7}], {}, ["instances[1] has 7", "instances[0] does not send it"]),
        ([{"age": 21}], {"age": 22}, ["'context' has 22", "instances[0] has 21"]),
        ([{"age": 1}, {"age": 1.0}], {}, ["'age'"]),  # three different feature values: 1, 1.0, true
        ([{"age": 1}, {"age": True}], {}, ["'age'"]),
        ([{"age": [1, 2]}, {"age": [1, 2.0]}], {}, ["'age'"]),
        ([{}], {"movie_id": 3}, ["'movie_id'", "item-scope", "each instance"]),
    ],
)
def test_conflicts_are_422_naming_the_input(rows, context, words):
    with pytest.raises(ApiError) as e:
        split(rows, context)
    assert e.value.status_code == 422
    for w in words:
        assert w in e.value.detail, (w, e.value.detail)

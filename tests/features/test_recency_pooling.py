"""``pooling: recency`` with ``half_life``: a history (listed oldest first) pooled as a weighted mean whose weights
halve every ``half_life`` values back from the most recent. The weights against hand-computed ones, and every
place that pools (NumPy, the scorer's batch pooling, the Keras inputs, stream training) taking them alike."""

import numpy as np
import pyarrow as pa
import pytest

from offgraph.features import parse_spec
from offgraph.features.fg import FGBatch, RaggedIds
from offgraph.features.pooling import pool_numpy, recency_weights
from offgraph.features.spec import SpecError
from offgraph.scoring.batch import batch_keys, pool_batch

SPEC = {
    "label": "y",
    "model": {"embedding_dim": 2, "mlp": [4]},
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user", "rows": 50},
        {
            "name": "recent",
            "scope": "request",
            "op": "id",
            "input": "recent",
            "rows": 1000,
            "max_values": 3,
            "overflow": "keep_last",
            "pooling": "recency",
            "half_life": 1,
        },
        {"name": "item", "scope": "item", "op": "id", "input": "item", "rows": 50},
    ],
}


def test_weights_by_hand():
    # half-life 1: each value back from the last weighs half as much; a row's weights sum to 1
    got = recency_weights(np.array([3, 1, 0, 2]), 1.0)
    np.testing.assert_allclose(got, [1 / 7, 2 / 7, 4 / 7, 1.0, 1 / 3, 2 / 3], rtol=1e-7)
    # half-life 2: [2^-1, 2^-1/2, 1] / (1.5 + 1/sqrt(2))
    z = 1.5 + 2**-0.5
    np.testing.assert_allclose(recency_weights(np.array([3]), 2.0), [0.5 / z, 2**-0.5 / z, 1 / z], rtol=1e-7)
    # a half-life far longer than the history: a plain mean; no values: no weights
    np.testing.assert_allclose(recency_weights(np.array([4]), 1e6), [0.25] * 4, rtol=1e-5)
    assert recency_weights(np.array([0, 0]), 3.0).shape == (0,)


def test_pool_numpy_by_hand():
    values = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [5.0, -1.0]], np.float32)
    offsets = np.array([0, 3, 3, 4])  # rows: 3 values, none, 1 value
    got = pool_numpy(values, offsets, "recency", half_life=1.0)
    want = [[1 / 7 + 8 / 7, 2 / 7 + 8 / 7], [0.0, 0.0], [5.0, -1.0]]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(ValueError, match="half_life"):
        pool_numpy(values, offsets, "recency")


def test_the_scorers_batch_pooling_weighs_by_recency():
    """A request-scope history broadcast over 2 candidates, and an item field pooled by recency too."""
    rng = np.random.default_rng(0)
    hist = RaggedIds(np.array([7, 3, 9], np.int64), np.array([0, 3]))  # one request row, oldest first
    item = RaggedIds(np.array([1, 2, 4, 5, 5], np.int64), np.array([0, 2, 5]))  # 2 candidates
    batch = FGBatch(2, (hist, item), (True, False))
    keys = batch_keys(batch)
    vectors = rng.normal(size=(len(keys.unique_rows), 3)).astype(np.float32)
    first = rng.normal(size=len(keys.unique_rows)).astype(np.float32)
    emb, fo = pool_batch(batch, keys, vectors, first, ["recency", "recency"], 3, [1.0, 2.0])
    # by hand: the lookups in (field, row, value) order, each's row of the tables
    at = keys.inverse
    v, w = vectors[at].astype(np.float64), first[at].astype(np.float64)
    h1 = np.array([1, 2, 4]) / 7
    z2 = 1.5 + 2**-0.5
    h2 = [np.array([2**-0.5, 1]) / (1 + 2**-0.5), np.array([0.5, 2**-0.5, 1]) / z2]
    for c in range(2):
        np.testing.assert_allclose(emb[c, 0], h1 @ v[0:3], rtol=1e-5)
        np.testing.assert_allclose(fo[c, 0], h1 @ w[0:3], rtol=1e-5)
    np.testing.assert_allclose(emb[0, 1], h2[0] @ v[3:5], rtol=1e-5)
    np.testing.assert_allclose(emb[1, 1], h2[1] @ v[5:8], rtol=1e-5)
    np.testing.assert_allclose(fo[1, 1], h2[1] @ w[5:8], rtol=1e-5)
    with pytest.raises(ValueError, match="half_life"):
        pool_batch(batch, keys, vectors, first, ["recency", "mean"], 3)


def test_training_inputs_carry_the_weights_of_the_kept_values():
    from offgraph.features.hashing import row_of
    from offgraph.model.inputs import encode_table

    spec = parse_spec(SPEC)
    table = pa.table(
        {
            "y": [1, 0, 1],
            "user": [1, 2, 3],
            "recent": [[10, 11, 12, 13, 14], [20], []],  # 5 values: the last 3 kept
            "item": [5, 6, 7],
        }
    )
    x = encode_table(spec, table).x
    np.testing.assert_array_equal(x["ids_1"][0], [row_of(v, "xxh64", 1000) for v in (12, 13, 14)])
    np.testing.assert_allclose(x["mask_1"], [[1 / 7, 2 / 7, 4 / 7], [1, 0, 0], [0, 0, 0]], rtol=1e-7)
    np.testing.assert_array_equal(x["mask_0"], [[1], [1], [1]])  # other fields: 0/1 as before


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"half_life": None}, "pooling 'recency' needs 'half_life'"),
        ({"half_life": 0}, r"half_life must be a number in \(0, 1e\+06\], got 0"),
        ({"half_life": "2"}, "half_life must be a number"),
        ({"pooling": "mean"}, "'half_life' is recency pooling's: this field's pooling is 'mean'"),
    ],
)
def test_spec_refusals(edit, message):
    raw = {**SPEC, "fields": [dict(f) for f in SPEC["fields"]]}
    raw["fields"][1].update(edit)
    raw["fields"][1] = {k: v for k, v in raw["fields"][1].items() if v is not None}
    with pytest.raises(SpecError, match=message):
        parse_spec(raw)
    with pytest.raises(SpecError, match="model.pooling must be one of"):
        parse_spec({**SPEC, "model": {**SPEC["model"], "pooling": "recency"}})


def test_the_schema_takes_what_the_parser_takes():
    import jsonschema

    from offgraph.features.spec_schema import spec_schema

    check = jsonschema.Draft202012Validator(spec_schema())
    assert not list(check.iter_errors(SPEC))
    for edit in ({"half_life": None}, {"pooling": "mean"}, {"half_life": 0}):
        f = {k: v for k, v in {**SPEC["fields"][1], **edit}.items() if v is not None}
        assert list(check.iter_errors({**SPEC, "fields": [SPEC["fields"][0], f]})), edit

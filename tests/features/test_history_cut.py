"""``overflow: keep_last``: a history (recent item ids, oldest first) longer than its field's ``max_values`` is
cut to its last ``max_values`` values by the one FG, in serving and in training alike; a field without the
option still refuses such a row as before. Expected values are written out by hand."""

import jsonschema_rs
import pytest

from offgraph.features import FeatureGenerator, FeatureValueError, parse_spec
from offgraph.features.hashing import row_of
from offgraph.features.spec import SpecError
from offgraph.features.spec_schema import spec_schema
from offgraph.features.value_limits import TooManyValues, value_errors

RAW = {
    "model": {"embedding_dim": 4, "hash": "xxh64", "mlp": [8]},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 1000},
        {
            "name": "history",
            "scope": "request",
            "op": "id",
            "input": "recent_items",
            "rows": 5000,
            "max_values": 3,
            "overflow": "keep_last",
        },
        {
            "name": "recent_tags",
            "scope": "request",
            "op": "id",
            "input": "tags",
            "separator": "|",
            "rows": 500,
            "max_values": 2,
            "overflow": "keep_last",
        },
        {"name": "item", "scope": "item", "op": "id", "input": "item_id", "rows": 5000},
        {"name": "cat", "scope": "item", "op": "id", "input": "cat_id", "rows": 100},
        {"name": "labels", "scope": "item", "op": "id", "input": "labels", "rows": 100, "max_values": 2},
        {"name": "h_x_cat", "scope": "cross", "op": "cross", "inputs": ["history", "cat"], "rows": 10000},
        {"name": "seen", "scope": "cross", "op": "match_count", "inputs": ["history", "item"], "rows": 8},
    ],
}
SPEC = parse_spec(RAW)
F = {f.name: i for i, f in enumerate(SPEC.fields)}
LONG = list(range(1, 31))  # 30 ids, 10x the field's max_values of 3; 30 is the most recent
CANDS = [{"item_id": 5, "cat_id": 7}, {"item_id": 29, "cat_id": 8}]


def ids(rag, row=0) -> list[int]:
    return rag.ids[rag.offsets[row] : rag.offsets[row + 1]].tolist()


def rows(values, rows_: int) -> list[int]:
    return [row_of(v, "xxh64", rows_) for v in values]


def test_the_spec_states_the_cut_and_defaults_to_refuse():
    assert SPEC.fields[F["history"]].params["overflow"] == "keep_last"
    assert SPEC.fields[F["user"]].params["overflow"] == "refuse"  # today's behaviour, unless stated
    tok = {"name": "q", "scope": "request", "op": "tokenize", "input": "q", "rows": 9, "overflow": "keep_last"}
    assert parse_spec({**RAW, "fields": [tok]}).fields[0].params["overflow"] == "keep_last"
    with pytest.raises(SpecError, match=r"field 'history': overflow must be one of \['refuse', 'keep_last'\], got "):
        parse_spec({**RAW, "fields": [dict(RAW["fields"][1], overflow="keep_first")]})
    bucket = {"name": "p", "scope": "item", "op": "bucketize", "input": "p", "boundaries": [1], "rows": 4}
    with pytest.raises(SpecError, match=r"field 'p': unknown parameter\(s\) \['overflow'\]"):
        parse_spec({**RAW, "fields": [{**bucket, "overflow": "keep_last"}]})
    # the editors' schema knows the key and its two values
    jsonschema_rs.validate(spec_schema(), RAW)
    with pytest.raises(jsonschema_rs.ValidationError):
        jsonschema_rs.validate(spec_schema(), {**RAW, "fields": [dict(RAW["fields"][1], overflow="keep_first")]})


def test_a_history_ten_times_max_values_is_served_cut_to_its_most_recent():
    fg = FeatureGenerator(SPEC)
    b = fg.transform({"user_id": 1, "recent_items": LONG, "tags": "a|b|c|d"}, CANDS)
    assert ids(b.fields[F["history"]]) == rows(["28", "29", "30"], 5000)
    assert ids(b.fields[F["recent_tags"]]) == rows(["c", "d"], 500)  # a split string: its last terms
    cross = b.fields[F["h_x_cat"]]  # crosses read the cut history
    assert ids(cross, 0) == rows(["28_7", "29_7", "30_7"], 10000)
    assert ids(cross, 1) == rows(["28_8", "29_8", "30_8"], 10000)
    seen = b.fields[F["seen"]]  # item 5 was in the history, before the cut: not seen; item 29 is in the cut part
    assert [ids(seen, 0), ids(seen, 1)] == [rows(["0"], 8), rows(["1"], 8)]


def test_the_served_batch_equals_sending_the_cut_history():
    fg = FeatureGenerator(SPEC, item_cache_size=10)
    long = fg.transform({"user_id": 1, "recent_items": LONG, "tags": "a|b|c|d"}, CANDS)
    cut = FeatureGenerator(SPEC).transform({"user_id": 1, "recent_items": [28, 29, 30], "tags": "c|d"}, CANDS)
    for f, a, c in zip(SPEC.fields, long.fields, cut.fields):
        assert ids(a) == ids(c) and a.offsets.tolist() == c.offsets.tolist(), f.name


def test_nulls_take_no_place_in_the_cut():
    # the cut keeps the last max_values VALUES: null entries are no value before and after it
    fg = FeatureGenerator(SPEC)
    got = fg.values_columns({"recent_items": [[1, 2, 3, None, 4, None], [None, 9, None]]}, 2)["history"]
    assert got == [["2", "3", "4"], ["9"]]


def test_training_applies_the_same_cut():
    fg = FeatureGenerator(SPEC)
    cols = {
        "user_id": [1, 2, 3],
        "recent_items": [LONG, [7, 8], list(range(100, 200))],
        "tags": ["a|b|c|d", "x", None],
        "item_id": [5, 8, 150],
        "cat_id": [7, 8, 7],
    }
    b = fg.transform_columns(cols, 3)
    hist = b.fields[F["history"]]
    assert [ids(hist, r) for r in range(3)] == [
        rows(["28", "29", "30"], 5000),
        rows(["7", "8"], 5000),  # shorter than max_values: as it is
        rows(["197", "198", "199"], 5000),
    ]
    assert [ids(b.fields[F["recent_tags"]], r) for r in range(3)] == [rows(["c", "d"], 500), rows(["x"], 500), []]
    # item 5 and item 150 were in their histories before the cut: not seen; item 8 is
    assert [ids(b.fields[F["seen"]], r) for r in range(3)] == [rows(["0"], 8), rows(["1"], 8), rows(["0"], 8)]
    # and each row equals what the server makes of it
    for r in range(3):
        req = {"user_id": cols["user_id"][r], "recent_items": cols["recent_items"][r], "tags": cols["tags"][r]}
        served = fg.transform(req, [{"item_id": cols["item_id"][r], "cat_id": cols["cat_id"][r]}])
        for f, s, t in zip(SPEC.fields, served.fields, b.fields):
            assert ids(s) == ids(t, r), (f.name, r)


def test_a_field_without_the_option_still_refuses_with_the_same_message():
    fg = FeatureGenerator(SPEC)
    with pytest.raises(FeatureValueError) as e:
        fg.transform({"recent_items": LONG}, [{"labels": ["a"]}, {"labels": ["a", "b", "c"]}])
    assert str(e.value) == (
        "field 'labels', candidates[1]: 3 values, more than the field's max_values of 2 (the model's feature spec)"
    )
    # training takes every value of such a field, as before
    b = fg.transform_columns({"labels": [["a", "b", "c"]]}, 1)
    assert ids(b.fields[F["labels"]]) == rows(["a", "b", "c"], 100)


def test_the_list_entries_still_count_against_the_request_budget():
    # the op reads all 30 entries before the cut: they are the request's work
    fg = FeatureGenerator(SPEC, max_request_values=29)
    with pytest.raises(TooManyValues, match="more than 29 feature values"):
        fg.transform({"recent_items": LONG}, [{"item_id": 1}])
    b = FeatureGenerator(SPEC, max_request_values=40).transform({"recent_items": LONG}, [{"item_id": 1}])
    assert len(b.fields[F["history"]].ids) == 3


def test_table_writers_take_a_long_history_and_refuse_a_long_refusing_list():
    cols = {"recent_items": [LONG, [1]], "labels": [["a"], ["a", "b", "c"]]}
    bad = value_errors(SPEC, cols, 2)
    assert [(b.row, b.field, b.problem) for b in bad] == [
        (1, "labels", "3 values, more than the field's max_values of 2 (the model's feature spec)")
    ]

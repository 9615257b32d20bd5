"""Bounded work per request and per connection.

FG level: a field's ``max_values`` and the generator's ``max_request_values`` (serving only;
training takes every value). HTTP level (a real ``offgraph serve`` on 127.0.0.1, real httpx
clients and raw sockets): the bounds as 422s, a valid request's latency while maximal bodies
are scored, header / body / keep-alive timeouts, HTTP/0.9 request lines, the connection limit.
"""
import pytest

from features import FeatureGenerator, FeatureValueError, parse_spec
from features.spec import SpecError
from features.value_limits import TooManyValues

# -- FG: values per field and per request --------------------------------------------------------
LIMITED = {
    "model": {"embedding_dim": 4, "hash": "xxh64", "mlp": [8]},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 1000},
        {"name": "query", "scope": "request", "op": "tokenize", "input": "query", "rows": 500, "max_values": 3},
        {"name": "title", "scope": "item", "op": "id", "input": "title_terms", "rows": 800, "max_values": 4},
        {"name": "tags", "scope": "item", "op": "id", "input": "tags", "separator": "|", "rows": 80,
         "max_values": 2},
        {"name": "cat", "scope": "item", "op": "id", "input": "cat_id", "rows": 100},
        {"name": "u_x_cat", "scope": "cross", "op": "cross", "inputs": ["user", "cat"], "rows": 5000},
    ],
}
SPEC = parse_spec(LIMITED)


def test_max_values_defaults_and_validation():
    spec = parse_spec({**LIMITED, "fields": LIMITED["fields"][:1]})
    assert spec.fields[0].params["max_values"] == 1000  # the documented default
    raw = {**LIMITED, "model": {**LIMITED["model"], "max_values": 7}}
    assert [f.params.get("max_values") for f in parse_spec(raw).fields] == [7, 3, 4, 2, 7, 64]
    for bad in (0, True, "5", 2.5):
        with pytest.raises(SpecError, match="field 'title': max_values must be an integer >= 1"):
            parse_spec({**LIMITED, "fields": [dict(LIMITED["fields"][2], max_values=bad)]})
    with pytest.raises(SpecError, match="model.max_values must be an integer >= 1"):
        parse_spec({**LIMITED, "model": {**LIMITED["model"], "max_values": 0}})
    bucket = {"name": "p", "scope": "item", "op": "bucketize", "input": "p", "boundaries": [1], "rows": 4,
              "max_values": 3}
    with pytest.raises(SpecError, match=r"field 'p': unknown parameter\(s\) \['max_values'\]"):
        parse_spec({**LIMITED, "fields": [bucket]})


def test_a_list_over_max_values_is_refused_naming_field_candidate_and_limit():
    fg = FeatureGenerator(SPEC)
    ok = [{"title_terms": ["a", "b", "c", "d"], "tags": "x|y", "cat_id": 1}]
    batch = fg.transform({"user_id": 1, "query": "red shoes now"}, ok)
    assert batch.fields[2].lengths.tolist() == [4]  # at the limit: every value, none cut
    cands = ok * 3 + [{"title_terms": ["a", "b", "c", "d", "e"]}]
    with pytest.raises(FeatureValueError, match=r"field 'title', candidates\[3\]: 5 values, more than the "
                                                r"field's max_values of 4"):
        fg.transform({"user_id": 1}, cands)
    with pytest.raises(FeatureValueError, match=r"field 'tags', candidates\[1\]: 3 values, more than the "
                                                r"field's max_values of 2"):
        fg.transform({"user_id": 1}, [{"tags": "x"}, {"tags": "x|y|z"}])  # a split string counts its terms
    with pytest.raises(FeatureValueError, match="field 'query', request: 4 values, more than the field's "
                                                "max_values of 3"):
        fg.transform({"user_id": 1, "query": "red running shoes now"}, ok)


def test_training_takes_every_value_of_a_long_list():
    fg = FeatureGenerator(SPEC)
    batch = fg.transform_columns({"user_id": [1], "title_terms": [list("abcdefgh")], "query": ["a b c d e"]}, 1)
    assert batch.fields[2].lengths.tolist() == [8] and batch.fields[1].lengths.tolist() == [5]


def test_errors_name_the_candidate_even_behind_the_item_cache():
    # the op sees only the cache misses: its row 0 here is candidate 2
    fg = FeatureGenerator(SPEC, item_cache_size=100)
    good = {"title_terms": ["a"], "cat_id": 1}
    fg.transform({"user_id": 1}, [good])
    with pytest.raises(FeatureValueError, match=r"field 'title', candidates\[2\]: nested value"):
        fg.transform({"user_id": 1}, [good, good, {"title_terms": [["nested"]]}])
    with pytest.raises(FeatureValueError, match=r"field 'title', candidates\[2\]: 5 values"):
        fg.transform({"user_id": 1}, [good, good, {"title_terms": list("abcde")}])


def test_max_request_values_counts_request_item_and_cross_values():
    # request: user 1 + query 2 = 3 values once; per candidate: title + tags + cat + the cross
    # (user x cat: one value when cat is set)
    request = {"user_id": 1, "query": "red shoes"}
    cands = [{"title_terms": ["a", "b"], "tags": "x|y", "cat_id": 1},  # 2 + 2 + 1 + 1 = 6
             {"title_terms": ["c"], "cat_id": 2}]                     # 1 + 0 + 1 + 1 = 3
    for cache in (0, 100):
        at_limit = FeatureGenerator(SPEC, item_cache_size=cache, max_request_values=12)
        over = FeatureGenerator(SPEC, item_cache_size=cache, max_request_values=11)
        for _ in range(2):  # the second time through the item cache (hits count too)
            assert at_limit.transform(request, cands).n == 2
            with pytest.raises(TooManyValues, match="more than 11 feature values .*max_request_values is 11"):
                over.transform(request, cands)
    with pytest.raises(ValueError, match="max_request_values must be an integer >= 1 or None"):
        FeatureGenerator(SPEC, max_request_values=0)


def test_max_request_values_refuses_long_lists_before_generating_them():
    fg = FeatureGenerator(SPEC, max_request_values=50)
    many = [{"title_terms": ["a", "b", "c", "d"]}] * 40  # 160 values, each row within max_values
    with pytest.raises(TooManyValues) as e:
        fg.transform({"user_id": 1}, many)
    assert e.value.counted == 1 + 160  # refused on the raw list lengths, before the op ran

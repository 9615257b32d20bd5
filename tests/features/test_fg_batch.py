import numpy as np
import pytest
from fg_samples import CANDS, REQUEST, SPEC

from offgraph.features import FeatureGenerator, FeatureValueError, RaggedIds, parse_spec
from offgraph.features.hashing import row_of


def training_columns():
    rows = [{**REQUEST, **c} for c in CANDS]
    keys = {k for r in rows for k in r}
    return {k: [r.get(k) for r in rows] for k in keys}


def expand(rag: RaggedIds, n: int, broadcast: bool) -> list[list[int]]:
    per = [rag.ids[rag.offsets[i] : rag.offsets[i + 1]].tolist() for i in range(rag.n)]
    return per * n if broadcast else per


@pytest.mark.parametrize("cache", [0, 100])
def test_serving_transform_equals_training_transform(cache):
    fg = FeatureGenerator(SPEC, item_cache_size=cache)
    served = fg.transform(REQUEST, CANDS)
    trained = FeatureGenerator(SPEC).transform_columns(training_columns(), len(CANDS))
    assert served.n == trained.n == 4
    for f, s, t, b in zip(SPEC.fields, served.fields, trained.fields, served.broadcast):
        assert b == (f.scope == "request")
        assert expand(s, 4, b) == expand(t, 4, False), f.name


def test_request_fields_computed_once_and_ids_match_hash():
    fg = FeatureGenerator(SPEC)
    b = fg.transform(REQUEST, CANDS)
    user = b.fields[0]
    assert user.n == 1 and user.ids.tolist() == [row_of(42, "xxh64", 1000)]
    cross = b.fields[5]
    assert expand(cross, 4, False)[0] == [row_of("42_7", "xxh64", 5000)]
    assert expand(cross, 4, False)[2] == []  # no cat -> no cross value
    match = b.fields[6]
    # "red","shoes" matched -> count 2 -> bucket index 2 with boundaries [1,2,3]
    assert expand(match, 4, False)[0] == [row_of("2", "xxh64", 8)]


def test_item_cache_hits_and_is_keyed_by_item_features():
    fg = FeatureGenerator(SPEC, item_cache_size=10)
    fg.transform(REQUEST, CANDS)
    assert fg.cache_misses == 3 and fg.cache_hits == 1  # 4th candidate equals the 1st
    changed = [dict(CANDS[0], cat_id=8)]
    b = fg.transform(REQUEST, changed)
    assert b.fields[4].ids.tolist() == [row_of(8, "xxh64", 100)]  # not served stale from the cache


def test_bad_value_names_field():
    fg = FeatureGenerator(SPEC)
    with pytest.raises(FeatureValueError, match=r"field 'price', candidates\[1\]: expected a number"):
        fg.transform(REQUEST, [{"price": 1}, {"price": "cheap"}])


def test_padded():
    rag = RaggedIds(np.array([5, 6, 7], np.int64), np.array([0, 2, 2, 3], np.int64))
    ids, mask = rag.padded()
    assert ids.tolist() == [[5, 6], [0, 0], [7, 0]]
    assert mask.tolist() == [[1, 1], [0, 0], [1, 0]]


def test_item_cache_tells_bools_from_ints():
    spec = parse_spec(
        {
            "label": "y",
            "model": {"mlp": [4]},
            "fields": [
                {"name": "flag", "scope": "item", "op": "id", "input": "flag", "rows": 1000},
                {"name": "flags", "scope": "item", "op": "id", "input": "flags", "rows": 1000},
            ],
        }
    )
    fg = FeatureGenerator(spec, item_cache_size=10)
    a = fg.transform({}, [{"flag": 1, "flags": [1]}])
    b = fg.transform({}, [{"flag": True, "flags": [True]}])
    assert a.fields[0].ids.tolist() == [row_of(1, "xxh64", 1000)]
    assert b.fields[0].ids.tolist() == [row_of("true", "xxh64", 1000)]
    assert b.fields[1].ids.tolist() == [row_of("true", "xxh64", 1000)]


def test_the_item_cache_tells_bools_apart_from_0_and_1():
    """True == 1 and hash(True) == hash(1) in Python, but FG hashes "true" and "1" apart: a cached item
    must never answer for another whose values differ only in that (in a list, at the top level,
    Python's or NumPy's bools)."""
    cands = [
        {"price": 1, "title_terms": [1, "red"], "cat_id": 1},
        {"price": 1, "title_terms": [True, "red"], "cat_id": True},
        {"price": 1, "title_terms": [np.True_, "red"], "cat_id": np.True_},
        {"price": 1, "title_terms": [1, "red"], "cat_id": 1},
    ]
    cached = FeatureGenerator(SPEC, item_cache_size=100)
    for c in cands:  # one at a time: each later one may find an earlier one in the cache
        want = FeatureGenerator(SPEC).transform(REQUEST, [c])
        got = cached.transform(REQUEST, [c])
        assert [f.ids.tolist() for f in got.fields] == [f.ids.tolist() for f in want.fields], c


@pytest.mark.parametrize("cache", [0, 100])
def test_grouped_transform_is_the_per_row_one_once_per_distinct_value_list(cache):
    """``transform(grouped=True)``: a cross and an item field a cross reads come once per distinct value list
    (here 3 of 4 candidates' cat, ``u_x_cat`` and ``match``: the 4th equals the 1st), and ``per_row()`` gives
    the per-candidate batch bit for bit; a field no cross reads stays per candidate."""
    cands = CANDS + [{"price": 3, "title_terms": ["shoes"], "cat_id": 3}]
    fg = FeatureGenerator(SPEC, item_cache_size=cache)
    grouped = fg.transform(REQUEST, cands, grouped=True)
    plain = FeatureGenerator(SPEC, item_cache_size=cache).transform(REQUEST, cands)
    assert plain.segment_of is None and grouped.segment_of is not None
    names = [f.name for f in SPEC.fields]
    of = dict(zip(names, grouped.segment_of))
    assert of["user"] is None and of["price"] is None  # a request field is broadcast; price is read by no cross
    cat = of["cat"].tolist()
    assert cat[0] == cat[3] and cat[1] == cat[4] and len({cat[0], cat[1], cat[2]}) == 3
    assert grouped.fields[names.index("cat")].n == 3 and grouped.fields[names.index("u_x_cat")].n == 3
    assert grouped.fields[names.index("match")].n == 4  # title differs in the 5th: its own group
    expanded = grouped.per_row()
    for f, a, b in zip(names, expanded.fields, plain.fields):
        np.testing.assert_array_equal(a.ids, b.ids, err_msg=f)
        np.testing.assert_array_equal(a.offsets, b.offsets, err_msg=f)
    assert expanded.broadcast == plain.broadcast

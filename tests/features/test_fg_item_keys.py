"""The item cache's keys built column-wise for all candidates (``fast_keys``) against the per-candidate
``_fast_key`` / ``freeze_value`` keys, and the cached transform against the uncached one on edge values."""

import math

import numpy as np
import pytest
from fg_samples import REQUEST, SPEC

from offgraph.features import FeatureGenerator
from offgraph.features.fg import _fast_key, fast_keys, freeze_value


class Text(str):
    pass


# one value per candidate of one item input: plain ones (the fast path) and those needing the per-value checks
PLAIN = [7, "7", 0, -1, 2**70, 1.0, 12.5, -0.0, None, "", "a b"]
PLAIN_LISTS = [[], ["red"], ["red", "shoes"], [1, "1"], [None], [1.5, 7], [math.nan], [2**70]]
NEEDS_CHECKS = [
    True,
    False,
    np.True_,
    math.nan,
    np.float64("nan"),
    np.int64(3),
    b"7",
    Text("7"),
    (1, 2),
    [True],
    [np.False_, "x"],
    [[1]],
    {"a": 1},
]


def columns_of(rows: list[tuple]) -> list[list]:
    return [list(col) for col in zip(*rows)]


def per_candidate(rows: list[tuple]) -> list[tuple]:
    return [_fast_key(iter(r)) for r in rows]


@pytest.mark.parametrize("first", PLAIN + PLAIN_LISTS)
def test_fast_keys_are_the_per_candidate_keys_on_plain_values(first):
    column = PLAIN if not isinstance(first, list) else PLAIN_LISTS
    rows = [(first, v, v + ["x"] if isinstance(v, list) else [v, "x"]) for v in column]
    keys = fast_keys(columns_of(rows))
    assert keys is not None
    assert keys == per_candidate(rows)
    assert all(type(k) is tuple for k in keys)


@pytest.mark.parametrize("odd", NEEDS_CHECKS, ids=repr)
def test_a_value_needing_the_checks_takes_the_per_candidate_keys(odd):
    rows = [(1, ["red"]), (odd, ["red"])]
    assert fast_keys(columns_of(rows)) is None
    if odd is not math.nan:  # a NaN inside a list stays in the key as it is, in both
        rows = [(1, ["red"]), (1, odd if isinstance(odd, list) else [odd])]
        assert fast_keys(columns_of(rows)) is None


def test_lists_and_scalars_mixed_in_one_input_take_the_per_candidate_keys():
    assert fast_keys([["red", ["red"]]]) is None
    assert fast_keys([]) is None


def test_keys_tell_apart_what_fg_hashes_apart():
    """A scalar and its one-value list, a list split across two inputs, 1 and "1": all distinct keys."""
    rows = [("a", ["b", "c"]), (["a"], ["b", "c"]), (["a", "b"], ["c"]), ("1", [1]), (1, ["1"])]
    keys = [fast_keys(columns_of([r]))[0] for r in rows]  # one row a request: each column has one layout
    assert len(set(keys)) == len(rows)
    for r, k in zip(rows, keys):
        assert k == _fast_key(iter(r))


def test_nan_is_no_value_in_both_keys():
    """A NaN candidate takes the exact path; its key is the key of None, as freeze_value's."""
    assert fast_keys([[math.nan]]) is None
    assert _fast_key(iter([math.nan])) == _fast_key(iter([None])) == (freeze_value(math.nan),)


EDGE_CANDS = [
    {"price": 1, "title_terms": [1, "red"], "cat_id": 1},
    {"price": 1, "title_terms": [True, "red"], "cat_id": True},
    {"price": 1.0, "title_terms": ["1", "red"], "cat_id": "1"},
    {"price": math.nan, "title_terms": ["red"], "cat_id": 1},
    {"price": None, "title_terms": ["red"], "cat_id": 1},
    {"price": 2, "title_terms": "red", "cat_id": 1},
    {"price": 2, "title_terms": ["red"], "cat_id": 1},
    {"price": 2, "title_terms": [], "cat_id": np.int64(1)},
    {"price": 2, "title_terms": [], "cat_id": 1},
    {"title_terms": ["red", "red"]},
]


def ids(batch) -> list[list[int]]:
    return [f.ids.tolist() for f in batch.fields]


@pytest.mark.parametrize("seed", range(6))
def test_the_cached_transform_is_the_uncached_one_on_edge_values(seed):
    """Requests of edge candidates in random groups and orders (some all plain: the column-wise keys; some
    not: the per-candidate keys) through one cache give the ids of a generator without one."""
    rng = np.random.default_rng(seed)
    cached = FeatureGenerator(SPEC, item_cache_size=6)
    plain = [c for c in EDGE_CANDS if fast_keys([[c.get(k)] for k in cached._item_inputs]) is not None]
    assert 0 < len(plain) < len(EDGE_CANDS)
    for _ in range(20):
        pool = plain if rng.random() < 0.5 else EDGE_CANDS
        cands = [pool[int(i)] for i in rng.integers(0, len(pool), size=int(rng.integers(1, 8)))]
        assert ids(cached.transform(REQUEST, cands)) == ids(FeatureGenerator(SPEC).transform(REQUEST, cands))


def test_both_paths_share_one_cache_entry():
    """An item cached by a request taking the per-candidate keys is a hit for one taking the column-wise keys."""
    fg = FeatureGenerator(SPEC, item_cache_size=10)
    item = {"price": 3, "title_terms": ["red", "shoes"], "cat_id": 7}
    fg.transform(REQUEST, [item, {"price": 3, "title_terms": [True], "cat_id": 7}])  # a bool: per candidate
    assert (fg.cache_hits, fg.cache_misses) == (0, 2)
    fg.transform(REQUEST, [item])  # all plain: column-wise
    assert (fg.cache_hits, fg.cache_misses) == (1, 2)

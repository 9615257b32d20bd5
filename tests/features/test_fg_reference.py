"""The reference design's worked FG example (Chinese search ads), through the public FG, and the text
segmenters of the tokenize op."""

import numpy as np
import pytest
from fg_samples import REFERENCE_FIELDS

from offgraph.features import FeatureGenerator, FeatureValueError, parse_spec
from offgraph.features.fg import ScopeError
from offgraph.features.hashing import row_of
from offgraph.features.segment import check_segmenters, segmenter_record

SPEC = parse_spec({"model": {"embedding_dim": 16, "mlp": [8]}, "label": "click", "fields": REFERENCE_FIELDS})
REQUEST = {"user_id": "u123", "query": "跑鞋", "hour": 21, "gender": "男"}
ADS = [
    {"ad_id": 9001, "category": 12, "price": 299, "title": ["男", "跑", "鞋", "透气"], "ctr_7d": 0.031},
    {"ad_id": 9002, "category": 15, "price": 1299, "title": ["篮球", "鞋"], "ctr_7d": 0.008},
]


def test_reference_example_values():
    fg = FeatureGenerator(SPEC)
    cols = {k: [REQUEST.get(k, ad.get(k)) for ad in ADS] for k in {*REQUEST, *ADS[0]}}
    vals = fg.values_columns(cols, 2)
    assert vals["query"] == [["跑", "鞋"], ["跑", "鞋"]]
    assert vals["price"] == [["8"], ["10"]]
    assert vals["gender_x_category"] == [["男_12"], ["男_15"]]
    assert vals["query_in_title"] == [["2"], ["1"]]
    batch = fg.transform_columns(cols, 2)
    np.testing.assert_array_equal(batch.dense, np.float32([[0.031], [0.008]]))


def test_reference_example_serving_matches_training():
    fg = FeatureGenerator(SPEC, item_cache_size=16)
    served = fg.transform(REQUEST, ADS)
    cols = {k: [REQUEST.get(k, ad.get(k)) for ad in ADS] for k in {*REQUEST, *ADS[0]}}
    trained = fg.transform_columns(cols, 2)
    for i, f in enumerate(SPEC.fields):
        s, t = served.fields[i], trained.fields[i]
        got = (
            [s.ids[s.offsets[0] : s.offsets[1]].tolist()] * 2
            if served.broadcast[i]
            else [s.ids[s.offsets[r] : s.offsets[r + 1]].tolist() for r in range(2)]
        )
        assert got == [t.ids[t.offsets[r] : t.offsets[r + 1]].tolist() for r in range(2)], f.name
    np.testing.assert_array_equal(served.dense, np.float32([[0.031], [0.008]]))
    q = SPEC.fields[SPEC.field_index("query")]
    assert served.fields[1].ids.tolist() == [row_of("跑", "xxh64", q.rows), row_of("鞋", "xxh64", q.rows)]


@pytest.mark.parametrize(
    "text,terms",
    [
        ("跑鞋 nike air", ["跑", "鞋", "nike", "air"]),
        ("Nike跑鞋,2024款!", ["nike", "跑", "鞋", "2024", "款"]),
        ("ランニング shoes", ["ラ", "ン", "ニ", "ン", "グ", "shoes"]),
        ("  ", []),
    ],
)
def test_cjk_segmenter(text, terms):
    spec = parse_spec(
        {
            "label": "y",
            "fields": [
                {"name": "q", "scope": "request", "op": "tokenize", "input": "q", "segmenter": "cjk", "rows": 10}
            ],
        }
    )
    assert FeatureGenerator(spec).values_columns({"q": [text]}, 1)["q"] == [terms]


def test_whitespace_default_unchanged():
    spec = parse_spec(
        {"label": "y", "fields": [{"name": "q", "scope": "request", "op": "tokenize", "input": "q", "rows": 10}]}
    )
    assert FeatureGenerator(spec).values_columns({"q": ["跑鞋 Nike  air"]}, 1)["q"] == [["跑鞋", "nike", "air"]]


def test_jieba_segmenter_and_its_record():
    spec = parse_spec(
        {
            "label": "y",
            "fields": [
                {"name": "q", "scope": "request", "op": "tokenize", "input": "q", "segmenter": "jieba", "rows": 10}
            ],
        }
    )
    assert FeatureGenerator(spec).values_columns({"q": ["男士透气跑鞋, Nike"]}, 1)["q"] == [
        ["男士", "透气", "跑鞋", "nike"]
    ]
    import jieba

    rec = segmenter_record("jieba")
    assert rec["version"] == jieba.__version__
    check_segmenters(spec, {"q": rec}, "model")  # the same: accepted
    with pytest.raises(ValueError, match="field 'q' was segmented by .*0.39.*this process has"):
        check_segmenters(spec, {"q": {**rec, "version": "0.39"}}, "model")
    with pytest.raises(ValueError, match="segmented by \\{'name': 'whitespace'\\}"):
        check_segmenters(spec, None, "model")  # an old manifest: whitespace


def test_segmenter_spec_errors():
    base = {"name": "q", "scope": "request", "op": "tokenize", "input": "q", "rows": 10}
    with pytest.raises(ValueError, match="segmenter must be one of"):
        parse_spec({"label": "y", "fields": [{**base, "segmenter": "icu"}]})
    with pytest.raises(ValueError, match="'separator' is for the whitespace segmenter"):
        parse_spec({"label": "y", "fields": [{**base, "segmenter": "cjk", "separator": ","}]})


def test_scope_errors_name_the_key_and_where_it_belongs():
    fg = FeatureGenerator(SPEC)
    with pytest.raises(ScopeError, match=r"input 'gender' sent in candidates\[1\]: .*request-scope.*'request'"):
        fg.transform({}, [ADS[0], {**ADS[1], "gender": "男"}])
    with pytest.raises(ScopeError, match=r"input 'title' sent in request: .*item-scope.*each of 'candidates'"):
        fg.transform({**REQUEST, "title": ["鞋"]}, ADS)
    assert issubclass(ScopeError, FeatureValueError)
    batch = fg.transform({**REQUEST, "typo": 1}, [{**ADS[0], "ctr7d": 0.1, "x": 2}, ADS[1]])
    assert batch.ignored_keys == 3


@pytest.mark.parametrize("bad", [True, "abc", [0.1]])
def test_numeric_bad_types_are_errors(bad):
    with pytest.raises(FeatureValueError, match=r"field 'ctr_7d', candidates\[1\]: expected a number"):
        FeatureGenerator(SPEC).transform(REQUEST, [ADS[0], {**ADS[1], "ctr_7d": bad}])


def test_numeric_transforms_and_missing():
    spec = parse_spec(
        {
            "label": "y",
            "fields": [
                {"name": "id", "scope": "item", "op": "id", "input": "id", "rows": 10},
                {
                    "name": "p",
                    "scope": "item",
                    "op": "numeric",
                    "input": "price",
                    "transform": ["clip", "log1p", "standardize"],
                    "clip": [0, 1000],
                    "stats": {"mean": 2.0, "std": 4.0},
                    "missing": -1.5,
                },
            ],
        }
    )
    fg = FeatureGenerator(spec)
    out = fg.transform(
        {},
        [{"price": 299}, {"price": 5000}, {"price": -3}, {}, {"price": None}, {"price": float("nan")}, {"price": "7"}],
    ).dense[:, 0]
    want = [(np.log1p(299) - 2) / 4, (np.log1p(1000) - 2) / 4, (0 - 2) / 4, -1.5, -1.5, -1.5, (np.log1p(7) - 2) / 4]
    np.testing.assert_allclose(out, np.float32(want), rtol=1e-6)


def test_numeric_spec_errors():
    def spec(**kw):
        return parse_spec(
            {
                "label": "y",
                "fields": [
                    {"name": "id", "scope": "item", "op": "id", "input": "id", "rows": 10},
                    {"name": "p", "scope": "item", "op": "numeric", "input": "price", **kw},
                ],
            }
        )

    with pytest.raises(ValueError, match="standardize must be the last step"):
        spec(transform=["standardize", "log1p"])
    with pytest.raises(ValueError, match="clip: \\[lo, hi\\]' goes with the clip step"):
        spec(transform=["log1p"], clip=[0, 1])
    with pytest.raises(ValueError, match="takes no 'rows'"):
        spec(rows=10)
    with pytest.raises(ValueError, match="transform must be a list of distinct steps"):
        spec(transform=["sqrt"])
    with pytest.raises(ValueError, match="input 'p' is a numeric field"):
        parse_spec(
            {
                "label": "y",
                "fields": [
                    {"name": "id", "scope": "item", "op": "id", "input": "id", "rows": 10},
                    {"name": "p", "scope": "item", "op": "numeric", "input": "price"},
                    {"name": "x", "scope": "item", "op": "cross", "inputs": ["id", "p"], "rows": 10},
                ],
            }
        )
    with pytest.raises(ValueError, match="log1p needs a value > -1"):
        FeatureGenerator(spec(transform=["log1p"])).transform({}, [{"price": -2}])

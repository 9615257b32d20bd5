"""A small feature spec with a request and its candidates, shared by the FG tests and the version tests; and the
reference design's worked example's fields (``REFERENCE_FIELDS``), shared by its FG test and the stream trainer's."""

from offgraph.features import parse_spec

SPEC = parse_spec(
    {
        "model": {"embedding_dim": 4, "hash": "xxh64", "mlp": [8]},
        "label": "label",
        "fields": [
            {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 1000},
            {"name": "query", "scope": "request", "op": "tokenize", "input": "query", "rows": 500},
            {"name": "price", "scope": "item", "op": "log_bucket", "input": "price", "base": 2, "rows": 64},
            {"name": "title", "scope": "item", "op": "id", "input": "title_terms", "rows": 800, "pooling": "sum"},
            {"name": "cat", "scope": "item", "op": "id", "input": "cat_id", "rows": 100},
            {"name": "u_x_cat", "scope": "cross", "op": "cross", "inputs": ["user", "cat"], "rows": 5000},
            {
                "name": "match",
                "scope": "cross",
                "op": "match_count",
                "inputs": ["query", "title"],
                "boundaries": [1, 2, 3],
                "rows": 8,
            },
        ],
    }
)

REQUEST = {"user_id": 42, "query": "Red running Shoes", "unknown_key": "ignored"}
CANDS = [
    {"price": 299, "title_terms": ["red", "shoes", "nike"], "cat_id": 7},
    {"price": None, "title_terms": [], "cat_id": 3},
    {"price": 12.5, "title_terms": ["running"]},
    {"price": 299, "title_terms": ["red", "shoes", "nike"], "cat_id": 7},
]


# the reference design's worked example (Chinese search ads): tests/features/test_fg_reference.py
REFERENCE_FIELDS = [
    {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 1000},
    {"name": "query", "scope": "request", "op": "tokenize", "input": "query", "segmenter": "cjk", "rows": 500},
    {"name": "hour", "scope": "request", "op": "id", "input": "hour", "rows": 24},
    {"name": "gender", "scope": "request", "op": "id", "input": "gender", "rows": 8},
    {"name": "ad", "scope": "item", "op": "id", "input": "ad_id", "rows": 1000},
    {"name": "category", "scope": "item", "op": "id", "input": "category", "rows": 100},
    {"name": "price", "scope": "item", "op": "log_bucket", "input": "price", "base": 2, "rows": 64},
    {"name": "title", "scope": "item", "op": "id", "input": "title", "rows": 800},
    {"name": "ctr_7d", "scope": "item", "op": "numeric", "input": "ctr_7d"},
    {"name": "gender_x_category", "scope": "cross", "op": "cross", "inputs": ["gender", "category"], "rows": 500},
    {"name": "query_in_title", "scope": "cross", "op": "match_count", "inputs": ["query", "title"], "rows": 8},
]

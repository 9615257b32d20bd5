"""A small feature spec with a request and its candidates, shared by the FG tests and the version tests."""

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

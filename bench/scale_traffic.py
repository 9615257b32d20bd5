"""Score requests for a synthetic model (``offgraph synth``) whose rows are read with a chosen popularity.

How raw ids reach rows: an ``id`` field stores ``xxh64(str(raw id)) mod rows``. Hashing is a fixed
pseudo-random function, so distinct raw ids land on (almost always) distinct, scattered rows: a
popularity drawn over raw ids *is* the popularity over rows, with the hot rows spread over the
table (as in production, where hot users' rows are nowhere in particular). So:

* ``zipf``: the raw id of a huge-table value is its popularity rank ``k`` in ``[0, rows)``, drawn with
  ``P(k) ~ (k + 1)^-s`` (``s`` = 1.1; a bounded power law sampled by its inverse CDF, vectorized);
* ``uniform``: the raw id is uniform in ``[0, rows)``, so every row is about equally likely (the worst
  case for every cache).

Ranks below ``rows`` keep collisions at the birthday rate of the table (a few per cent of distinct
ids at most share a row), which changes neither distribution measurably. Small tables (country,
hour, ...) get uniform values. One request = a user (request fields) and N candidate items (item
fields, 3 tags each); bodies are serialized beforehand so the client spends no time on them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from exporter.synth_spec import SMALL_TABLES, TAGS_PER_ITEM, huge_table_rows

POPULARITIES = ("zipf", "uniform")
ZIPF_EXPONENT = 1.1


def draw_ids(rng: np.random.Generator, n_rows: int, size, popularity: str, exponent: float = ZIPF_EXPONENT):
    """Raw ids in ``[0, n_rows)`` with the given popularity (see the module docstring)."""
    if popularity == "uniform":
        return rng.integers(0, n_rows, size=size)
    if popularity != "zipf":
        raise ValueError(f"popularity must be one of {POPULARITIES}, got {popularity!r}")
    if not exponent > 1:
        raise ValueError(f"the Zipf exponent must be > 1, got {exponent}")
    u = rng.random(size)
    a = 1.0 - exponent  # inverse CDF of the density x^-s on [1, n + 1)
    x = ((np.power(n_rows + 1.0, a) - 1.0) * u + 1.0) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, n_rows - 1)


def _small_value(rng: np.random.Generator, name: str, op: str, rows: int, size: int):
    if op == "log_bucket":
        return np.round(rng.lognormal(3.0, 1.5, size), 2)
    if op == "bucketize":
        return rng.integers(0, 400, size)
    return rng.integers(0, rows, size)


def build_requests(total_rows: int, n_requests: int, n_candidates: int, popularity: str, seed: int = 0,
                   exponent: float = ZIPF_EXPONENT) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``n_requests`` pairs ``(request, candidates)`` for the synthetic spec of ``total_rows`` rows."""
    rng = np.random.default_rng([seed, POPULARITIES.index(popularity) if popularity in POPULARITIES else 9])
    huge = huge_table_rows(total_rows)
    req_small = [(n, op, r) for n, scope, op, r, _ in SMALL_TABLES if scope == "request"]
    item_small = [(n, op, r) for n, scope, op, r, _ in SMALL_TABLES if scope == "item"]
    users = draw_ids(rng, huge["user_id"], n_requests, popularity, exponent)
    nc = n_requests * n_candidates
    items = draw_ids(rng, huge["item_id"], nc, popularity, exponent)
    authors = draw_ids(rng, huge["author_id"], nc, popularity, exponent)
    tags = draw_ids(rng, huge["item_tags"], (nc, TAGS_PER_ITEM), popularity, exponent)
    rs = {n: _small_value(rng, n, op, r, n_requests).tolist() for n, op, r in req_small}
    cs = {n: _small_value(rng, n, op, r, nc).tolist() for n, op, r in item_small}
    items, authors, tags = items.tolist(), authors.tolist(), tags.tolist()
    out = []
    for i in range(n_requests):
        request = {"user_id": int(users[i]), **{n: v[i] for n, v in rs.items()}}
        cands = []
        for j in range(i * n_candidates, (i + 1) * n_candidates):
            cands.append({"item_id": items[j], "author_id": authors[j], "item_tags": tags[j],
                          **{n: v[j] for n, v in cs.items()}})
        out.append((request, cands))
    return out


def bodies(requests) -> list[bytes]:
    """The JSON score bodies of :func:`build_requests`' pairs."""
    return [orjson.dumps({"request": r, "candidates": c}) for r, c in requests]

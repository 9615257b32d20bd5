"""The traffic model: score requests for a synthetic model (``offgraph synth``) whose rows are read with a
chosen popularity. ``offgraph plan`` (``offgraph.export.plan``) and the cache simulation
(``offgraph.export.cache_sim``) replay it; the benches (``bench/scale.py`` and the others, through
``bench/lib/traffic.py``) send it to a server.

How raw ids reach rows: an ``id`` field stores ``xxh64(str(raw id)) mod rows``. Hashing is a fixed
pseudo-random function, so distinct raw ids land on (almost always) distinct, scattered rows: a
popularity drawn over raw ids *is* the popularity over rows, with the hot rows spread over the
table (as in production, where hot users' rows are nowhere in particular). So:

* ``zipf``: the raw id of a huge-table value is its popularity rank ``k`` in ``[0, rows)``, drawn with
  ``P(k) ~ (k + 1)^-s`` (``s`` = 1.1; a bounded power law sampled by its inverse CDF, vectorized);
* ``uniform``: the raw id is uniform in ``[0, rows)``, so every row is about equally likely (the worst
  case for every cache).

Ranks below ``rows`` keep collisions at the birthday rate of the table (a few per cent of distinct
ids at most share a row), which changes neither distribution measurably.

Users and items are drawn with the popularity; an item's other features are fixed functions of
its id, as in a catalogue: its author and its 3 tags are ranks of the same popularity drawn
from a hash of (item id, attribute) (so popular items bring their authors and tags along), its
category, brand, price and age a hash of (item id, attribute) too. A popular item therefore
repeats with the same features (the server's FG item cache sees it again). Small request
tables (country, hour, ...) get uniform values. One request = a user and N candidate items;
the benches serialize bodies beforehand (``bench.lib.traffic.bodies``) so the client spends no time on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from offgraph.export.synth_spec import SMALL_TABLES, TAGS_PER_ITEM, huge_table_rows
from offgraph.store.keys import splitmix64

POPULARITIES = ("zipf", "uniform")
ZIPF_EXPONENT = 1.1


def ranks(u: np.ndarray, n_rows: int, popularity: str, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    """Raw ids in ``[0, n_rows)`` with the given popularity, from uniforms ``u`` in [0, 1) (inverse CDF)."""
    if popularity == "uniform":
        return np.minimum((u * n_rows).astype(np.int64), n_rows - 1)
    if popularity != "zipf":
        raise ValueError(f"popularity must be one of {POPULARITIES}, got {popularity!r}")
    if not exponent > 1:
        raise ValueError(f"the Zipf exponent must be > 1, got {exponent}")
    a = 1.0 - exponent  # inverse CDF of the density x^-s on [1, n + 1)
    x = ((np.power(n_rows + 1.0, a) - 1.0) * u + 1.0) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, n_rows - 1)


def draw_ids(rng: np.random.Generator, n_rows: int, size, popularity: str, exponent: float = ZIPF_EXPONENT):
    """Raw ids in ``[0, n_rows)`` drawn with the given popularity (see the module docstring)."""
    return ranks(rng.random(size), n_rows, popularity, exponent)


def item_uniform(item_ids: np.ndarray, attribute: int) -> np.ndarray:
    """A uniform in [0, 1) fixed by (item id, attribute): an item's features are functions of its id."""
    z = splitmix64(np.asarray(item_ids, dtype=np.uint64) * np.uint64(64) + np.uint64(attribute))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _small_value(u: np.ndarray, op: str, rows: int):
    """A small table's raw value from uniforms ``u``."""
    if op == "log_bucket":  # a price: log-uniform in [1, 10^4)
        return np.round(10.0 ** (4 * u), 2)
    if op == "bucketize":  # an age in days
        return (u * 400).astype(np.int64)
    return (u * rows).astype(np.int64)


def draw_columns(
    total_rows: int, n_requests: int, n_candidates: int, popularity: str, seed: int = 0, exponent: float = ZIPF_EXPONENT
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The raw inputs of :func:`build_requests` as columns: request fields ``[n_requests]`` and candidate
    fields ``[n_requests * n_candidates]`` (``item_tags``: ``[.., TAGS_PER_ITEM]``), request after request."""
    rng = np.random.default_rng([seed, POPULARITIES.index(popularity) if popularity in POPULARITIES else 9])
    huge = huge_table_rows(total_rows)
    req_small = [(n, op, r) for n, scope, op, r, _ in SMALL_TABLES if scope == "request"]
    item_small = [(n, op, r) for n, scope, op, r, _ in SMALL_TABLES if scope == "item"]
    users = draw_ids(rng, huge["user_id"], n_requests, popularity, exponent)
    nc = n_requests * n_candidates
    items = draw_ids(rng, huge["item_id"], nc, popularity, exponent)
    authors = ranks(item_uniform(items, 0), huge["author_id"], popularity, exponent)
    tags = np.stack(
        [ranks(item_uniform(items, 1 + k), huge["item_tags"], popularity, exponent) for k in range(TAGS_PER_ITEM)],
        axis=1,
    )
    rs = {n: _small_value(rng.random(n_requests), op, r) for n, op, r in req_small}
    cs = {n: _small_value(item_uniform(items, 8 + k), op, r) for k, (n, op, r) in enumerate(item_small)}
    return {"user_id": users, **rs}, {"item_id": items, "author_id": authors, "item_tags": tags, **cs}


def build_requests(
    total_rows: int, n_requests: int, n_candidates: int, popularity: str, seed: int = 0, exponent: float = ZIPF_EXPONENT
) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``n_requests`` pairs ``(request, candidates)`` for the synthetic spec of ``total_rows`` rows."""
    req, cand = draw_columns(total_rows, n_requests, n_candidates, popularity, seed, exponent)
    users = req.pop("user_id")
    items, authors, tags = (cand.pop(n).tolist() for n in ("item_id", "author_id", "item_tags"))
    rs = {n: v.tolist() for n, v in req.items()}
    cs = {n: v.tolist() for n, v in cand.items()}
    out = []
    for i in range(n_requests):
        request = {"user_id": int(users[i]), **{n: v[i] for n, v in rs.items()}}
        cands = []
        for j in range(i * n_candidates, (i + 1) * n_candidates):
            cands.append(
                {"item_id": items[j], "author_id": authors[j], "item_tags": tags[j], **{n: v[j] for n, v in cs.items()}}
            )
        out.append((request, cands))
    return out

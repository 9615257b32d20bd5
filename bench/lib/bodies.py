"""Score bodies of real MovieLens requests, serialized beforehand so that a client spends no time on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REQUEST_INPUTS = ["user_id", "age", "gender", "occupation", "zip_prefix"]
ITEM_INPUTS = ["movie_id", "genres", "title_words", "release_year"]


def candidate_rows(rng: np.random.Generator, movies: int, n: int) -> np.ndarray:
    """N distinct movies; past the catalogue (MovieLens-100k has fewer movies than a large N), every movie
    once and the rest drawn again, distinct among themselves: the request repeats some candidates."""
    if n <= movies:
        return rng.choice(movies, n, replace=False)
    return np.concatenate([rng.permutation(movies), candidate_rows(rng, movies, n - movies)])


def build_bodies(data: Path, sizes: list[int], per_size: int, seed: int) -> dict[int, list[bytes]]:
    """Serialized score bodies per N: real requests (grouped by request_id) x N real movies (``candidate_rows``)."""
    import pyarrow.parquet as pq

    cols = pq.read_table(data, columns=REQUEST_INPUTS + ITEM_INPUTS + ["request_id"]).to_pydict()
    first: dict[str, int] = {}
    items: dict[int, dict] = {}
    for i, (rid, mid) in enumerate(zip(cols["request_id"], cols["movie_id"])):
        first.setdefault(rid, i)
        if mid not in items:
            items[mid] = {c: cols[c][i] for c in ITEM_INPUTS}
    movies = list(items.values())
    rng = np.random.default_rng(seed)
    groups = list(first.values())
    out = {}
    for n in sizes:
        bodies = []
        for g in rng.choice(len(groups), per_size, replace=False):
            req = {c: cols[c][groups[g]] for c in REQUEST_INPUTS}
            cands = [movies[j] for j in candidate_rows(rng, len(movies), n)]
            bodies.append(json.dumps({"request": req, "candidates": cands}, separators=(",", ":")).encode())
        out[n] = bodies
    return out


def ids_only_bodies(spec, bodies: list[bytes]) -> list[bytes]:
    """The same bodies with only the ids the feature join needs (``spec`` declares feature tables)."""
    from offgraph.feature_tables.join import ids_only

    out = []
    for b in bodies:
        d = json.loads(b)
        r, c = ids_only(spec, d["request"], d["candidates"])
        out.append(json.dumps({"request": r, "candidates": c}, separators=(",", ":")).encode())
    return out

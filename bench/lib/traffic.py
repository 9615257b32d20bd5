"""The benches' traffic: the requests of the package's traffic model (``offgraph.export.traffic``, which
``offgraph plan`` replays), serialized into score bodies beforehand so the client spends no time on them.

The model itself (``build_requests``, ``draw_columns``, the popularities, ...) is re-exported here for the
benches and tests that import it from this module; its one definition is in the package."""

from __future__ import annotations

import orjson

from offgraph.export.traffic import (
    POPULARITIES,
    ZIPF_EXPONENT,
    build_requests,
    draw_columns,
    draw_ids,
    item_uniform,
    ranks,
)

__all__ = [
    "POPULARITIES",
    "ZIPF_EXPONENT",
    "bodies",
    "build_requests",
    "draw_columns",
    "draw_ids",
    "item_uniform",
    "ranks",
]


def bodies(requests) -> list[bytes]:
    """The JSON score bodies of :func:`build_requests`' pairs."""
    return [orjson.dumps({"request": r, "candidates": c}) for r, c in requests]

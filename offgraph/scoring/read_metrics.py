"""The scorer's own Prometheus metric: the wall time of a request's store read.

It is defined here, not in ``offgraph.server.process.metrics``, so that the library scorer imports no HTTP code;
each app's registry registers it (multiprocess mode: every worker's samples).
"""

from __future__ import annotations

from prometheus_client import Histogram

STORE_READ_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    1.0,
)

STORE_READ_SECONDS = Histogram(
    "offgraph_store_read_seconds",
    "Wall time of a score request's store read (its row-cache misses, split over the "
    "store's read threads); requests that read nothing from the store are not counted",
    ["model"],
    buckets=STORE_READ_BUCKETS,
    registry=None,
)
"""Observed by the scorer (its store reads); each app's registry shows it (multiprocess mode: every worker's)."""

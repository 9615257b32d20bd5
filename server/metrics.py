"""Prometheus metrics of one app, in its own CollectorRegistry.

Request-path metrics are observed by the score endpoint; store and model figures
are read from the model registry (``Scorer.stats()``) at scrape time; HTTP
errors are counted by status code by a small ASGI middleware.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.registry import ModelRegistry

START_KEY = "offgraph.t0"
"""ASGI scope key: perf_counter() when the request reached the app (set by HttpMetricsMiddleware)."""

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.012, 0.015, 0.020, 0.030,
                   0.050, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
CANDIDATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 300, 500, 1000, 2000, 5000)


class ServerMetrics:
    def __init__(self, models: ModelRegistry):
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram("offgraph_request_latency_seconds",
                                 "Score request latency per model, from the request reaching the app to the "
                                 "scores being ready (body read, validation, queueing, scoring)",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.candidates = Histogram("offgraph_candidates_per_request", "Candidates per score request",
                                    ["model"], buckets=CANDIDATE_BUCKETS, registry=self.registry)
        self.errors = Counter("offgraph_http_errors", "HTTP responses with a 4xx or 5xx status, by code",
                              ["code"], registry=self.registry)
        self.registry.register(_ModelCollector(models))

    def observe_score(self, model: str, n_candidates: int, seconds: float) -> None:
        self.latency.labels(model).observe(seconds)
        self.candidates.labels(model).observe(n_candidates)


class _ModelCollector:
    """Loaded versions and cumulative store counters, read from the registry at scrape time."""

    def __init__(self, models: ModelRegistry):
        self.models = models

    def describe(self):
        return []

    def collect(self):
        version = GaugeMetricFamily("offgraph_model_loaded_version", "Model version being served (0: none)",
                                    labels=["model"])
        rows = CounterMetricFamily("offgraph_store_rows_read", "Rows read from the embedding store "
                                   "(row-cache misses that went to RocksDB)", labels=["model"])
        hits = CounterMetricFamily("offgraph_row_cache_hits", "Row-cache hits", labels=["model"])
        misses = CounterMetricFamily("offgraph_row_cache_misses", "Row-cache misses", labels=["model"])
        ratio = GaugeMetricFamily("offgraph_row_cache_hit_ratio", "Row-cache hits / lookups since start",
                                  labels=["model"])
        catch_ups = CounterMetricFamily("offgraph_store_catch_ups", "Catch-ups of the store with the live writer",
                                        labels=["model"])
        changes = CounterMetricFamily("offgraph_store_changes_applied", "Row changes seen by the served store",
                                      labels=["model"])
        fresh = GaugeMetricFamily("offgraph_store_freshness_seconds", "Seconds since the store last caught up "
                                  "with the live writer", labels=["model"])
        failures = CounterMetricFamily("offgraph_model_load_failures", "Versions refused at load",
                                       labels=["model"])
        now = time.time()
        for h in self.models.all():
            v, c = h.counters()
            version.add_metric([h.name], v or 0)
            failures.add_metric([h.name], self.models.load_failures.get(h.name, 0))
            rows.add_metric([h.name], c.get("store_rows_read", 0))
            hits.add_metric([h.name], c.get("cache_hits", 0))
            misses.add_metric([h.name], c.get("cache_misses", 0))
            total = c.get("cache_hits", 0) + c.get("cache_misses", 0)
            ratio.add_metric([h.name], c.get("cache_hits", 0) / total if total else 0.0)
            catch_ups.add_metric([h.name], c.get("catch_ups", 0))
            changes.add_metric([h.name], c.get("changes_applied", 0))
            if c.get("last_catch_up_unix"):
                fresh.add_metric([h.name], now - c["last_catch_up_unix"])
        yield from (version, rows, hits, misses, ratio, catch_ups, changes, fresh, failures)


class HttpMetricsMiddleware:
    """Pure ASGI: stamps the request start time into the scope and counts 4xx/5xx responses by code
    (except /readyz's 503 before the models are loaded: that is an answer, not an error)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/readyz":
            await self.app(scope, receive, send)
            return
        scope[START_KEY] = time.perf_counter()
        errors = self.metrics.errors

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                errors.labels(str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, send_counting)

"""Prometheus metrics of one app, in its own CollectorRegistry.

Request-path metrics are observed by the score endpoint; store and model figures
are read from the model registry (``Scorer.stats()``) at scrape time; HTTP
errors are counted by status code by a small ASGI middleware.

With several worker processes (``serve --workers N``) prometheus_client runs in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by ``server.workers``): every
worker writes its samples there and a scrape, answered by any worker, sums them.
The model figures are then published by each worker a few times a second
(``publish``) instead of being read at scrape time: counters summed over the
workers, the loaded version as the highest, freshness as the stalest worker's.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.registry import ModelRegistry

START_KEY = "offgraph.t0"
"""ASGI scope key: perf_counter() when the request reached the app (set by HttpMetricsMiddleware)."""

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.012, 0.015, 0.020, 0.030,
                   0.050, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
CANDIDATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 300, 500, 1000, 2000, 5000)


class ServerMetrics:
    def __init__(self, models: ModelRegistry, multiprocess: bool = False):
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess
        self.latency = Histogram("offgraph_request_latency_seconds",
                                 "Score request latency per model, from the request reaching the app to the "
                                 "scores being ready (body read, validation, queueing, scoring)",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.candidates = Histogram("offgraph_candidates_per_request", "Candidates per score request",
                                    ["model"], buckets=CANDIDATE_BUCKETS, registry=self.registry)
        self.errors = Counter("offgraph_http_errors", "HTTP responses with a 4xx or 5xx status, by code",
                              ["code"], registry=self.registry)
        if multiprocess:
            self.publisher: _ModelPublisher | None = _ModelPublisher(models, self.registry)
        else:
            self.publisher = None
            self.registry.register(_ModelCollector(models))

    def render(self) -> bytes:
        """The exposition text: this process's registry, or every worker's samples in multiprocess mode."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)

    def publish(self) -> None:
        """Multiprocess mode: write this worker's model figures (no-op otherwise)."""
        if self.publisher is not None:
            self.publisher.publish()

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


class _ModelPublisher:
    """The figures of ``_ModelCollector`` as multiprocess-mode metrics, written by ``publish``."""

    COUNTERS = {"store_rows_read": "Rows read from the embedding store (row-cache misses that went to RocksDB)",
                "cache_hits": "Row-cache hits", "cache_misses": "Row-cache misses",
                "catch_ups": "Catch-ups of the store with the live writer",
                "changes_applied": "Row changes seen by the served store"}
    NAMES = {"store_rows_read": "offgraph_store_rows_read", "cache_hits": "offgraph_row_cache_hits",
             "cache_misses": "offgraph_row_cache_misses", "catch_ups": "offgraph_store_catch_ups",
             "changes_applied": "offgraph_store_changes_applied"}

    def __init__(self, models: ModelRegistry, registry: CollectorRegistry):
        self.models = models
        self.counters = {k: Counter(self.NAMES[k], doc, ["model"], registry=registry)
                         for k, doc in self.COUNTERS.items()}
        self.failures = Counter("offgraph_model_load_failures", "Versions refused at load", ["model"],
                                registry=registry)
        self.version = Gauge("offgraph_model_loaded_version", "Model version being served (0: none; the highest "
                             "over the workers)", ["model"], multiprocess_mode="livemax", registry=registry)
        self.fresh = Gauge("offgraph_store_freshness_seconds", "Seconds since the store last caught up with the "
                           "live writer (the stalest worker)", ["model"], multiprocess_mode="livemax",
                           registry=registry)
        self.ratio = Gauge("offgraph_row_cache_hit_ratio", "Row-cache hits / lookups since start, per worker "
                           "(pid label)", ["model"], multiprocess_mode="liveall", registry=registry)
        self._done: dict[tuple[str, str], float] = {}  # counts already added, per (model, counter)

    def publish(self) -> None:
        now = time.time()
        for h in self.models.all():
            v, c = h.counters()
            c = {**c, "load_failures": self.models.load_failures.get(h.name, 0)}
            for k, counter in [*self.counters.items(), ("load_failures", self.failures)]:
                value = float(c.get(k, 0) or 0)
                delta = value - self._done.get((h.name, k), 0.0)
                child = counter.labels(h.name)  # listed (at 0) from the start
                if delta > 0:
                    child.inc(delta)
                    self._done[(h.name, k)] = value
            self.version.labels(h.name).set(v or 0)
            total = c.get("cache_hits", 0) + c.get("cache_misses", 0)
            self.ratio.labels(h.name).set(c.get("cache_hits", 0) / total if total else 0.0)
            if c.get("last_catch_up_unix"):
                self.fresh.labels(h.name).set(now - c["last_catch_up_unix"])


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

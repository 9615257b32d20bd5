"""Prometheus metrics of one app, in its own CollectorRegistry.

Request-path metrics are observed by the score endpoint; store and model figures
are read from the model registry (``Scorer.stats()``) at scrape time; HTTP
errors are counted by status code, route template and model by a small ASGI middleware. The
process's own ``process_*`` and ``python_*`` series: ``offgraph.server.process.process_metrics``.

With several worker processes (``serve --workers N``) prometheus_client runs in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by ``offgraph.server.process.workers``): every
worker writes its samples there and a scrape, answered by any worker, sums them.
The model figures are then published by each worker a few times a second
(``publish``) instead of being read at scrape time: counters summed over the
workers, the loaded version as the highest, freshness as the stalest worker's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.routing import Match

from offgraph.features.vocabulary import VOCABULARY_UNKNOWN
from offgraph.scoring.read_metrics import STORE_READ_SECONDS
from offgraph.server.http.route_match import leaf_routes
from offgraph.server.process.graceful_stop import draining
from offgraph.server.process.process_metrics import (
    ProcessPublisher,
    register_platform_collector,
    register_process_collectors,
)

if TYPE_CHECKING:  # the registry imports the scorer; the library scorer loads no HTTP code
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from offgraph.server.models.registry import ModelRegistry

START_KEY = "offgraph.t0"
"""ASGI scope key: perf_counter() when the request reached the app (set by HttpMetricsMiddleware)."""

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.004,
    0.005,
    0.006,
    0.008,
    0.010,
    0.012,
    0.015,
    0.020,
    0.030,
    0.050,
    0.075,
    0.1,
    0.2,
    0.5,
    1.0,
    2.5,
)
GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
CANDIDATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 300, 500, 1000, 2000, 5000)
SCORE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0, 2.0, 5.0, 10.0)
"""Scores served: CTRs in [0, 1] (most far below 0.5), and ranking scores, which may go beyond 1."""
ARM_LABELS = ["model", "version", "arm"]
"""Per-arm series: a served model, the version that answered (empty: the prior arm, or unknown for an error)
and the experiment's arm (``offgraph.server.models.experiment``: at most MAX_ARMS a model, ``none`` outside one)."""

# error labels take bounded values whatever the clients send: scanners' paths and made-up model
# names would otherwise each make a new series
UNMATCHED_ROUTE = "unmatched"
UNKNOWN_MODEL = "unknown"
MODEL_PARAM = "name"
"""The path parameter that names the model in the routes that have one."""


class ServerMetrics:
    def __init__(self, models: ModelRegistry, multiprocess: bool = False):
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess
        self.latency = Histogram(
            "offgraph_request_latency_seconds",
            "Score request latency per model, from the request reaching the app to the "
            "scores being ready (body read, validation, queueing, scoring)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.candidates = Histogram(
            "offgraph_candidates_per_request",
            "Candidates per score request",
            ["model"],
            buckets=CANDIDATE_BUCKETS,
            registry=self.registry,
        )
        self.gc_pause = Histogram(
            "offgraph_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector (each holds the GIL: every request of the process waits)",
            ["generation"],
            buckets=GC_BUCKETS,
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            "offgraph_event_loop_lag_seconds",
            "How late the event loop ran a 50-ms timer (a blocked loop delays every in-flight request)",
            buckets=GC_BUCKETS,
            registry=self.registry,
        )
        self.arm_requests = Counter(
            "offgraph_arm_requests",
            "Score requests answered, by model, version that answered and experiment arm (none: outside one)",
            ARM_LABELS,
            registry=self.registry,
        )
        self.arm_errors = Counter(
            "offgraph_arm_errors",
            "Score requests that failed once their arm was chosen (the version not serving, a store failure...), by "
            "model, version the arm names (empty when unknown) and arm",
            ARM_LABELS,
            registry=self.registry,
        )
        self.arm_latency = Histogram(
            "offgraph_arm_latency_seconds",
            "Score request latency (as offgraph_request_latency_seconds) by model, version and arm",
            ARM_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.arm_scores = Histogram(
            "offgraph_arm_scores",
            "Scores served, one observation per candidate, by model, version and arm",
            ARM_LABELS,
            buckets=SCORE_BUCKETS,
            registry=self.registry,
        )
        self.unassigned = Counter(
            "offgraph_experiment_unassigned",
            "Requests to a model with an experiment that carried no value for its sticky key (served by the first arm)",
            ["model"],
            registry=self.registry,
        )
        self.served_log_dropped = Counter(
            "offgraph_served_log_dropped",
            "Sampled served-request records not logged: the log's queue was full (its writer behind) or a batch "
            "could not be written (offgraph.server.process.served_log); the requests were answered all the same",
            ["model"],
            registry=self.registry,
        )
        self.served_log_written = Counter(
            "offgraph_served_log_records",
            "Served-request records written to the served log",
            ["model"],
            registry=self.registry,
        )
        self.errors = Counter(
            "offgraph_http_errors",
            "HTTP responses with a 4xx or 5xx status, by code, route template (unmatched: no route) and model "
            "(gRPC calls not OK too: code the status name, route the method's full name) "
            f"(a served model's name, {UNKNOWN_MODEL!r} for any other name, empty on routes without one)",
            ["code", "route", "model"],
            registry=self.registry,
        )
        self.draining = Gauge(
            "offgraph_server_draining",
            "1 once the server got its stop signal (SIGTERM/SIGINT): /readyz answers 503 while it drains, then it "
            "stops (with several workers: the most of any worker)",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.models = models
        self.registry.register(STORE_READ_SECONDS)
        if multiprocess:
            self.publisher: _ModelPublisher | None = _ModelPublisher(models, self.registry)
            self.process: ProcessPublisher | None = ProcessPublisher(self.registry)
        else:
            self.publisher = self.process = None
            self.registry.register(_ModelCollector(models))
            register_process_collectors(self.registry)

    def render(self) -> bytes:
        """The exposition text: this process's registry, or every worker's samples in multiprocess mode."""
        self.draining.set(float(draining()))
        if not self.multiprocess:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        register_platform_collector(registry)
        return generate_latest(registry)

    def publish(self) -> None:
        """Multiprocess mode: write this worker's model and process figures (no-op otherwise)."""
        if self.multiprocess:
            self.draining.set(float(draining()))
        if self.publisher is not None:
            self.publisher.publish()
        if self.process is not None:
            self.process.publish()

    def count_error(self, status: int, scope: Scope) -> None:
        """One 4xx/5xx answer to the request of ``scope``."""
        route, name = route_of(scope)
        self.count_error_on(str(status), route, name)

    def count_error_on(self, code: str, route: str, name: str | None) -> None:
        """One error answer on ``route`` (a route template, or a gRPC method's full name, whose ``code`` is its
        status name: ``INVALID_ARGUMENT``) for the model named ``name`` (None: the route names none). Bounded:
        the routes and methods are the server's, a name not served is ``UNKNOWN_MODEL``."""
        model = "" if name is None else name if name in self.models.holders else UNKNOWN_MODEL
        self.errors.labels(code, route, model).inc()

    def observe_score(self, model: str, n_candidates: int, seconds: float) -> None:
        self.latency.labels(model).observe(seconds)
        self.candidates.labels(model).observe(n_candidates)

    def observe_arm(self, model: str, version: int | None, arm: str, seconds: float, scores) -> None:
        """One answered request of ``arm``: its latency and each of its ``scores`` (an array; columnar: one
        increment a bucket, not one observation a candidate)."""
        labels = (model, "" if version is None else str(version), arm)
        self.arm_requests.labels(*labels).inc()
        self.arm_latency.labels(*labels).observe(seconds)
        observe_many(self.arm_scores.labels(*labels), scores, SCORE_BUCKETS)

    def count_arm_error(self, model: str, version: int | None, arm: str) -> None:
        self.arm_errors.labels(model, "" if version is None else str(version), arm).inc()


def observe_many(child, values, buckets: tuple[float, ...]) -> None:
    """``child.observe(v)`` for each of ``values`` (a NumPy array), one increment a bucket: prometheus_client's
    histogram holds a (non-cumulative) count per bucket, ``+Inf`` last, and a sum (``Histogram.observe``)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return
    # side="left": a value equal to a bound falls in that bound's bucket (le is "less or equal")
    counts = np.bincount(np.searchsorted(np.asarray(buckets), values, side="left"), minlength=len(buckets) + 1)
    for i in np.flatnonzero(counts):
        child._buckets[i].inc(float(counts[i]))
    child._sum.inc(float(values.sum()))


FRESHNESS_HELP = "Seconds since the served rows last included everything the live writer had written"
MODEL_COUNTERS = {  # cumulative figure of a model (``ModelHolder.counters()``) -> (metric name, help)
    "store_rows_read": (
        "offgraph_store_rows_read",
        "Rows read from the embedding store (row-cache misses that went to RocksDB)",
    ),
    "cache_hits": ("offgraph_row_cache_hits", "Row-cache hits"),
    "cache_misses": ("offgraph_row_cache_misses", "Row-cache misses"),
    "catch_ups": ("offgraph_store_catch_ups", "Catch-ups of the store's RocksDB view with the live writer"),
    "changes_applied": (
        "offgraph_store_changes_applied",
        "Row-cache keys invalidated when a feed epoch the store view covers was released",
    ),
    "feed_hits": ("offgraph_feed_rows_served", "Rows served from the live writer's feed (fresher than the store view)"),
    "rows_written_through": (
        "offgraph_row_cache_rows_written_through",
        "Streamed rows put into the row cache at their newest value when their feed epoch "
        "was released (not read from disk again)",
    ),
    "block_cache_hits": (
        "offgraph_block_cache_hits",
        "RocksDB block-cache hits (data, index and filter blocks) of the store reads",
    ),
    "block_cache_misses": ("offgraph_block_cache_misses", "RocksDB block-cache misses (blocks read from the files)"),
    "load_failures": ("offgraph_model_load_failures", "Versions refused at load"),
    "ignored_keys": (
        "offgraph_ignored_keys",
        "Raw keys of scored requests and candidates that the model does not "
        "read (ignored by design; a rise shows a misspelt or renamed input)",
    ),
    "unknown_candidates": (
        "offgraph_unknown_candidates",
        "Candidates whose key has no row in the model's item "
        "feature table (scored with no stored features; a rise shows a catalog not loaded)",
    ),
    "unusable_feature_rows": (
        "offgraph_unusable_feature_rows",
        "Stored feature-table rows (one per request or "
        "candidate) that FG refuses, scored as unknown keys (offgraph/feature_tables/join.py; the log "
        "names them)",
    ),
    "candidate_cache_hits": (
        "offgraph_candidate_cache_hits",
        "Candidates scored from the candidate cache (held from their bytes as sent: not decoded, joined or keyed again)",
    ),
    "candidate_cache_misses": (
        "offgraph_candidate_cache_misses",
        "Candidates the candidate cache did not hold when a request looked them up",
    ),
}

VOCABULARY_UNKNOWN_METRIC = (
    "offgraph_vocabulary_unknown",
    "Values of a vocabulary field that its vocabulary does not hold, scored on the field's unknown row "
    "(an item's once while the item cache holds it; a rise shows ids newer than the vocabulary)",
)


def _vocabulary_figures(models: ModelRegistry):
    """Per model and vocabulary field with unknown values: (name, field, count)."""
    for h in models.all():
        _, c = h.counters()
        for k, v in sorted(c.items()):
            if k.startswith(VOCABULARY_UNKNOWN):
                yield h.name, k[len(VOCABULARY_UNKNOWN) :], v


VOCABULARY_FREE_METRIC = (
    "offgraph_vocabulary_free_rows",
    "Rows a vocabulary field with a capacity has left for appended ids (the default version's, as this server last "
    "read its appends): at 0, ids new to the vocabulary stay on the unknown row until the next version",
)


def _vocabulary_free_figures(models: ModelRegistry):
    """Per model and vocabulary field with a capacity: (name, field, free rows) of the default version."""
    for h in models.all():
        for field, free in sorted(h.vocabulary_free().items()):
            yield h.name, field, free


def _model_figures(models: ModelRegistry):
    """Per model: (name, loaded version or 0, {MODEL_COUNTERS key: value}, hit ratio, freshness s or None)."""
    now = time.time()
    for h in models.all():
        v, c = h.counters()
        counts = {k: c.get(k, 0) or 0 for k in MODEL_COUNTERS}
        counts["load_failures"] = models.load_failures.get(h.name, 0)
        total = counts["cache_hits"] + counts["cache_misses"]
        ratio = counts["cache_hits"] / total if total else 0.0
        fresh = now - c["last_feed_poll_unix"] if c.get("last_feed_poll_unix") else None
        yield h.name, v or 0, counts, ratio, fresh


LABEL_VERSION = (
    "offgraph_model_label_version",
    "Version a model's label names (PUT /v1/models/{name}/labels/{label}), served beside the default one",
)


def _label_figures(models: ModelRegistry):
    """Per model and label: (name, label, version)."""
    for h in models.all():
        for label, v in sorted(h.labels.copy().items()):
            yield h.name, label, v


MEMORY_BUDGET = (
    "offgraph_memory_budget_bytes",
    "Bytes each part of a model's memory budget may hold in a worker "
    "(--memory-mb split: row_cache, block_cache, item_cache estimated, feed)",
)
MEMORY_USED = (
    "offgraph_memory_used_bytes",
    "Bytes each part of a model's memory budget holds now (the row cache's "
    "arena, RocksDB's block-cache usage, FG items held at an estimated size, the feed's mapped epochs)",
)


def _memory_figures(models: ModelRegistry):
    """Per serving model and part: (name, part, budget bytes, bytes in use)."""
    for h in models.all():
        mem = h.memory()
        if mem is not None:
            for part, budget in mem["budget_bytes"].items():
                yield h.name, part, budget, mem["used_bytes"][part]


class _ModelCollector:
    """Loaded versions and cumulative store counters, read from the registry at scrape time."""

    def __init__(self, models: ModelRegistry):
        self.models = models

    def describe(self):
        return []

    def collect(self):
        version = GaugeMetricFamily(
            "offgraph_model_loaded_version", "Model version being served (0: none)", labels=["model"]
        )
        counters = {k: CounterMetricFamily(name, doc, labels=["model"]) for k, (name, doc) in MODEL_COUNTERS.items()}
        ratio = GaugeMetricFamily(
            "offgraph_row_cache_hit_ratio", "Row-cache hits / lookups since start", labels=["model"]
        )
        fresh = GaugeMetricFamily("offgraph_store_freshness_seconds", FRESHNESS_HELP, labels=["model"])
        budget, used = (GaugeMetricFamily(*m, labels=["model", "part"]) for m in (MEMORY_BUDGET, MEMORY_USED))
        for name, part, b, u in _memory_figures(self.models):
            budget.add_metric([name, part], b)
            used.add_metric([name, part], u)
        labels = GaugeMetricFamily(*LABEL_VERSION, labels=["model", "label"])
        for name, label, v in _label_figures(self.models):
            labels.add_metric([name, label], v)
        unknown = CounterMetricFamily(*VOCABULARY_UNKNOWN_METRIC, labels=["model", "field"])
        for name, field, v in _vocabulary_figures(self.models):
            unknown.add_metric([name, field], v)
        free = GaugeMetricFamily(*VOCABULARY_FREE_METRIC, labels=["model", "field"])
        for name, field, v in _vocabulary_free_figures(self.models):
            free.add_metric([name, field], v)
        for name, v, counts, hit_ratio, freshness in _model_figures(self.models):
            version.add_metric([name], v)
            for k, family in counters.items():
                family.add_metric([name], counts[k])
            ratio.add_metric([name], hit_ratio)
            if freshness is not None:
                fresh.add_metric([name], freshness)
        yield from (version, *counters.values(), ratio, fresh, budget, used, labels, unknown, free)


class _ModelPublisher:
    """The figures of ``_ModelCollector`` as multiprocess-mode metrics, written by ``publish``."""

    def __init__(self, models: ModelRegistry, registry: CollectorRegistry):
        self.models = models
        self.counters = {
            k: Counter(name, doc, ["model"], registry=registry) for k, (name, doc) in MODEL_COUNTERS.items()
        }
        self.version = Gauge(
            "offgraph_model_loaded_version",
            "Model version being served (0: none; the highest over the workers)",
            ["model"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.fresh = Gauge(
            "offgraph_store_freshness_seconds",
            FRESHNESS_HELP + " (the stalest worker)",
            ["model"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.ratio = Gauge(
            "offgraph_row_cache_hit_ratio",
            "Row-cache hits / lookups since start, per worker (pid label)",
            ["model"],
            multiprocess_mode="liveall",
            registry=registry,
        )
        # summed over the workers: each holds its own budget
        self.budget, self.used = (
            Gauge(*m, ["model", "part"], multiprocess_mode="livesum", registry=registry)
            for m in (MEMORY_BUDGET, MEMORY_USED)
        )
        self.label_version = Gauge(*LABEL_VERSION, ["model", "label"], multiprocess_mode="livemax", registry=registry)
        self._labels: set[tuple[str, str]] = set()  # label series published, to remove the ones that go
        self.unknown = Counter(*VOCABULARY_UNKNOWN_METRIC, ["model", "field"], registry=registry)
        # the worker that read the most appends: the fewest rows left
        self.free = Gauge(*VOCABULARY_FREE_METRIC, ["model", "field"], multiprocess_mode="livemin", registry=registry)
        self._done: dict[tuple[str, str], float] = {}  # counts already added, per (model, counter)

    def publish(self) -> None:
        for name, field, v in _vocabulary_figures(self.models):
            delta = v - self._done.get((name, VOCABULARY_UNKNOWN + field), 0.0)
            if delta > 0:
                self.unknown.labels(name, field).inc(delta)
                self._done[(name, VOCABULARY_UNKNOWN + field)] = v
        for name, field, v in _vocabulary_free_figures(self.models):
            self.free.labels(name, field).set(v)
        for name, part, b, u in _memory_figures(self.models):
            self.budget.labels(name, part).set(b)
            self.used.labels(name, part).set(u)
        now = set()
        for name, label, v in _label_figures(self.models):
            self.label_version.labels(name, label).set(v)
            now.add((name, label))
        for gone in self._labels - now:
            self.label_version.remove(*gone)
        self._labels = now
        for name, v, counts, hit_ratio, freshness in _model_figures(self.models):
            for k, counter in self.counters.items():
                delta = counts[k] - self._done.get((name, k), 0.0)
                child = counter.labels(name)  # listed (at 0) from the start
                if delta > 0:
                    child.inc(delta)
                    self._done[(name, k)] = counts[k]
            self.version.labels(name).set(v)
            self.ratio.labels(name).set(hit_ratio)
            if freshness is not None:
                self.fresh.labels(name).set(freshness)


def route_of(scope: Scope) -> tuple[str, str | None]:
    """(route template, model path parameter or None) of a request: the route the router chose, or,
    for an answer given before routing (a body limit's 413), the app's first route that matches;
    ``UNMATCHED_ROUTE`` when none does."""
    route, params = scope.get("route"), scope.get("path_params")
    if route is None:
        partial = None
        for candidate in leaf_routes(getattr(scope.get("app"), "routes", ())):
            match, child = candidate.matches(scope)
            if match is Match.FULL:
                route, params = candidate, child.get("path_params")
                break
            if match is Match.PARTIAL and partial is None:
                partial = candidate, child.get("path_params")
        else:
            route, params = partial or (None, None)
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return UNMATCHED_ROUTE, None
    name = (params or {}).get(MODEL_PARAM)
    return path, name if isinstance(name, str) else None


class HttpMetricsMiddleware:
    """Pure ASGI: stamps the request start time into the scope and counts 4xx/5xx responses by code,
    route and model (except /readyz's 503 before the models are loaded: that is an answer, not an error)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/readyz":
            await self.app(scope, receive, send)
            return
        scope[START_KEY] = time.perf_counter()
        metrics = self.metrics

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                metrics.count_error(message["status"], scope)
            await send(message)

        await self.app(scope, receive, send_counting)

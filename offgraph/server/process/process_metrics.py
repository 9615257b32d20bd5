"""The ``process_*`` and ``python_*`` series of a server's /metrics (prometheus_client's process,
platform and GC collectors), on the app's own registry.

One process: the collectors are registered on the registry and read at scrape time. Several
workers (multiprocess mode): a scrape is answered by whichever worker the kernel picks, so the
answering worker's own figures would jump from worker to worker. Each worker instead copies its
figures into multiprocess-mode metrics when it publishes: gauges per live worker (a ``pid``
label), counters summed over the workers (CPU seconds and GC counts of every worker, the ones
that died included, so they never go backwards). ``python_info`` is the same in every worker
and is added to the merged scrape as is.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.gc_collector import GC_COLLECTOR
from prometheus_client.platform_collector import PLATFORM_COLLECTOR
from prometheus_client.process_collector import PROCESS_COLLECTOR

PER_PROCESS = (PROCESS_COLLECTOR, GC_COLLECTOR)
"""Collectors whose figures differ between the worker processes."""


def register_process_collectors(registry: CollectorRegistry) -> None:
    """One process: its own figures, read at scrape time."""
    for collector in (*PER_PROCESS, PLATFORM_COLLECTOR):
        registry.register(collector)


def register_platform_collector(registry: CollectorRegistry) -> None:
    """Multiprocess mode's merged scrape: ``python_info`` (the same in every worker)."""
    registry.register(PLATFORM_COLLECTOR)


class ProcessPublisher:
    """Multiprocess mode: this worker's process and GC figures, written by ``publish``."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self._metrics: dict[str, Counter | Gauge] = {}
        self._done: dict[tuple[str, tuple[str, ...]], float] = {}  # counts already added, per series

    def publish(self) -> None:
        for collector in PER_PROCESS:
            for family in collector.collect():
                for sample in family.samples:
                    if family.type == "counter" and sample.name != family.name + "_total":
                        continue  # a counter's _created: not kept in multiprocess mode
                    self._put(family.name, family.documentation, family.type, sample.labels, sample.value)

    def _put(self, name: str, doc: str, kind: str, labels: dict[str, str], value: float) -> None:
        metric = self._metrics.get(name)
        if metric is None:
            names = sorted(labels)
            metric = (
                Counter(name, doc, names, registry=self.registry)
                if kind == "counter"
                else Gauge(name, doc, names, multiprocess_mode="liveall", registry=self.registry)
            )
            self._metrics[name] = metric
        values = tuple(labels[k] for k in sorted(labels))
        child = metric.labels(*values) if values else metric
        if isinstance(child, Gauge):
            child.set(value)
            return
        key = (name, values)
        delta = value - self._done.get(key, 0.0)
        if delta > 0:
            child.inc(delta)
            self._done[key] = value

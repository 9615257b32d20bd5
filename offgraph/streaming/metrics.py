"""Updater metrics: counters, lag, backlog, a log line every few seconds, optional Prometheus.

Backpressure is visible: the backlog (files and rows after the source's cursor), the age of
the oldest unapplied file, and the rows applied per second. When the stream outruns the
updater the backlog and the oldest age grow, and the log says so (see offgraph/streaming/README.md,
"When the stream outruns the updater").
"""

from __future__ import annotations

import logging
import math
import time

from offgraph.streaming.sources import Backlog

log = logging.getLogger("offgraph.update")


class UpdaterMetrics:
    def __init__(self, model: str, *, port: int | None = None, log_every_s: float = 5.0) -> None:
        self.model = model
        self.deltas = 0  # input rows consumed (applied + stale + duplicates in a batch)
        self.rows_applied = 0
        self.rows_stale = 0
        self.files_applied = 0
        self.files_dead = 0
        self.batches = 0
        self.store_reopens = 0  # a remote store (Redis) that did not answer, closed and opened again
        self.newest_event_ms: int | None = None
        self.waiting = 0
        self.backlog = Backlog()
        self.backlog_max = Backlog()  # the largest of each figure seen
        self.rows_applied_per_s = 0.0
        self._rate_t, self._rate_rows = time.monotonic(), 0
        self._last_backlog = -math.inf
        self.partitions: dict[int, dict] = {}  # Kafka: per-partition lag (messages, rows, seconds)
        self.broker: dict | None = None  # Kafka: {"up": bool | None, "errors": int, "resets": int}
        self._counted = {"errors": 0, "resets": 0}  # of self.broker, added to the Prometheus counters so far
        self.version: int | None = None
        self.log_every_s = log_every_s
        self._last_log = time.monotonic()
        self._last_deltas = 0
        self.deltas_per_s = 0.0
        self._prom = None
        if port is not None:
            self._start_prometheus(port)

    def _start_prometheus(self, port: int) -> None:
        from prometheus_client import Counter, Gauge, start_http_server

        lbl = ["model"]
        self._prom = {
            "deltas": Counter("offgraph_update_deltas", "deltas consumed (written or skipped)", lbl),
            "rows": Counter("offgraph_update_rows_applied", "rows written to the store", lbl),
            "stale": Counter("offgraph_update_rows_skipped_stale", "deltas skipped: a newer seq was stored", lbl),
            "files": Counter("offgraph_update_files_applied", "delta files applied", lbl),
            "dead": Counter("offgraph_update_files_dead_lettered", "delta files refused", lbl),
            "lag": Gauge("offgraph_update_lag_seconds", "now - newest applied event time", lbl),
            "waiting": Gauge("offgraph_update_files_waiting", "delta files not yet applied (backlog)", lbl),
            "backlog_rows": Gauge("offgraph_update_backlog_rows", "deltas in the files not yet applied", lbl),
            "oldest": Gauge(
                "offgraph_update_oldest_unapplied_seconds", "how long the oldest file not yet applied has waited", lbl
            ),
            "applied_rate": Gauge(
                "offgraph_update_rows_applied_per_second",
                "rows written to the store per second (last second or so)",
                lbl,
            ),
            "lag_rows": Gauge(
                "offgraph_update_consumer_lag_rows",
                "Kafka: deltas behind the partition's end (counted in fetched messages, estimated for the rest)",
                lbl + ["partition"],
            ),
            "lag_seconds": Gauge(
                "offgraph_update_consumer_lag_seconds",
                "Kafka: age of the partition's oldest unapplied message",
                lbl + ["partition"],
            ),
            "rate": Gauge("offgraph_update_deltas_per_second", "deltas consumed per second (last interval)", lbl),
            "version": Gauge("offgraph_update_live_version", "model version being updated", lbl),
            "no_version": Gauge(
                "offgraph_update_waiting_for_version",
                "1 while the model has no complete version to update yet (the server beside it may still be "
                "copying one down from object storage), else 0",
                lbl,
            ),
            "broker_up": Gauge(
                "offgraph_update_broker_up",
                "Kafka: 1 while the broker is reachable, 0 while not (NaN: not known yet)",
                lbl,
            ),
            "errors": Counter(
                "offgraph_update_broker_connection_errors", "Kafka: failed or dropped broker connections", lbl
            ),
            "reopens": Counter(
                "offgraph_update_store_reopens",
                "a remote store (Redis Cluster) did not answer a write, read or open (down, failing over, a fenced "
                "batch): the updater dropped its batch, closed the store and opened it again after a backoff",
                lbl,
            ),
            "resets": Counter(
                "offgraph_update_offset_resets",
                "Kafka: partitions whose offsets went backwards (the broker lost its log, the topic was re-created)",
                lbl,
            ),
        }
        self._prom["lag"].labels(self.model).set_function(self.lag_s)
        self._prom["no_version"].labels(self.model).set(0)
        start_http_server(port)
        log.info("metrics on :%d/metrics", port)

    def restart_clock(self) -> None:
        """Start the rate interval now (not at construction: startup is not apply time)."""
        self._last_log, self._last_deltas = time.monotonic(), self.deltas

    def lag_s(self) -> float:
        if self.newest_event_ms is None:
            return math.nan
        return max(0.0, time.time() - self.newest_event_ms / 1000.0)

    def applied(self, files: int, deltas: int, rows: int, stale: int, newest_event_ms: int | None) -> None:
        self.files_applied += files
        self.deltas += deltas
        self.rows_applied += rows
        self.rows_stale += stale
        self.batches += 1
        if newest_event_ms is not None:
            self.newest_event_ms = max(self.newest_event_ms or newest_event_ms, newest_event_ms)
        if self._prom:
            self._prom["deltas"].labels(self.model).inc(deltas)
            self._prom["rows"].labels(self.model).inc(rows)
            self._prom["stale"].labels(self.model).inc(stale)
            self._prom["files"].labels(self.model).inc(files)

    def waiting_for_version(self, waiting: bool) -> None:
        if self._prom:
            self._prom["no_version"].labels(self.model).set(int(waiting))

    def store_reopened(self) -> None:
        self.store_reopens += 1
        if self._prom:
            self._prom["reopens"].labels(self.model).inc()

    def dead(self) -> None:
        self.files_dead += 1
        if self._prom:
            self._prom["dead"].labels(self.model).inc()

    def tick(self, source, version: int | None, force: bool = False, every_s: float = 0.5) -> bool:
        """After a step: refresh the backlog of ``source`` (a DeltaSource) and the rates at
        most every ``every_s``, and log every ``log_every_s``; True if refreshed."""
        self.version = version
        now = time.monotonic()
        if not force and now - self._last_backlog < every_s:
            return False
        self._last_backlog = now
        b = self.backlog = source.backlog()
        self.partitions = source.lag()
        self._broker(source)
        self.waiting = b.items
        m = self.backlog_max
        self.backlog_max = Backlog(max(m.items, b.items), max(m.rows, b.rows), max(m.oldest_age_s, b.oldest_age_s))
        if now - self._rate_t >= 1.0 or force:
            self.rows_applied_per_s = (self.rows_applied - self._rate_rows) / max(now - self._rate_t, 1e-9)
            self._rate_t, self._rate_rows = now, self.rows_applied
        if self._prom:
            self._prom["waiting"].labels(self.model).set(b.items)
            self._prom["backlog_rows"].labels(self.model).set(b.rows)
            self._prom["oldest"].labels(self.model).set(b.oldest_age_s)
            self._prom["applied_rate"].labels(self.model).set(self.rows_applied_per_s)
            if version is not None:
                self._prom["version"].labels(self.model).set(version)
            for p, d in self.partitions.items():
                self._prom["lag_rows"].labels(self.model, str(p)).set(d["rows"])
                self._prom["lag_seconds"].labels(self.model, str(p)).set(d["seconds"])
        dt = now - self._last_log
        if dt < self.log_every_s and not force:
            return True
        self.deltas_per_s = (self.deltas - self._last_deltas) / max(dt, 1e-9)
        self._last_deltas, self._last_log = self.deltas, now
        if self._prom:
            self._prom["rate"].labels(self.model).set(self.deltas_per_s)
        log.info(
            "update %s v%s: %d deltas (%.0f/s over %.1fs) -> %d rows written, %d stale skipped, %d files, "
            "%d dead-lettered, lag %.2fs; backlog %d files, %d rows, oldest %.1fs",
            self.model,
            version,
            self.deltas,
            self.deltas_per_s,
            dt,
            self.rows_applied,
            self.rows_stale,
            self.files_applied,
            self.files_dead,
            self.lag_s(),
            b.items,
            b.rows,
            b.oldest_age_s,
        )
        if b.oldest_age_s > max(2 * self.log_every_s, 10.0):
            log.warning(
                "update %s: the oldest unapplied file has waited %.1fs (%d files, %d rows behind): the "
                "stream outruns the updater; see offgraph/streaming/README.md, 'When the stream outruns the "
                "updater'",
                self.model,
                b.oldest_age_s,
                b.items,
                b.rows,
            )
        return True

    def _broker(self, source) -> None:
        """A broker source's connectivity onto the gauges (a source without a broker has none)."""
        self.broker = source.connectivity()
        if self.broker is None:
            return
        if self._prom:
            up = self.broker["up"]
            self._prom["broker_up"].labels(self.model).set(math.nan if up is None else float(up))
            for k in ("errors", "resets"):
                self._prom[k].labels(self.model).inc(max(0, self.broker[k] - self._counted[k]))
                self._counted[k] = max(self._counted[k], self.broker[k])

    def status(self) -> dict:
        """What the updater's status file holds (offgraph.modeldir.status_file)."""
        b = self.backlog
        return {
            "model": self.model,
            "version": self.version,
            "deltas": self.deltas,
            "rows_applied": self.rows_applied,
            "rows_applied_per_s": self.rows_applied_per_s,
            "lag_s": _finite(self.lag_s()),
            "backlog": {"items": b.items, "rows": b.rows, "oldest_unapplied_s": b.oldest_age_s},
            "partitions": {str(p): d for p, d in self.partitions.items()},
            **({"broker": self.broker} if self.broker is not None else {}),
        }

    def summary(self) -> dict:
        return {
            "deltas": self.deltas,
            "rows_applied": self.rows_applied,
            "rows_skipped_stale": self.rows_stale,
            "files_applied": self.files_applied,
            "files_dead_lettered": self.files_dead,
            "batches": self.batches,
            "store_reopens": self.store_reopens,
            "lag_s": self.lag_s(),
            "files_waiting": self.waiting,
            "backlog_rows": self.backlog.rows,
            "oldest_unapplied_s": self.backlog.oldest_age_s,
            "backlog_max": {
                "files": self.backlog_max.items,
                "rows": self.backlog_max.rows,
                "oldest_unapplied_s": self.backlog_max.oldest_age_s,
            },
            "version": self.version,
        }


def _finite(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x

"""Broker connectivity of a Kafka client: one log line per change of state, a periodic summary.

librdkafka reconnects every 50-100 ms while a broker is down and reports each failure twice
(its log callback and its error callback): about 20 identical ERROR lines a second. Here
those are counted instead, and the log says

    kafka 127.0.0.1:9092: broker unreachable (Connect to ... failed: Connection refused)
    kafka 127.0.0.1:9092: broker still unreachable after 30s (412 connection errors)      (every SUMMARY_S)
    kafka 127.0.0.1:9092: broker reachable again after 41s (530 connection errors)

``up`` (None: not known yet), ``errors`` (connection errors so far) and ``resets`` (offset
resets detected by the source) are what the updater's /metrics shows.

    health = BrokerHealth("127.0.0.1:9092", log)
    Consumer({..., **health.client_config()})      # logger, error_cb, stats_cb
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from offgraph.streaming.log_limit import REPEAT_S, RepeatLimiter  # other librdkafka messages: once per REPEAT_S

SUMMARY_S = 30.0  # while down: a summary line this often

# librdkafka's words for a connection that failed or dropped (log facilities and error codes)
_CONN_FACS = {"FAIL", "ERROR", "BROKERFAIL", "CONNECT", "DISCONNECT"}
_CONN_CODES = {-195, -187, -193, -185}  # _TRANSPORT, _ALL_BROKERS_DOWN, _RESOLVE, _TIMED_OUT


class BrokerHealth:
    def __init__(
        self, bootstrap: str, log: logging.Logger, *, on_down: Callable[[], None] | None = None, clock=time.monotonic
    ) -> None:
        self.bootstrap = bootstrap
        self._log = log
        self.on_down = on_down  # called once per change to down (the source re-verifies its positions)
        self.clock = clock
        self.up: bool | None = None
        self.errors = 0
        self.resets = 0
        self._since = clock()
        self._errors_at_change = 0
        self._last_summary = clock()
        self._said = RepeatLimiter(log, REPEAT_S, clock=clock)  # other messages

    def client_config(self) -> dict:
        """The librdkafka settings that route a client's connection messages here."""
        return {"logger": self, "error_cb": self.error, "stats_cb": self.stats, "statistics.interval.ms": 1000}

    # -- librdkafka callbacks -------------------------------------------------------
    def log(self, level: int, fmt: str, *args) -> None:  # the `logger` interface confluent-kafka calls
        """librdkafka's log callback (``logger.log(level, "%s [%s] %s", fac, name, text)``)."""
        fac = str(args[0]) if args else ""
        text = str(args[-1]) if args else fmt
        if level >= logging.WARNING and (
            fac in _CONN_FACS or "Connect to" in text or "Disconnected" in text or "brokers are down" in text
        ):
            self.failed(text)
            return
        self._say(level, text)

    def error(self, err) -> None:
        """``error_cb``: connection errors count, others are logged (each text at most every REPEAT_S)."""
        if err.code() in _CONN_CODES:
            self.failed(err.str())
        else:
            self._say(logging.ERROR if err.fatal() else logging.WARNING, err.str())

    def stats(self, payload: str) -> None:
        """``stats_cb``: a broker (node id >= 0) in state UP means the cluster is reachable."""
        try:
            brokers = json.loads(payload).get("brokers", {})
        except ValueError:
            return
        if any(b.get("nodeid", -1) >= 0 and b.get("state") == "UP" for b in brokers.values()):
            self.reached()
        self.tick()

    # -- state ------------------------------------------------------------------------
    def failed(self, why: str) -> None:
        self.errors += 1
        if self.up is not False:
            self._change(False)
            self._log.error(
                "kafka %s: broker unreachable (%s); retrying, logged again once it is back and every %.0fs meanwhile",
                self.bootstrap,
                why,
                SUMMARY_S,
            )
            if self.on_down is not None:
                self.on_down()
        self.tick()

    def reached(self) -> None:
        if self.up is not True:
            was_down = self.up is False
            took, n = self.clock() - self._since, self.errors - self._errors_at_change
            self._change(True)
            if was_down:
                self._log.warning(
                    "kafka %s: broker reachable again after %.0fs (%d connection errors)", self.bootstrap, took, n
                )

    def tick(self) -> None:
        now = self.clock()
        if self.up is False and now - self._last_summary >= SUMMARY_S:
            self._last_summary = now
            self._log.error(
                "kafka %s: broker still unreachable after %.0fs (%d connection errors)",
                self.bootstrap,
                now - self._since,
                self.errors - self._errors_at_change,
            )

    def _change(self, up: bool) -> None:
        self.up = up
        self._since = self._last_summary = self.clock()
        self._errors_at_change = self.errors

    def _say(self, level: int, text: str) -> None:
        self._said.log(level, "kafka %s: %s", self.bootstrap, text, key=text)

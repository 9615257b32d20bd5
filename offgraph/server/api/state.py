"""ServerState: the shared objects of one app (config, models, metrics, scoring pool)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import Any

from offgraph.server.config import ServerConfig
from offgraph.server.http.request_id import REQUEST_ID
from offgraph.server.models.experiment import Experiments
from offgraph.server.models.registry import ModelRegistry
from offgraph.server.process.gc_tuning import GcPauses, collect_young_forever
from offgraph.server.process.loop_lag import watch_loop_lag
from offgraph.server.process.metrics import ServerMetrics
from offgraph.server.process.served_log import ServedLog

log = logging.getLogger("offgraph.server")

CALL_DEADLINE: ContextVar[float | None] = ContextVar("offgraph_call_deadline", default=None)
"""The ``time.monotonic()`` by which the caller gives up (a gRPC call's deadline; None: none), set by the call's
task: ``run_scoring`` runs nothing for it once it has passed."""


class DeadlineExpired(Exception):
    """The call's deadline passed before its turn in the scoring pool came: it is not scored."""

    def __init__(self, late_s: float):
        super().__init__(f"the call's deadline passed {late_s * 1000:.0f} ms before its turn to be scored came")


def _at_turn(fn: Callable[..., Any], *args: Any) -> Any:
    deadline = CALL_DEADLINE.get()
    if deadline is not None and (late := time.monotonic() - deadline) >= 0:
        raise DeadlineExpired(late)
    return fn(*args)


@dataclass
class ServerState:
    config: ServerConfig
    models: ModelRegistry
    metrics: ServerMetrics
    pool: ThreadPoolExecutor | None = None
    served_log: ServedLog | None = None
    experiments: Experiments | None = None  # the models' experiments (create_app), read by every protocol's score
    _poll_task: asyncio.Task | None = field(default=None, repr=False)
    _gc: GcPauses | None = field(default=None, repr=False)
    _lag_task: asyncio.Task | None = field(default=None, repr=False)
    _young_task: asyncio.Task | None = field(default=None, repr=False)

    @classmethod
    def build(cls, config: ServerConfig) -> ServerState:
        models = ModelRegistry(config)
        return cls(config, models, ServerMetrics(models, multiprocess=config.workers > 1))

    def log_served(self, model: str, version: int | None, arm: str, request: Any, candidates: Any, scores: Any) -> None:
        """Offer a scored request to the served log (``offgraph.server.process.served_log``), if there is one and
        it samples the request's id (``REQUEST_ID``: the HTTP header's, or the gRPC call's metadata's): every
        protocol's scored requests, after the answer is computed. References only (the features as the scorer
        saw them, the scores' array): the writer thread encodes them; never blocks."""
        log = self.served_log
        if log is not None:
            rid = REQUEST_ID.get() or ""
            if log.sampled(rid):
                log.offer(rid, model, version, arm, request, candidates, scores)

    async def run_scoring(self, fn: Callable[..., Any], *args) -> Any:
        """Run ``fn(*args)`` in the bounded scoring pool, without blocking the event loop, in a copy of the
        caller's context (its log records carry the request's id: ``offgraph.server.http.request_id``), unless the
        caller's ``CALL_DEADLINE`` has passed when its turn comes (``DeadlineExpired``: a call whose caller gave up
        is not scored)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, copy_context().run, _at_turn, fn, *args)

    async def start(self) -> None:
        # the models are known before the first request (one directory listing): a request for a model
        # that is still loading is then a 503 to retry, not a 404
        await self.models.run_in_loader(self.models.check_models_dir)
        await self.models.run_in_loader(self.models.discover)
        self._gc = GcPauses(self.metrics.gc_pause)
        self._gc.start()
        self.pool = ThreadPoolExecutor(max_workers=self.config.score_threads, thread_name_prefix="offgraph-score")
        self._poll_task = asyncio.create_task(self.models.poll_forever(on_tick=self.on_tick), name="offgraph-poll")
        self._lag_task = asyncio.create_task(watch_loop_lag(self.metrics.loop_lag), name="offgraph-loop-lag")
        if self.config.tune_gc:
            self._young_task = asyncio.create_task(collect_young_forever(), name="offgraph-gc-young")

    def on_tick(self) -> None:
        """The poll loop's tick: GC pauses into the metrics, then (several workers) publish them."""
        self.flush_gc()
        self.metrics.publish()

    def flush_gc(self) -> None:
        if self._gc is not None:
            self._gc.flush()

    async def stop(self) -> None:
        if self._gc is not None:
            self._gc.stop()
        for task in (self._poll_task, self._lag_task, self._young_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self.pool is not None:
            await asyncio.to_thread(self.pool.shutdown, wait=True)
        await asyncio.to_thread(self.models.close)

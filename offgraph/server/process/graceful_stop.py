"""A graceful stop for rolling updates: SIGTERM (or SIGINT) drains, then stops, then the process exits 0.

A load balancer takes a server out when its readiness check fails, a few health-check intervals after
the server starts failing it. Until then it still sends requests, so a server that stopped accepting at
once (uvicorn's own handling of SIGTERM) would fail them. Here the first signal starts a **drain**:
``/readyz`` answers 503 at once (``draining()``, read by ``offgraph.server.api.deps.readiness``), and the
server goes on accepting and answering for ``drain_seconds``, long enough for every balancer to see the
503. Then the **stop**: uvicorn's shutdown (no new connections, idle kept-alive connections closed,
in-flight requests finish within ``stop_timeout_s``, the app's lifespan shutdown), and the process exits 0
(uvicorn re-raises the signal it caught, which would end the process with -SIGTERM; this does not).

A second signal during the drain skips to the stop; one during the stop cancels what is still in flight.
Each phase is logged in one line. With ``--workers N`` the supervisor forwards the signals to every worker
(``offgraph.server.process.workers``), each drains itself. Another server in the process (the gRPC port,
``offgraph.server.grpc.server``) registers its stop with ``on_stop``: it runs beside uvicorn's, with the same
``stop_timeout_s``, so that both protocols' in-flight calls finish (or are cancelled) together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from types import FrameType

import uvicorn

log = logging.getLogger("offgraph.server")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# one server per process: the readiness route reads the flag of the process it runs in
_draining = threading.Event()


_stops: list[Callable[[], Awaitable[None]]] = []


def draining() -> bool:
    """Whether this process got its stop signal (its ``/readyz`` then answers 503)."""
    return _draining.is_set()


def on_stop(stop: Callable[[], Awaitable[None]]) -> None:
    """Run ``stop()`` when the drain is over, beside uvicorn's own shutdown (another server of this process)."""
    _stops.append(stop)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain above in place of its own signal handling."""

    def __init__(self, config: uvicorn.Config, drain_seconds: float):
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.drain_ends: float | None = None  # monotonic time; None until the first signal

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # unlike uvicorn's, the signal is not raised again once the server has stopped: the exit status is 0
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if self.drain_ends is None:
            _draining.set()
            self.drain_ends = time.monotonic() + self.drain_seconds
            log.info(
                "%s: draining for %g s (/readyz answers 503, requests are still served; another signal stops now)",
                name,
                self.drain_seconds,
            )
        elif not self.should_exit:
            self.drain_ends = time.monotonic()
            log.info("%s during the drain: stopping now", name)
        else:
            self.force_exit = True
            log.warning("%s during the stop: cancelling the requests still in flight", name)

    async def shutdown(self, sockets=None) -> None:
        await asyncio.gather(super().shutdown(sockets), *(stop() for stop in _stops))

    async def on_tick(self, counter: int) -> bool:
        if self.drain_ends is not None and not self.should_exit and time.monotonic() >= self.drain_ends:
            self.should_exit = True
            log.info(
                "drain over: no new connections; %d request(s) in flight get up to %g s to finish",
                len(self.server_state.tasks),
                self.config.timeout_graceful_shutdown,
            )
        return await super().on_tick(counter)

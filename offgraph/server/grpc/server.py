"""The gRPC port of a server process (``offgraph serve --grpc-port P``): a ``grpc.aio`` server on uvicorn's event
loop, in the same process as the HTTP app and sharing its ``ServerState``: the model registry (and so the memory
budget), the scoring pool, the limits of the settings and the metrics.

Services plug in through ``SERVICES``, a tuple of modules. Each module exposes

* ``SERVICE_NAMES``: the full names of the gRPC services it registers (``"tensorflow.serving.PredictionService"``):
  the health service reports each of them as the server's overall status, and reflection lists them;
* ``add_to_server(server: grpc.aio.Server, ctx: GrpcContext) -> None``: registers its servicers
  (``add_XServicer_to_server(servicer, server)``, the generated stubs' function) built over ``ctx``.

``GrpcContext`` (``offgraph.server.grpc.context``, re-exported here; its own module so that the service modules
need not import this one) carries the process's ``ServerState``, the service names and the background tasks; a
handler begins with ``ctx.begin(context)`` (its deadline then holds in the scoring pool), scores through the api
room's score path (``offgraph.server.api.predict_scoring``: ``state.run_scoring``, the admission limit REST shares:
``--score-threads`` threads with a queue in front) and answers any error with ``await ctx.abort(context, method,
model, exc)`` (``offgraph.server.grpc.status``: REST's words, gRPC's codes, counted in
``offgraph_http_errors_total`` with the method's full name as its route). Adding a service: write the module,
add it to ``SERVICES``.

Binding: one process binds the port alone (``grpc.so_reuseport`` 0: a port in use is an error at start, never a
silently shared port); ``--workers N`` workers bind it each with ``SO_REUSEPORT`` after the supervisor has
checked it free, as for HTTP. Stop: the drain leaves the port answering (health says NOT_SERVING, calls are
still scored); when it ends, ``server.stop(--stop-timeout)`` runs beside uvicorn's shutdown
(``offgraph.server.process.graceful_stop.on_stop``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection

from offgraph.server.api.state import ServerState
from offgraph.server.grpc import health, kserve, tfserving
from offgraph.server.grpc.context import GrpcContext
from offgraph.server.process.graceful_stop import on_stop

log = logging.getLogger("offgraph.server")

__all__ = ["SERVICES", "GrpcContext", "GrpcPort"]

SERVICES: tuple[Any, ...] = (health, tfserving, kserve)
"""The service modules the gRPC port serves (each: ``SERVICE_NAMES``, ``add_to_server(server, ctx)``)."""


def server_options(state: ServerState, reuseport: bool) -> list[tuple[str, int]]:
    """The channel options of the port: messages as large as REST's bodies (``--max-body-mb``; larger ones are
    RESOURCE_EXHAUSTED by gRPC itself, before any decoding), SO_REUSEPORT only with several workers."""
    limit = state.config.max_body_bytes
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 1 if reuseport else 0),
    ]


class GrpcPort:
    """The port's server: ``await start()`` binds and serves, ``await stop(grace)`` (idempotent) stops it."""

    def __init__(self, state: ServerState, host: str, port: int, reuseport: bool, grace_s: float):
        self.state, self.host, self.reuseport, self.grace_s = state, host, reuseport, grace_s
        self.requested = port
        self.port: int | None = None
        self.server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopping: asyncio.Task | None = None

    async def start(self) -> None:
        names = tuple(n for module in SERVICES for n in module.SERVICE_NAMES)
        ctx = GrpcContext(self.state, names)
        # past --max-connections calls under way at once, one more is RESOURCE_EXHAUSTED (REST's 503 at that many
        # connections): the same setting bounds both protocols' concurrency in a process
        server = grpc.aio.server(
            options=server_options(self.state, self.reuseport),
            maximum_concurrent_rpcs=self.state.config.http.max_connections,
        )
        for module in SERVICES:
            module.add_to_server(server, ctx)
        reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
        address = f"[{self.host}]:{self.requested}" if ":" in self.host else f"{self.host}:{self.requested}"
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError as e:  # grpc's words are "Failed to bind to address ..."
            raise OSError(f"cannot serve gRPC on {address}: {e}") from None
        if not self.port:
            raise OSError(f"cannot serve gRPC on {address}: the port is in use or the address is not local")
        await server.start()
        self.server = server
        self._tasks = [asyncio.create_task(fn(), name="offgraph-grpc") for fn in ctx.background]
        on_stop(self.stop)
        log.info("serving gRPC on %s:%d (%s)", self.host, self.port, ", ".join(names))

    async def stop(self) -> None:
        """Stop the port: in-flight calls get ``grace_s`` to finish; the background tasks end (health first says
        NOT_SERVING to its watchers). The drain's first stop and the app's shutdown both await the same one."""
        if self.server is None:
            return
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(self.server))
        await asyncio.shield(self._stopping)

    async def _stop(self, server: grpc.aio.Server) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.stop(self.grace_s)
        log.info("gRPC port %s stopped", self.port)

"""gRPC health checking (``grpc.health.v1.Health``: ``Check`` and ``Watch``), from the server's readiness.

* ``""`` (the server) and every served gRPC service's full name (``tensorflow.serving.PredictionService``, ...):
  SERVING exactly when ``/readyz`` would answer 200 (``offgraph.server.api.deps.readiness``: every model loaded
  in every worker, not draining);
* each model's name (``ml``): SERVING while the model has a version that serves and the server is not draining.

NOT_SERVING before, and from the stop signal on (the drain: calls are still answered, balancers take the port
out); an unknown name is NOT_FOUND to ``Check`` and SERVICE_UNKNOWN to ``Watch``, as the protocol says. The
stop and the models' own states are read every ``POLL_S`` (a watcher hears of them within that); the readiness of
the other workers (a read in a thread) every ``POLL_S`` while the server is not ready, and every ``STEADY_S`` once
it is (a worker that stops serving is heard of within that: polled every ``POLL_S``, the read cost an idle
worker ~1% of a core); at the stop, every name turns NOT_SERVING for its watchers before the port closes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import SERVICE_NAME
from grpc_health.v1.health import aio as health_aio

from offgraph.server.api.deps import readiness
from offgraph.server.process.graceful_stop import draining

if TYPE_CHECKING:
    import grpc

    from offgraph.server.grpc.context import GrpcContext

SERVICE_NAMES = (SERVICE_NAME,)
POLL_S = 0.1
STEADY_S = 1.0

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def add_to_server(server: grpc.aio.Server, ctx: GrpcContext) -> None:
    servicer = health_aio.HealthServicer()
    # the servicer starts with "" SERVING: NOT_SERVING until the first reading says otherwise
    servicer._server_status[""] = NOT_SERVING  # no await here: nothing watches before the port starts
    for name in ctx.service_names:
        servicer._server_status[name] = NOT_SERVING
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)

    async def follow_readiness() -> None:
        state, known = ctx.state, dict.fromkeys(("", *ctx.service_names), NOT_SERVING)
        loop = asyncio.get_running_loop()
        ready, read_at = False, float("-inf")
        try:
            while True:
                if draining():  # the stop is heard at once, whatever was read last
                    ready = False
                elif not ready or loop.time() - read_at >= STEADY_S:
                    ready, read_at = (await readiness(state, None)).ready, loop.time()
                statuses = dict.fromkeys(("", *ctx.service_names), SERVING if ready else NOT_SERVING)
                stopping = draining()
                for holder in state.models.all():
                    statuses[holder.name] = SERVING if not stopping and holder.peek() is not None else NOT_SERVING
                for name, status in statuses.items():
                    if known.get(name) != status:
                        await servicer.set(name, status)
                        known[name] = status
                await asyncio.sleep(POLL_S)
        except asyncio.CancelledError:
            await servicer.enter_graceful_shutdown()  # every name NOT_SERVING, told to the watchers
            raise

    ctx.background.append(follow_readiness)

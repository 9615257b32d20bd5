"""``GrpcContext``: what the gRPC service modules are given (``add_to_server(server, ctx)``; see
``offgraph.server.grpc.server``). Its own module so that the services, which ``server`` lists, need not import
``server``."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

from offgraph.server.api.state import CALL_DEADLINE, ServerState
from offgraph.server.grpc import status
from offgraph.server.http.request_id import REQUEST_ID, request_id_of


@dataclass
class GrpcContext:
    """The process's ``state`` (``state.models``: the registry; ``state.config``: the limits, ``--max-candidates``,
    ``--max-request-values``; ``state.metrics``; ``state.run_scoring``: the scoring pool, the admission limit REST
    shares), ``service_names`` (every service module's ``SERVICE_NAMES``), and ``background``: coroutine functions
    started once the port serves and cancelled when it stops (health's watch of readiness).

    A call's handler begins with ``ctx.begin(context)`` (its deadline then holds in the scoring pool: a call whose
    deadline passed before its turn is not scored, DEADLINE_EXCEEDED), scores through the api room's score path
    (``state.run_scoring`` underneath), and answers any error with ``await ctx.abort(context, method, model, exc)``
    (``offgraph.server.grpc.status``: REST's words, the gRPC code, counted in ``offgraph_http_errors_total`` with
    the method's full name as its route)."""

    state: ServerState
    service_names: tuple[str, ...]
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)

    def begin(self, context: grpc.aio.ServicerContext) -> float:
        """Start a call: its deadline for the scoring pool (``CALL_DEADLINE``, in the call's own task) and its
        request id (``REQUEST_ID``: its ``x-request-id`` metadata if that is a sane id, else a fresh one, as over
        HTTP: its log lines and its served-log record carry it); returns ``time.perf_counter()`` now, the start
        of its latency."""
        metadata = context.invocation_metadata() or ()
        REQUEST_ID.set(request_id_of([(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in metadata]))
        remaining = context.time_remaining()
        CALL_DEADLINE.set(None if remaining is None else time.monotonic() + remaining)
        return time.perf_counter()

    def count_cancelled(self, context: grpc.aio.ServicerContext, method: str, model: str | None) -> None:
        """Count a call gRPC cancelled under way (its handler gets ``CancelledError``): its deadline passed
        (DEADLINE_EXCEEDED: e.g. while it waited its turn in the scoring pool, where it is then not scored) or its
        client went (CANCELLED). gRPC answers the client itself; this is what ``offgraph_http_errors_total`` sees."""
        remaining = context.time_remaining()
        code = "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
        self.state.metrics.count_error_on(code, method, model)

    async def abort(
        self, context: grpc.aio.ServicerContext, method: str, model: str | None, exc: BaseException
    ) -> NoReturn:
        """Answer the call with ``exc``'s status and message (``status.of``), counted on ``method``."""
        code, message = status.of(exc, self.state.config.models_dir)
        self.state.metrics.count_error_on(code.name, method, model)
        await context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

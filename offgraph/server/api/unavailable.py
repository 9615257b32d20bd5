"""503 answers: a model whose first load is under way, a score that failed on a store read, one whose
remote store did not answer, and one whose fresh rows kept changing while it read them from the write feed.

A store read error (a corrupt block, an I/O error) is answered with a generic message; the
backend's detail, which names files, goes to the log. ``offgraph_store_errors_total{model}``
counts these answers; the holder has already marked the version unhealthy and asked the
registry to fall back to the previous version (``ModelRegistry.fall_back``). A remote store that does
not answer (a Redis Cluster down or failing over) says nothing about the version: it stays healthy, the
answer says to retry in a second, ``offgraph_store_unavailable_total{model}`` counts them, and the log
says so at most once every ``OUTAGE_LOG_S`` per model.
"""

from __future__ import annotations

import logging
import math
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import Counter

from offgraph.server.api.state import ServerState
from offgraph.server.models.served import ModelLoading, StoreFailure, StoreOutage
from offgraph.store.feed import FeedTornRead

log = logging.getLogger("offgraph.server")

OUTAGE_LOG_S = 10.0


TORN_READ = "fresh embedding rows were being rewritten while this request read them: retry"


def unavailable_detail(exc: Exception) -> str | None:
    """The words of a 503 answer (REST's detail, gRPC's UNAVAILABLE message): a model still loading, a store
    that failed or did not answer, a torn read of the write feed; None for any other exception."""
    if isinstance(exc, StoreOutage):
        return f"model '{exc.model}' version {exc.version}: the embedding store did not answer: retry"
    if isinstance(exc, ModelLoading):
        return f"{exc}: retry shortly"
    if isinstance(exc, StoreFailure):
        return (
            f"model '{exc.model}' version {exc.version}: the embedding store could not be read; the version is "
            "marked unhealthy and the server falls back to its previous version: retry"
        )
    if isinstance(exc, FeedTornRead):
        return TORN_READ
    return None


def install_unavailable_handlers(app: FastAPI, state: ServerState) -> None:
    retry_after = {"Retry-After": str(max(1, math.ceil(state.config.poll_seconds)))}
    store_errors = Counter(
        "offgraph_store_errors",
        "Score requests answered 503 because the version's store failed to read (the version is then marked unhealthy)",
        ["model"],
        registry=state.metrics.registry,
    )

    outages = Counter(
        "offgraph_store_unavailable",
        "Score requests answered 503 because the version's remote store did not answer in its timeout",
        ["model"],
        registry=state.metrics.registry,
    )
    last_logged: dict[str, float] = {}

    @app.exception_handler(StoreOutage)
    async def store_outage(request: Request, exc: StoreOutage) -> JSONResponse:
        outages.labels(exc.model).inc()
        now = time.monotonic()
        if now - last_logged.get(exc.model, -math.inf) >= OUTAGE_LOG_S:
            last_logged[exc.model] = now
            log.warning(
                "model %s version %d: %s (logged once every %.0fs)", exc.model, exc.version, exc.cause, OUTAGE_LOG_S
            )
        return JSONResponse(
            {"detail": unavailable_detail(exc)},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    @app.exception_handler(ModelLoading)
    async def model_loading(request: Request, exc: ModelLoading) -> JSONResponse:
        return JSONResponse({"detail": unavailable_detail(exc)}, status_code=503, headers=retry_after)

    @app.exception_handler(StoreFailure)
    async def store_failure(request: Request, exc: StoreFailure) -> JSONResponse:
        log.error(
            "model %s version %d: store read failed, version marked unhealthy: %s", exc.model, exc.version, exc.cause
        )
        store_errors.labels(exc.model).inc()
        return JSONResponse(
            {"detail": unavailable_detail(exc)},
            status_code=503,
            headers=retry_after,
        )

    @app.exception_handler(FeedTornRead)
    async def feed_torn_read(request: Request, exc: FeedTornRead) -> JSONResponse:
        # transient (a writer rewriting rows faster than a lookup re-reads them): the version stays healthy
        log.warning("%s: %s", request.url.path, exc)
        return JSONResponse(
            {"detail": TORN_READ},
            status_code=503,
            headers=retry_after,
        )

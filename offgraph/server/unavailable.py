"""503 answers: a model whose first load is under way, a score that failed on a store read, and one
whose fresh rows kept changing while it read them from the write feed.

A store read error (a corrupt block, an I/O error) is answered with a generic message; the
backend's detail, which names files, goes to the log. ``offgraph_store_errors_total{model}``
counts these answers; the holder has already marked the version unhealthy and asked the
registry to fall back to the previous version (``ModelRegistry.fall_back``).
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import Counter

from offgraph.server.served import ModelLoading, StoreFailure
from offgraph.server.state import ServerState
from offgraph.store.feed import FeedTornRead

log = logging.getLogger("offgraph.server")


def install_unavailable_handlers(app: FastAPI, state: ServerState) -> None:
    retry_after = {"Retry-After": str(max(1, math.ceil(state.config.poll_seconds)))}
    store_errors = Counter(
        "offgraph_store_errors",
        "Score requests answered 503 because the version's store failed to read (the version is then marked unhealthy)",
        ["model"],
        registry=state.metrics.registry,
    )

    @app.exception_handler(ModelLoading)
    async def model_loading(request: Request, exc: ModelLoading) -> JSONResponse:
        return JSONResponse({"detail": f"{exc}: retry shortly"}, status_code=503, headers=retry_after)

    @app.exception_handler(StoreFailure)
    async def store_failure(request: Request, exc: StoreFailure) -> JSONResponse:
        log.error(
            "model %s version %d: store read failed, version marked unhealthy: %s", exc.model, exc.version, exc.cause
        )
        store_errors.labels(exc.model).inc()
        return JSONResponse(
            {
                "detail": f"model '{exc.model}' version {exc.version}: the embedding store could not "
                "be read; the version is marked unhealthy and the server falls back to "
                "its previous version: retry"
            },
            status_code=503,
            headers=retry_after,
        )

    @app.exception_handler(FeedTornRead)
    async def feed_torn_read(request: Request, exc: FeedTornRead) -> JSONResponse:
        # transient (a writer rewriting rows faster than a lookup re-reads them): the version stays healthy
        log.warning("%s: %s", request.url.path, exc)
        return JSONResponse(
            {"detail": "fresh embedding rows were being rewritten while this request read them: retry"},
            status_code=503,
            headers=retry_after,
        )

"""GET /healthz, /readyz, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from offgraph.server.api.deps import State, readiness
from offgraph.server.api.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> Health:
    """The process is up and its event loop answers."""
    return Health()


@router.get("/readyz", summary="Readiness", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(state: State, request: Request) -> Readiness | JSONResponse:
    """200 once every model is loaded and warmed up (or unloaded by an admin), in every worker
    process of the server, 503 before, and 503 while MODELS holds no model."""
    ready = await readiness(state, request)
    return ready if ready.ready else JSONResponse(ready.model_dump(), status_code=503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: State) -> Response:
    state.flush_gc()
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

"""GET /healthz, /readyz, /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from offgraph.server.deps import State
from offgraph.server.redact import view_for
from offgraph.server.schemas import Health, Readiness
from offgraph.server.state import ServerState

router = APIRouter(tags=["health"])

NO_MODEL = (
    "no model found in MODELS: a model is a directory MODELS/NAME holding versions MODELS/NAME/VERSION "
    "(each with its manifest.json)"
)


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


async def readiness(state: ServerState, request: Request) -> Readiness:
    """Whether the server is ready (``/readyz``, KServe's ``/v2/health/ready``), and why not."""
    models = {h.name: h.state for h in state.models.all()}
    control = state.models.control
    if state.models.ready:
        workers = await asyncio.to_thread(control.workers_not_ready) if control is not None else []
        if control is None or not workers:
            return Readiness(ready=True, models=models, detail="every model is serving")
        detail = (
            f"worker {control.worker} is serving every model; worker(s) {', '.join(map(str, workers))} "
            f"of {control.workers} not yet"
        )
        return Readiness(ready=False, models=models, detail=detail)
    if not state.models.initial_scan_done:
        detail = "the first load of the models is in progress"
    elif not models:
        detail = NO_MODEL
    else:
        waiting = [
            f"{h.name} ({h.state}: {h.last_error or 'loading'})"
            for h in state.models.all()
            if h.current is None and h.policy != "unloaded"
        ]
        detail = view_for(request)("not serving: " + "; ".join(waiting))  # reasons may name directories
    return Readiness(ready=False, models=models, detail=detail)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: State) -> Response:
    state.flush_gc()
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

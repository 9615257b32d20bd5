"""KServe v2 (the open inference protocol): server metadata, liveness and readiness, model metadata and
readiness, for its clients and for Kubernetes probes. The server not ready yet is a 503 ``{"ready": false}``
(as ``/readyz``); a model not ready is a 503 ``{"error": ...}`` with ``Retry-After`` while its first load runs,
else a 404 ``{"error": ...}`` saying why (unknown, refused, unloaded: the protocol's 4xx for not ready), as
the model's other routes answer (``offgraph.server.api.anchor_errors``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from offgraph import __version__
from offgraph.server.api.anchor_errors import ErrorKeyRoute, error_key_responses
from offgraph.server.api.anchor_schemas import (
    KServeModelMetadata,
    MetadataTensor,
    ModelReady,
    ServerLive,
    ServerMetadata,
    ServerReady,
)
from offgraph.server.api.deps import Holder, State, VersionNumber, readiness
from offgraph.server.api.model_inputs import describe_inputs, shape
from offgraph.server.api.version_status import serving_version
from offgraph.server.models.served import ModelHolder

PLATFORM = "offgraph"
"""The model metadata's ``platform``: a DeepFM whose embeddings are read from RocksDB, its dense head a SavedModel."""

router = APIRouter(tags=["kserve v2"], route_class=ErrorKeyRoute)

_MODEL_ERRORS = error_key_responses(
    e400="Invalid model name or version.", e404="Unknown model, or the version is not served."
)
_READY_ERRORS = error_key_responses(
    e400="Invalid model name or version.",
    e404="Not ready: an unknown model, or none of its versions (or not that one) serves: the message says which.",
    e503="Not ready yet: the model's first load is under way (`Retry-After`).",
)


@router.get("/v2", summary="Server metadata (KServe v2)")
async def server_metadata() -> ServerMetadata:
    return ServerMetadata(name="offgraph", version=__version__, extensions=[])


@router.get("/v2/health/live", summary="Liveness (KServe v2)")
async def live() -> ServerLive:
    """The process is up and its event loop answers (as `/healthz`)."""
    return ServerLive(live=True)


@router.get(
    "/v2/health/ready",
    summary="Readiness (KServe v2)",
    response_model=ServerReady,
    responses={503: {"model": ServerReady, "description": "Not ready (as `/readyz`)."}},
)
async def ready(state: State, request: Request) -> ServerReady | JSONResponse:
    """200 once every model serves, in every worker process (as `/readyz`, which gives the reason), 503 before."""
    if (await readiness(state, request)).ready:
        return ServerReady(ready=True)
    return JSONResponse(ServerReady(ready=False).model_dump(), status_code=503)


def _model_metadata(holder: ModelHolder, version: int | None) -> KServeModelMetadata:
    sv = serving_version(holder, version)
    inputs = [
        MetadataTensor(
            name=i.name, datatype="FP64" if i.number else "BYTES", shape=shape(i), parameters={"scope": i.scope}
        )
        for i in describe_inputs(sv.scorer.spec)
    ]
    outputs = [
        MetadataTensor(name="predictions", datatype="FP32", shape=[-1], parameters={"score_kind": sv.scorer.score_kind})
    ]
    return KServeModelMetadata(
        name=holder.name, versions=[str(sv.version)], platform=PLATFORM, inputs=inputs, outputs=outputs
    )


@router.get("/v2/models/{name}", summary="Model metadata (KServe v2)", responses=_MODEL_ERRORS)
async def model_metadata(holder: Holder) -> KServeModelMetadata:
    """The served version's raw inputs (datatype, shape, scope) and its output `predictions`."""
    return _model_metadata(holder, None)


@router.get(
    "/v2/models/{name}/versions/{version}", summary="One version's metadata (KServe v2)", responses=_MODEL_ERRORS
)
async def version_metadata(holder: Holder, version: VersionNumber) -> KServeModelMetadata:
    """As `/v2/models/{name}`, for the version that must be the served one (404 otherwise)."""
    return _model_metadata(holder, version)


@router.get("/v2/models/{name}/ready", summary="Model readiness (KServe v2)", responses=_READY_ERRORS)
async def model_ready(holder: Holder) -> ModelReady:
    """200 while a version of the model serves; 503 while its first load is under way; 404 while none serves
    (refused, unloaded by an admin), as the protocol's 4xx for not ready."""
    serving_version(holder)
    return ModelReady(name=holder.name, ready=True)


@router.get(
    "/v2/models/{name}/versions/{version}/ready", summary="Version readiness (KServe v2)", responses=_READY_ERRORS
)
async def version_ready(holder: Holder, version: VersionNumber) -> ModelReady:
    """200 while that version serves; 503 while the model's first load is under way; 404 otherwise."""
    serving_version(holder, version)
    return ModelReady(name=holder.name, ready=True)

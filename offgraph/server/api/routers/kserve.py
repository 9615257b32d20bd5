"""KServe v2 (the open inference protocol): server metadata, liveness and readiness, model metadata and
readiness, for its clients and for Kubernetes probes, and inference (``POST /v2/models/{name}[/versions/{v}]/infer``).
The server not ready yet is a 503 ``{"ready": false}`` (as ``/readyz``); a model not ready is a 503 ``{"error": ...}``
with ``Retry-After`` while its first load runs, else a 404 ``{"error": ...}`` saying why (unknown, refused, unloaded:
the protocol's 4xx for not ready), as the model's other routes answer (``offgraph.server.api.anchor_errors``).

Inference takes the raw features as named tensors (``offgraph.server.api.kserve_body``: JSON ``data`` or the binary
tensor extension), made rows by ``offgraph.server.api.tensor_inputs`` and scored by the ``:score`` path
(``offgraph.server.api.predict_scoring``); the model metadata describes exactly what it takes. A request it cannot
score is a 400 (``BadRequestRoute``: the score path's 422s, with their messages).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from offgraph import __version__
from offgraph.server.api.anchor_errors import AnchorError, BadRequestRoute, ErrorKeyRoute, error_key_responses
from offgraph.server.api.anchor_schemas import (
    InferOutputTensor,
    InferResponse,
    KServeModelMetadata,
    MetadataTensor,
    ModelReady,
    ServerLive,
    ServerMetadata,
    ServerReady,
)
from offgraph.server.api.deps import Holder, State, VersionNumber, readiness
from offgraph.server.api.kserve_body import InferBody, Inference
from offgraph.server.api.model_inputs import describe_inputs, shape
from offgraph.server.api.predict_scoring import score_tensors, scored
from offgraph.server.api.schemas import ErrorResponse
from offgraph.server.api.tensor_inputs import metadata_datatype
from offgraph.server.api.version_status import serving_version
from offgraph.server.models.experiment import Arm
from offgraph.server.models.served import ModelHolder
from offgraph.server.process.metrics import START_KEY

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


OUTPUT = "scores"
"""The one output: the scores, in candidate order, FP32 (the model metadata's output, the infer answer's)."""


def describe_model(holder: ModelHolder, version: int | None) -> KServeModelMetadata:
    """The model metadata of the version that serves (``version``: that one), REST's and gRPC's."""
    sv = serving_version(holder, version)
    # what infer takes (offgraph.server.api.tensor_inputs): one element per candidate ([1]: a request-scope input
    # given once), then -1 for an input that takes a list of values per candidate
    inputs = [
        MetadataTensor(
            name=i.name,
            datatype=metadata_datatype(i),  # type: ignore[arg-type]
            shape=shape(i),
            parameters={"scope": i.scope},
        )
        for i in describe_inputs(sv.scorer.spec)
    ]
    outputs = [
        MetadataTensor(name=OUTPUT, datatype="FP32", shape=[-1], parameters={"score_kind": sv.scorer.score_kind})
    ]
    return KServeModelMetadata(
        name=holder.name, versions=[str(sv.version)], platform=PLATFORM, inputs=inputs, outputs=outputs
    )


@router.get("/v2/models/{name}", summary="Model metadata (KServe v2)", responses=_MODEL_ERRORS)
async def model_metadata(holder: Holder) -> KServeModelMetadata:
    """The served version's raw inputs (datatype, shape, scope) and its output `scores`: what `/infer` takes and
    gives."""
    return describe_model(holder, None)


@router.get(
    "/v2/models/{name}/versions/{version}", summary="One version's metadata (KServe v2)", responses=_MODEL_ERRORS
)
async def version_metadata(holder: Holder, version: VersionNumber) -> KServeModelMetadata:
    """As `/v2/models/{name}`, for the version that must be the served one (404 otherwise)."""
    return describe_model(holder, version)


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


# -- inference -----------------------------------------------------------------------------------------------------
_INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    **error_key_responses(
        e400="A request the model cannot score, the message naming the input: an unknown or repeated input, a "
        "datatype the input does not take, shapes that disagree with the data or with each other, bad binary data "
        "(`Inference-Header-Content-Length`, `binary_data_size`), too many candidates, a value the feature "
        "generation refuses, a bad label; or an invalid model name or version.",
        e404="Unknown model, or the version (or label) asked for does not serve.",
        e415="The body's Content-Type is not JSON (without the binary extension's header).",
        e503="The model's first load is under way, or its store failed to read: retry (`Retry-After`).",
    ),
    413: {
        "model": AnchorError | ErrorResponse,
        "description": 'Body larger than the server\'s limit (`--max-body-mb`): before any route, `{"detail": ...}`.',
    },
    200: {
        "description": "The scores. With binary outputs asked for (`binary_data_output`, or an output's "
        "`binary_data`), the body is this JSON (its length in `Inference-Header-Content-Length`) followed by the "
        "scores as little-endian FP32.",
    },
}
_INFER_DOC = (
    "KServe v2 (open inference protocol) inference: the candidates' raw features as named tensors, one element per "
    "candidate (`[N]` or `[N, 1]`); a request-scope input given once (`[1]`) or the same for every candidate. "
    'A list of values per candidate is `[N, K]`, padded with "" (no value). Datatypes as `GET /v2/models/{name}` '
    "says (or a compatible one). The binary tensor "
    "extension is taken (`Inference-Header-Content-Length`, inputs' `binary_data_size`). `parameters.label` picks "
    "a labelled version. The answer's output `scores` (FP32 `[N]`) are the scores `:score` gives for those "
    'candidates. Errors are `{"error": ...}`, 400 for any request the model cannot score.'
)
_parser = InferBody()
_infer_router = APIRouter(tags=["kserve v2"], route_class=BadRequestRoute)


async def _infer_body(request: Request) -> Inference:
    return await _parser.parse(request)


InferBodyDep = Annotated[Inference, Depends(_infer_body)]


def _answer(holder: ModelHolder, served: int | None, scores: np.ndarray, body: Inference, arm: Arm | None) -> Response:
    n = len(scores)
    said = {
        "model_name": holder.name,
        "model_version": None if served is None else str(served),
        "id": body.id,
        "parameters": None if arm is None else {"arm": arm.name},
    }
    if not body.binary_output:
        out = InferOutputTensor(name=OUTPUT, datatype="FP32", shape=[n], data=scores.tolist())
        answer = InferResponse(**said, outputs=[out])
        return Response(answer.model_dump_json(exclude_none=True), media_type="application/json")
    data = np.asarray(scores, dtype="<f4").tobytes()
    out = InferOutputTensor(name=OUTPUT, datatype="FP32", shape=[n], parameters={"binary_data_size": len(data)})
    head = InferResponse(**said, outputs=[out]).model_dump_json(exclude_none=True).encode()
    return Response(
        head + data,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(head))},
    )


async def _infer(holder: ModelHolder, state: Any, request: Request, body: Inference, version: int | None) -> Response:
    started = request.scope.get(START_KEY, 0.0)
    args = (body.tensors, version, body.label, state.config.max_candidates)
    served, scores, arm = await scored(state, holder, started, version, body.label, score_tensors, *args)
    return _answer(holder, served, scores, body, arm)


def _request_body() -> dict[str, Any]:
    """The infer operation's ``requestBody`` (its JSON; the binary extension is in the description)."""
    return _parser.openapi_extra(inline=True)  # the tensors' schemas: not among the app's components


@_infer_router.post(
    "/v2/models/{name}/infer",
    summary="Inference (KServe v2)",
    description=_INFER_DOC,
    response_model=InferResponse,
    responses=_INFER_ERRORS,
    openapi_extra=_request_body(),
)
async def infer(body: InferBodyDep, holder: Holder, state: State, request: Request) -> Response:
    return await _infer(holder, state, request, body, None)


@_infer_router.post(
    "/v2/models/{name}/versions/{version}/infer",
    summary="Inference with a version (KServe v2)",
    description=_INFER_DOC + " The version must serve, by default or labelled (404 otherwise).",
    response_model=InferResponse,
    responses=_INFER_ERRORS,
    openapi_extra=_request_body(),
)
async def infer_version(
    body: InferBodyDep, holder: Holder, state: State, request: Request, version: VersionNumber
) -> Response:
    return await _infer(holder, state, request, body, version)


router.include_router(_infer_router)

"""TensorFlow Serving's REST API, beside offgraph's own: ``:predict``, model status and metadata.

``POST /v1/models/{name}[/versions/{v}]:predict`` takes ``{"instances": [...], "context": {...}}``
(``offgraph.server.api.tfserving_body``) and answers ``{"predictions": [...]}``, or takes the columnar
``{"inputs": {...}}`` and answers ``{"outputs": [...]}``: the request and candidates it stands for are scored
by the ``:score`` path itself (``offgraph.server.api.predict_scoring``: ``ModelHolder.score`` in the scoring pool,
the same metrics), so the scores are the same. ``GET /v1/models/{name}/versions/{v}`` is TF Serving's model status
of one version (``GET /v1/models/{name}`` carries ``model_version_status`` for all of them),
``GET /v1/models/{name}[/versions/{v}]/metadata`` the ``serving_default`` signature of the served version.
``/labels/{label}`` stands in for ``/versions/{v}`` on each of these routes: the version the label names.
Errors are ``{"error": ...}`` (``offgraph.server.api.anchor_errors``).
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from offgraph.server.api.anchor_errors import AnchorError, ErrorKeyRoute, error_key_responses
from offgraph.server.api.anchor_schemas import (
    ColumnarPredictResponse,
    MetadataBody,
    ModelMetadata,
    ModelSpec,
    PredictResponse,
    SignatureDef,
    SignatureDefMap,
    TensorDim,
    TensorInfo,
    TensorShape,
    VersionStatusList,
)
from offgraph.server.api.deps import Holder, LabelName, PathView, State, VersionNumber
from offgraph.server.api.model_inputs import describe_inputs, shape
from offgraph.server.api.predict_scoring import ArmChoice, Scored, score_json_columns, score_rows, scored
from offgraph.server.api.schemas import ErrorResponse
from offgraph.server.api.state import ServerState
from offgraph.server.api.tfserving_body import PredictBody
from offgraph.server.api.version_status import serving_version, version_status
from offgraph.server.config import ServerConfig
from offgraph.server.http import path_convertors  # noqa: F401 - registers the no_colon convertor
from offgraph.server.http.errors import ApiError
from offgraph.server.models.served import ModelHolder
from offgraph.server.process.metrics import START_KEY

SIGNATURE = "serving_default"

_NAME_ERRORS = {"e400": "Invalid model name or version.", "e404": "Unknown model, or the version is not served."}
_PREDICT_ERRORS = {
    **error_key_responses(
        **_NAME_ERRORS,
        e415="The body's Content-Type is not JSON.",
        e422="Invalid body: the message names the problem (as for `:score`), or a request-scope input with two "
        "values in the instances (naming the input).",
        e503="The model's first load is under way, or its store failed to read: retry (`Retry-After`).",
    ),
    413: {
        "model": AnchorError | ErrorResponse,
        "description": "Body larger than the server's limit. A Content-Length over it is refused before any "
        'route, as on every route, with `{"detail": ...}`.',
    },
}
_STATUS_ERRORS = error_key_responses(**_NAME_ERRORS, e503="The model's first load is under way (`Retry-After`).")


def score_instances(
    holder: ModelHolder, body: Any, version: int | None, label: str | None, experiment: ArmChoice | None = None
) -> Scored:
    """The row format's ``body.instances`` sharing ``body.context``, scored (in a scoring thread)."""
    return score_rows(holder, body.instances, body.context, version, label, experiment=experiment)


async def _predict(
    holder: ModelHolder, state: ServerState, request: Request, body: Any, version: int | None, label: str | None = None
) -> Response:
    started = request.scope.get(START_KEY, 0.0)
    out: PredictResponse | ColumnarPredictResponse
    if body.inputs is None:  # the row format
        served, scores, arm = await scored(
            state, holder, started, version, label, score_instances, body, version, label
        )
        out = PredictResponse(predictions=scores.tolist())
    else:  # the columnar format: the named columns, read as the version's inputs
        limit = state.config.max_candidates
        args = (body.inputs, version, label, limit)
        served, scores, arm = await scored(state, holder, started, version, label, score_json_columns, *args)
        out = ColumnarPredictResponse(outputs=scores.tolist())
    if arm is not None:  # in an experiment: the arm and version that answered, as :score names them
        out.arm = arm.name
        if served is not None:  # the prior arm is no version
            out.version = served
    # pydantic's own encoder, as :score (FastAPI's default path would render each float in Python)
    return Response(out.model_dump_json(exclude_unset=True), media_type="application/json")


def build_router(config: ServerConfig) -> APIRouter:
    """The router (per app: the predict body's instances are bounded by the app's --max-candidates)."""
    router = APIRouter(tags=["tensorflow serving"], route_class=ErrorKeyRoute)
    parser = PredictBody(config.max_candidates)

    async def predict_body(request: Request) -> Any:
        return await parser.parse(request)

    Body = Annotated[Any, Depends(predict_body)]  # noqa: N806 - a type (local: no postponed annotations here)

    predict_doc = (
        "TensorFlow Serving's row format: one instance per candidate, scores in instance order (the same as "
        "`:score` gives). Request-scope inputs go once in `context`, or in the instances (whole rows), with the "
        "same value in each: two values are a 422 naming the input. Or its columnar format: `inputs`, one list "
        "per input name (one value per candidate; a request-scope input may be a list of one), answered "
        '`{"outputs": [...]}`. Errors are `{"error": ...}`.'
    )

    @router.post(
        "/v1/models/{name}:predict",
        response_model=PredictResponse | ColumnarPredictResponse,
        summary="Predict (TensorFlow Serving)",
        description=predict_doc,
        responses=_PREDICT_ERRORS,
        openapi_extra=parser.openapi_extra(),
    )
    async def predict_served(body: Body, holder: Holder, state: State, request: Request) -> Response:
        return await _predict(holder, state, request, body, None)

    @router.post(
        "/v1/models/{name}/versions/{version}:predict",
        response_model=PredictResponse | ColumnarPredictResponse,
        summary="Predict with a version (TensorFlow Serving)",
        description=predict_doc + " The version must serve, by default or labelled (404 otherwise).",
        responses=_PREDICT_ERRORS,
        openapi_extra=parser.openapi_extra(),
    )
    async def predict_version(
        body: Body, holder: Holder, state: State, request: Request, version: VersionNumber
    ) -> Response:
        return await _predict(holder, state, request, body, version)

    @router.post(
        "/v1/models/{name}/labels/{label}:predict",
        response_model=PredictResponse | ColumnarPredictResponse,
        summary="Predict with a labelled version (TensorFlow Serving)",
        description=predict_doc + " Scored by the version the label names (404 for an unknown label).",
        responses=_PREDICT_ERRORS,
        openapi_extra=parser.openapi_extra(),
    )
    async def predict_label(body: Body, holder: Holder, state: State, request: Request, label: LabelName) -> Response:
        return await _predict(holder, state, request, body, None, label)

    @router.get(
        "/v1/models/{name}/labels/{label:no_colon}",
        summary="A labelled version's status (TensorFlow Serving)",
        responses=_STATUS_ERRORS,
    )
    async def get_label_status(holder: Holder, label: LabelName, view: PathView) -> VersionStatusList:
        """TensorFlow Serving's model status of the version the label names (404 for an unknown label)."""
        version = holder.labels.get(label)
        found = [s for s in version_status(holder) if version is not None and s["version"] == str(version)]
        if not found:
            raise ApiError(404, f"model '{holder.name}' has no label '{label[:40]}' (labels: {sorted(holder.labels)})")
        return VersionStatusList(model_version_status=view(found))

    @router.get(
        "/v1/models/{name}/labels/{label}/metadata",
        summary="A labelled version's metadata (TensorFlow Serving)",
        responses=_STATUS_ERRORS,
    )
    async def get_label_metadata(holder: Holder, label: LabelName) -> ModelMetadata:
        """As `/v1/models/{name}/metadata`, for the version the label names."""
        return metadata(holder, None, label)

    @router.get(
        "/v1/models/{name}/versions/{version:no_colon}",
        summary="One version's status (TensorFlow Serving)",
        responses=_STATUS_ERRORS,
    )
    async def get_version_status(holder: Holder, version: VersionNumber, view: PathView) -> VersionStatusList:
        """TensorFlow Serving's model status of one version: AVAILABLE (served), LOADING, or END (served before,
        or refused, with the reason). 404 for a version the server has not tried."""
        found = [s for s in version_status(holder) if s["version"] == str(version)]
        if not found:
            raise ApiError(404, f"version {version} of model '{holder.name}' is not known to the server")
        return VersionStatusList(model_version_status=view(found))

    @router.get("/v1/models/{name}/metadata", summary="Model metadata (TensorFlow Serving)", responses=_STATUS_ERRORS)
    async def get_metadata(holder: Holder) -> ModelMetadata:
        """The served version's `serving_default` signature: its raw inputs (dtype, shape, scope) and its output
        `predictions`."""
        return metadata(holder, None)

    @router.get(
        "/v1/models/{name}/versions/{version}/metadata",
        summary="One version's metadata (TensorFlow Serving)",
        responses=_STATUS_ERRORS,
    )
    async def get_version_metadata(holder: Holder, version: VersionNumber) -> ModelMetadata:
        """As `/v1/models/{name}/metadata`, for the version, which must serve (404 otherwise)."""
        return metadata(holder, version)

    return router


def _tensor(name: str, dtype: str, dims: list[int], **extra: Any) -> TensorInfo:
    dim = [TensorDim(size=str(d)) for d in dims]
    return TensorInfo(dtype=dtype, tensor_shape=TensorShape(dim=dim), name=name, **extra)  # type: ignore[arg-type]


def metadata(holder: ModelHolder, version: int | None, label: str | None = None) -> ModelMetadata:
    sv = serving_version(holder, version, label)
    inputs = {
        i.name: _tensor(i.name, "DT_DOUBLE" if i.number else "DT_STRING", shape(i), scope=i.scope)
        for i in describe_inputs(sv.scorer.spec)
    }
    outputs = {"predictions": _tensor("predictions", "DT_FLOAT", [-1], score_kind=sv.scorer.score_kind)}
    signature = SignatureDef(inputs=inputs, outputs=outputs)
    return ModelMetadata(
        model_spec=ModelSpec(name=holder.name, signature_name=SIGNATURE, version=str(sv.version)),
        metadata=MetadataBody(signature_def=SignatureDefMap(signature_def={SIGNATURE: signature})),
    )

"""GET /v1/models and /v1/models/{name}: what is on disk, what is served, how fresh.

Without the admin token, absolute paths are shown relative to MODELS (``offgraph.server.http.redact``).
"""

from __future__ import annotations

from fastapi import APIRouter

from offgraph.server.api.deps import Holder, PathView, State
from offgraph.server.api.model_status import model_status
from offgraph.server.api.schemas import ModelList, ModelStatus, error_responses
from offgraph.server.http import path_convertors  # noqa: F401 - registers the no_colon convertor

router = APIRouter(tags=["models"])


@router.get("/v1/models", summary="List the models")
async def list_models(state: State, view: PathView) -> ModelList:
    """Every model under MODELS with its versions on disk, the loaded version and its state.
    Paths are relative to MODELS unless the request holds the admin bearer token."""
    return ModelList(models=[ModelStatus(**view(model_status(h))) for h in state.models.all()])


@router.get(
    "/v1/models/{name:no_colon}",
    summary="One model's status",
    responses=error_responses(e400="Invalid model name.", e404="Unknown model."),
)
async def get_model(holder: Holder, state: State, view: PathView) -> ModelStatus:
    """Versions on disk, the loaded version (quantization, row counts, training metrics, store counters and
    freshness), the version being loaded, refused versions with their reasons. Paths are relative to MODELS
    unless the request holds the admin bearer token."""
    return ModelStatus(**view(model_status(holder)))

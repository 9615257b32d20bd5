"""GET /v1/models and /v1/models/{name}: what is on disk, what is served, how fresh."""
from __future__ import annotations

from fastapi import APIRouter

from server.deps import Holder, State
from server.schemas import ErrorResponse, ModelList, ModelStatus

router = APIRouter(tags=["models"])


@router.get("/v1/models", summary="List the models")
async def list_models(state: State) -> ModelList:
    """Every model under MODELS with its versions on disk, the loaded version and its state."""
    return ModelList(models=[ModelStatus(**state.models.status(h)) for h in state.models.all()])


@router.get("/v1/models/{name}", summary="One model's status",
            responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}})
async def get_model(holder: Holder, state: State) -> ModelStatus:
    """Versions on disk, the loaded version (quantization, row counts, training metrics, store counters and
    freshness), the version being loaded, refused versions with their reasons."""
    return ModelStatus(**state.models.status(holder))

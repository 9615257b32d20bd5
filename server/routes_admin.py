"""Admin actions (bearer token): :load, :unload, :rollback. They wait for the loader thread, and with
several workers, until every worker has followed the decision (``server.control``)."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from server.deps import ModelName, State, require_admin
from server.errors import ApiError
from server.registry import AdminError
from server.schemas import ErrorResponse, LoadRequest, ModelStatus

router = APIRouter(tags=["admin"], dependencies=[Depends(require_admin)], responses={
    401: {"model": ErrorResponse, "description": "Missing or wrong bearer token."},
    403: {"model": ErrorResponse, "description": "No admin token configured: admin actions are disabled."},
    404: {"model": ErrorResponse, "description": "Unknown model or version."},
    409: {"model": ErrorResponse, "description": "The version was refused (the reason is given) or there is "
                                                  "nothing to roll back to."},
    504: {"model": ErrorResponse, "description": "Several workers: not every worker followed in time."},
})

WORKERS_WAIT_S = 300.0
"""How long an admin call waits for the other workers (each may have a version to load and warm up)."""


async def _run(state, name: str, fn, *args) -> ModelStatus:
    models = state.models
    try:
        await models.run_in_loader(fn, name, *args)
        decision = await models.run_in_loader(models.record_decision, name)
        if decision is not None:
            await models.wait_for_workers(decision, WORKERS_WAIT_S)
    except AdminError as e:
        raise ApiError(e.status, e.detail) from None
    return ModelStatus(**state.models.status(state.models.holders[name]))


@router.post("/v1/models/{name}:load", summary="Load and pin a version")
async def load(name: ModelName, body: LoadRequest, state: State) -> ModelStatus:
    """Load `version` in the background, warm it up and swap it in; the model then stays on it (pinned).
    Without `version`, the model follows the newest complete version again."""
    return await _run(state, name, state.models.load, body.version)


@router.post("/v1/models/{name}:unload", summary="Unload the model")
async def unload(name: ModelName, state: State) -> ModelStatus:
    """Stop serving the model (in-flight requests finish); it stays unloaded until `:load`."""
    return await _run(state, name, state.models.unload)


@router.post("/v1/models/{name}:rollback", summary="Roll back to the previous version")
async def rollback(name: ModelName, state: State) -> ModelStatus:
    """Load the version served before the current one and pin it."""
    return await _run(state, name, state.models.rollback)

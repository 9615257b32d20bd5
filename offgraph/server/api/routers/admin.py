"""Admin actions (bearer token): :load, :unload, :rollback, and version labels. A call the model's state refuses
(unknown model or version, ...) is refused at once; the others wait for the loader thread, a bounded number of them
for a bounded time (``ModelRegistry.admin``: else 429 with Retry-After), and with several workers, until every
worker has followed the decision (``offgraph.server.models.control``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from offgraph.server.api.deps import LabelName, ModelName, State, require_admin
from offgraph.server.api.model_status import model_status
from offgraph.server.api.schemas import LabelRequest, LoadRequest, ModelStatus, error_responses
from offgraph.server.api.score_body import JsonBody
from offgraph.server.http import path_convertors  # noqa: F401 - registers the no_colon convertor
from offgraph.server.http.errors import ApiError
from offgraph.server.models.registry import ADMIN_BUSY, AdminAction, AdminError

router = APIRouter(
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses=error_responses(
        e400="Invalid model name or label.",
        e401="Missing or wrong bearer token.",
        e403="No admin token configured: admin actions are disabled.",
        e404="Unknown model, version or label.",
        e409="The version was refused (the reason is given), there is nothing to roll back to, or the model "
        "serves nothing to label.",
        **{
            f"e{ADMIN_BUSY}": "Not done: the model's admin queue is full (--admin-queue) or the call's turn did not "
            "come in time (--admin-wait-seconds: a version load is in progress); retry after Retry-After."
        },
        e503="Done, but the decision could not be saved under MODELS (it would not survive a restart).",
        e504="Several workers: not every worker followed in time.",
    ),
)

_load_body = JsonBody(LoadRequest, "load body")
_label_body = JsonBody(LabelRequest, "label body")
_BODY_ERRORS = error_responses(
    e413="Body larger than the server's limit.",
    e415="The body's Content-Type is not JSON.",
    e422="Invalid body: the message names each problem.",
)


async def load_request(request: Request, _: Annotated[None, Depends(require_admin)]) -> LoadRequest:
    """The :load body, read only once the token is checked: a malformed body without the token is a 401."""
    return await _load_body.parse(request)


async def label_request(request: Request, _: Annotated[None, Depends(require_admin)]) -> LabelRequest:
    """The label body, read once the token is checked (as :load's)."""
    return await _label_body.parse(request)


WORKERS_WAIT_S = 300.0
"""How long an admin call waits for the other workers (each may have a version to load and warm up)."""


async def _run(state, name: str, action: AdminAction, *args) -> ModelStatus:
    models = state.models
    try:
        decision = await models.admin(action, name, *args)
        if decision is not None:
            await models.wait_for_workers(decision, WORKERS_WAIT_S)
    except AdminError as e:
        raise ApiError(e.status, e.detail, headers=e.headers) from None
    return ModelStatus(**model_status(models.holders[name]))


@router.post(
    "/v1/models/{name}:load",
    summary="Load and pin a version",
    openapi_extra=_load_body.openapi_extra(),
    responses=_BODY_ERRORS,
)
async def load(name: ModelName, body: Annotated[LoadRequest, Depends(load_request)], state: State) -> ModelStatus:
    """Load `version` in the background, warm it up and swap it in; the model then stays on it (pinned).
    Without `version`, the model follows the newest complete version again."""
    return await _run(state, name, "load", body.version)


@router.post("/v1/models/{name}:unload", summary="Unload the model")
async def unload(name: ModelName, state: State) -> ModelStatus:
    """Stop serving the model (in-flight requests finish); it stays unloaded until `:load`."""
    return await _run(state, name, "unload")


@router.post("/v1/models/{name}:rollback", summary="Roll back to the previous version")
async def rollback(name: ModelName, state: State) -> ModelStatus:
    """Load the version served before the current one and pin it."""
    return await _run(state, name, "rollback")


@router.put(
    "/v1/models/{name}/labels/{label:no_colon}",
    summary="Label a version (canary)",
    openapi_extra=_label_body.openapi_extra(),
    responses=_BODY_ERRORS,
)
async def set_label(
    name: ModelName, label: LabelName, body: Annotated[LabelRequest, Depends(label_request)], state: State
) -> ModelStatus:
    """Name `version` by `label` (`stable`, `canary`; at most 4 labels a model). A version that does not serve
    is loaded, verified and warmed up beside the default one first, and the versions of the model that serve
    then share its memory budget equally. Requests with `"label"` (`:score`) or to `/labels/{label}:predict`
    are scored by it; the others still go to the default version (the newest, or the pinned one). Kept
    under MODELS across restarts."""
    return await _run(state, name, "set_label", label, body.version)


@router.delete("/v1/models/{name}/labels/{label:no_colon}", summary="Remove a label")
async def remove_label(name: ModelName, label: LabelName, state: State) -> ModelStatus:
    """Remove the label; a version no label names any more, and that is not the default, stops serving (its
    in-flight requests finish) and its memory goes back to the others."""
    return await _run(state, name, "remove_label", label)

"""FastAPI dependencies: the app's shared state, model lookup and admin authorization.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in its thread
pool, which would cost a thread hop each on the request path; these never block.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from offgraph.modeldir.manifest import (
    MODEL_NAME_MAX,
    MODEL_NAME_PATTERN,
    MODEL_NAME_RULE,
    ModelDirError,
    check_model_name,
)
from offgraph.server.config import ADMIN_TOKEN_ENV
from offgraph.server.control import LABEL, LABEL_PATTERN, LABEL_RULE
from offgraph.server.errors import ApiError
from offgraph.server.redact import token_matches
from offgraph.server.served import ModelHolder
from offgraph.server.state import ServerState


async def get_state(request: Request) -> ServerState:
    return request.state.server


State = Annotated[ServerState, Depends(get_state)]


# check_model_name's rule as a JSON Schema (documentation only: the dependency answers 400, not FastAPI's 422)
MODEL_NAME_SCHEMA = {"pattern": MODEL_NAME_PATTERN, "minLength": 1, "maxLength": MODEL_NAME_MAX}


async def model_name(
    name: Annotated[
        str,
        Path(
            description=f"Model name: the directory MODELS/<name>/ "
            f"({MODEL_NAME_RULE}). Any other name is a 400 naming the rule.",
            json_schema_extra=MODEL_NAME_SCHEMA,
        ),
    ],
) -> str:
    """A valid model name (``check_model_name``: no path separators, whitespace, control characters or '..');
    400 otherwise. Every route taking a name depends on it."""
    try:
        return check_model_name(name)
    except ModelDirError as e:
        raise ApiError(400, str(e)) from None


ModelName = Annotated[str, Depends(model_name)]


async def label_name(
    label: Annotated[
        str,
        Path(
            description=f"Version label (`stable`, `canary`): {LABEL_RULE}. Any other label is a 400.",
            json_schema_extra={"pattern": LABEL_PATTERN},
        ),
    ],
) -> str:
    """A valid version label (``LABEL_PATTERN``); 400 naming the rule otherwise. Every route taking a label
    depends on it."""
    if not LABEL.fullmatch(label):
        raise ApiError(400, f"invalid label {label[:40]!r}: {LABEL_RULE}")
    return label


LabelName = Annotated[str, Depends(label_name)]


async def get_holder(name: ModelName, state: State) -> ModelHolder:
    holder = state.models.holders.get(name)
    if holder is None:
        raise ApiError(404, f"unknown model '{name}' (served models: {sorted(state.models.holders)})")
    return holder


Holder = Annotated[ModelHolder, Depends(get_holder)]

_bearer = HTTPBearer(auto_error=False, description="Admin token (--admin-token or " + ADMIN_TOKEN_ENV + ")")


async def require_admin(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    token = state.config.admin_token
    if token is None:
        raise ApiError(403, f"admin actions are disabled: start the server with --admin-token or {ADMIN_TOKEN_ENV}")
    if credentials is None:
        raise ApiError(
            401, "admin action needs 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"}
        )
    if not token_matches(token, credentials.credentials):
        raise ApiError(401, "wrong admin token", headers={"WWW-Authenticate": "Bearer"})

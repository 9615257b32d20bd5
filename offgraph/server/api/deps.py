"""FastAPI dependencies: the app's shared state, model lookup and admin authorization, and whatever else
more than one router uses (a version in the path, the path redaction of a status, the server's readiness):
the routers import this module, never each other.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in its thread
pool, which would cost a thread hop each on the request path; these never block.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from offgraph.modeldir.manifest import (
    MODEL_NAME_MAX,
    MODEL_NAME_PATTERN,
    MODEL_NAME_RULE,
    ModelDirError,
    check_model_name,
)
from offgraph.server.api.schemas import Readiness
from offgraph.server.api.state import ServerState
from offgraph.server.config import ADMIN_TOKEN_ENV
from offgraph.server.http.errors import ApiError
from offgraph.server.http.redact import path_view, redacted_view, token_matches, view_for
from offgraph.server.models.control import LABEL, LABEL_PATTERN, LABEL_RULE
from offgraph.server.models.experiment import Experiments
from offgraph.server.models.served import ModelHolder
from offgraph.server.process.graceful_stop import draining

STOPPING = "the server is stopping (SIGTERM or SIGINT): it answers requests until its drain ends (--drain-seconds)"
NO_MODEL = (
    "no model found in MODELS: a model is a directory MODELS/NAME holding versions MODELS/NAME/VERSION "
    "(each with its manifest.json)"
)


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


async def get_experiments(request: Request) -> Experiments:
    """The models' experiments (``create_app`` keeps them in ``app.state``; the score route reads them too)."""
    return request.app.state.experiments


ModelExperiments = Annotated[Experiments, Depends(get_experiments)]

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


_VERSION = re.compile(r"[0-9]{1,18}")


async def version_number(
    version: Annotated[
        str,
        Path(
            description="Model version: a non-negative integer (any other value is a 400).",
            json_schema_extra={"pattern": "^[0-9]{1,18}$"},
        ),
    ],
) -> int:
    if not _VERSION.fullmatch(version):
        raise ApiError(400, f"invalid version {version[:40]!r}: a version is a non-negative integer")
    return int(version)


VersionNumber = Annotated[int, Depends(version_number)]


PathView = Annotated[Callable[[Any], Any], Depends(path_view)]
"""The status renderer of the request: absolute paths relative to MODELS unless it holds the admin token."""


async def readiness(state: ServerState, request: Request | None) -> Readiness:
    """Whether the server is ready (``/readyz``, KServe's ``/v2/health/ready``, gRPC health), and why not
    (``request``: whose view of paths the reason takes; None: paths redacted, as for a caller without the token)."""
    models = {h.name: h.state for h in state.models.all()}
    if draining():  # first: load balancers must take a stopping server out whatever its models' state
        return Readiness(ready=False, models=models, detail=STOPPING)
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
        detail = "not serving: " + "; ".join(waiting)  # reasons may name directories
        view = view_for(request) if request is not None else redacted_view(state.config.models_dir)
        detail = view(detail)
    return Readiness(ready=False, models=models, detail=detail)

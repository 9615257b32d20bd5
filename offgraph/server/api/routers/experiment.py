"""Admin (bearer token): a model's online experiment, ``PUT``/``GET``/``DELETE /v1/models/{name}/experiment``.
The assignment, layout and record: ``offgraph.server.models.experiment``."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from offgraph.server.api.deps import Holder, ModelExperiments, ModelName, require_admin
from offgraph.server.api.schemas import ExperimentRequest, ExperimentStatus, error_responses
from offgraph.server.api.score_body import JsonBody
from offgraph.server.http.errors import ApiError
from offgraph.server.models.experiment import Arm, Experiment
from offgraph.server.models.served import ModelHolder

router = APIRouter(
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses=error_responses(
        e400="Invalid model name.",
        e401="Missing or wrong bearer token.",
        e403="No admin token configured: admin actions are disabled.",
        e404="Unknown model, or (GET, DELETE) the model has no experiment.",
    ),
)

_body = JsonBody(ExperimentRequest, "experiment body")
PATH = "/v1/models/{name}/experiment"


async def experiment_request(request: Request, _: Annotated[None, Depends(require_admin)]) -> ExperimentRequest:
    """The PUT body, read once the token is checked (a malformed body without the token is a 401)."""
    return await _body.parse(request)


def _status(name: str, exp: Experiment) -> ExperimentStatus:
    return ExperimentStatus(model=name, **exp.as_json())


def _not_served(holder: ModelHolder, arm: Arm) -> str | None:
    """Why ``arm`` cannot serve now (None: it can): a label the model lacks, a version that does not serve."""
    if arm.kind == "prior":
        return None
    found = holder.peek(label=str(arm.ref)) if arm.kind == "label" else holder.peek(version=int(arm.ref or 0))
    if found is not None:
        return None
    if arm.kind == "label":
        labels = ", ".join(f"{k}={v}" for k, v in sorted(holder.labels.items())) or "none"
        return f"arm {arm.name!r}: model '{holder.name}' serves no version by label '{arm.ref}' (labels: {labels})"
    served = ", ".join(str(sv.version) for sv in holder.served()) or "none"
    return f"arm {arm.name!r}: version {arm.ref} of model '{holder.name}' does not serve (serving: {served})"


@router.put(
    PATH,
    summary="Set the model's experiment",
    openapi_extra=_body.openapi_extra(inline=True),  # ExperimentArm: no other route registers it
    responses=error_responses(
        e409="An arm names a label or version the model does not serve now (the message names it).",
        e413="Body larger than the server's limit.",
        e415="The body's Content-Type is not JSON.",
        e422="Invalid body: the message names each problem (weights not summing to 1, an arm given twice, an "
        "arm naming none or several of label, version and prior, too many arms).",
    ),
)
async def put_experiment(
    name: ModelName,
    body: Annotated[ExperimentRequest, Depends(experiment_request)],  # read first, as every route's body
    holder: Holder,
    experiments: ModelExperiments,
) -> ExperimentStatus:
    """Split the requests that name no version or label over `arms` by `sticky_key`: a user (a value of the
    key) stays in one arm across requests, workers and restarts. Changing the weights with the same salt moves
    only the users the change must move: an arm whose weight falls gives up the top of its ranges, one whose
    weight rises takes the freed ones. Requests without a value of the key are served by the first arm and
    counted (`offgraph_experiment_unassigned_total`). Kept under MODELS across restarts."""
    arms = [a.arm() for a in body.arms]
    problems = [p for p in (_not_served(holder, a) for a in arms) if p is not None]
    if problems:
        raise ApiError(409, "; ".join(problems))
    exp = await asyncio.to_thread(experiments.put, name, arms, body.sticky_key, body.salt)
    return _status(name, exp)


@router.get(PATH, summary="Show the model's experiment")
async def get_experiment(name: ModelName, holder: Holder, experiments: ModelExperiments) -> ExperimentStatus:
    """The model's experiment: its arms with their weights and the ranges of [0, 1) each owns."""
    exp = experiments.get(name)
    if exp is None:
        raise ApiError(404, f"model '{name}' has no experiment")
    return _status(name, exp)


@router.delete(PATH, summary="End the model's experiment")
async def delete_experiment(name: ModelName, holder: Holder, experiments: ModelExperiments) -> ExperimentStatus:
    """End the experiment (every request goes to the default version again); answers the experiment ended."""
    exp = await asyncio.to_thread(experiments.delete, name)
    if exp is None:
        raise ApiError(404, f"model '{name}' has no experiment")
    return _status(name, exp)

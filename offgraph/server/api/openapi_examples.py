"""Each served model's own example bodies in /openapi.json, so that /docs offers a body of the model's inputs.

The schema FastAPI builds knows no model (they are found after it is built, and come and go), so its
score body carries a neutral example only. ``install_model_examples`` wraps ``app.openapi``: each answer
is FastAPI's schema with, on the score and predict operations, one named example per served model (built
from its served version's spec by ``offgraph.server.api.body_examples``, an ids-only one too for a model with
feature tables) and the served names as examples of the ``name`` parameter. The result is kept until the
set of served versions changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from offgraph.features.spec import FeatureSpec
from offgraph.server.api.body_examples import example_body, ids_only_body
from offgraph.server.models.registry import ModelRegistry

SCORE_PATHS = ("/v1/models/{name}:score",)
PREDICT_PATHS = (
    "/v1/models/{name}:predict",
    "/v1/models/{name}/versions/{version}:predict",
    "/v1/models/{name}/labels/{label}:predict",
)

Served = tuple[tuple[str, int, FeatureSpec], ...]


def install_model_examples(app: FastAPI, models: ModelRegistry, max_candidates: int) -> None:
    """Wrap ``app.openapi`` (what /openapi.json answers) with the served models' examples."""
    build: Callable[[], dict[str, Any]] = app.openapi  # FastAPI's own: built once (again if routes are added)
    last: list[Any] = [None, None, None]  # FastAPI's schema, the served versions, the answer

    def openapi() -> dict[str, Any]:
        base, served = build(), _served(models)
        versions = tuple((name, version) for name, version, _ in served)
        if last[0] is not base or last[1] != versions:
            last[:] = [base, versions, with_model_examples(base, served, min(2, max_candidates))]
        return last[2]

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def _served(models: ModelRegistry) -> Served:
    out = []
    for h in models.all():
        sv = h.current
        if sv is not None:
            out.append((h.name, sv.version, sv.scorer.spec))
    return tuple(out)


def with_model_examples(schema: dict[str, Any], served: Served, candidates: int) -> dict[str, Any]:
    """``schema`` with the served models' examples (a copy along the paths it changes: ``schema`` is FastAPI's
    cached one)."""
    if not served:
        return schema
    score: dict[str, Any] = {}
    predict: dict[str, Any] = {}
    for name, version, spec in served:
        bodies = {name: (f"{name} (version {version}): every raw input of its spec", example_body(spec, candidates))}
        ids = ids_only_body(spec, candidates)
        if ids is not None:
            bodies[f"{name}, ids only"] = (f"{name}: the feature tables' keys only (the server fills the rest)", ids)
        for label, (summary, body) in bodies.items():
            score[label] = {"summary": summary, "value": body}
            predict[label] = {
                "summary": summary,
                "value": {"context": body["request"], "instances": body["candidates"]},
            }
    names = {name: {"summary": f"model {name}", "value": name} for name, _, _ in served}
    paths = dict(schema["paths"])
    for path, examples in [(p, score) for p in SCORE_PATHS] + [(p, predict) for p in PREDICT_PATHS]:
        if path in paths and "post" in paths[path]:
            paths[path] = {**paths[path], "post": _with_examples(paths[path]["post"], examples, names)}
    return {**schema, "paths": paths}


def _with_examples(op: dict[str, Any], bodies: dict[str, Any], names: dict[str, Any]) -> dict[str, Any]:
    body = op["requestBody"]
    media = body["content"]["application/json"]
    parameters = [
        {**p, "examples": names} if p.get("in") == "path" and p.get("name") == "name" else p
        for p in op.get("parameters", [])
    ]
    return {
        **op,
        "parameters": parameters,
        "requestBody": {**body, "content": {**body["content"], "application/json": {**media, "examples": bodies}}},
    }

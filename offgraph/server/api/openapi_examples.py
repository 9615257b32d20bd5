"""Each served model's own example bodies in /openapi.json, so that /docs offers a body of the model's inputs.

The schema FastAPI builds knows no model (they are found after it is built, and come and go), so its
score body carries a neutral example only. ``install_model_examples`` wraps ``app.openapi``: each answer
is FastAPI's schema with, on the score, predict and infer operations, one named example per served model (built
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
from offgraph.server.api.model_inputs import describe_inputs
from offgraph.server.api.tensor_inputs import metadata_datatype
from offgraph.server.models.registry import ModelRegistry

SCORE_PATHS = ("/v1/models/{name}:score",)
PREDICT_PATHS = (
    "/v1/models/{name}:predict",
    "/v1/models/{name}/versions/{version}:predict",
    "/v1/models/{name}/labels/{label}:predict",
)
INFER_PATHS = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")

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
    infer: dict[str, Any] = {}
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
            infer[label] = {"summary": summary, "value": infer_body(spec, body)}
    names = {name: {"summary": f"model {name}", "value": name} for name, _, _ in served}
    paths = dict(schema["paths"])
    for path, examples in (
        [(p, score) for p in SCORE_PATHS] + [(p, predict) for p in PREDICT_PATHS] + [(p, infer) for p in INFER_PATHS]
    ):
        if path in paths and "post" in paths[path]:
            paths[path] = {**paths[path], "post": _with_examples(paths[path]["post"], examples, names)}
    return {**schema, "paths": paths}


def infer_body(spec: FeatureSpec, body: dict[str, Any]) -> dict[str, Any]:
    """A score body as KServe v2 inputs (``offgraph.server.api.tensor_inputs``' conventions): the request's inputs
    once, the candidates' one element each, a list ``[N, K]`` padded with "" (no value)."""
    inputs = []
    for info in describe_inputs(spec):
        if info.scope == "request":
            values = [body["request"][info.name]] if info.name in body["request"] else []
        else:
            values = [c.get(info.name) for c in body["candidates"] if info.name in c]
        if not values:
            continue
        datatype = metadata_datatype(info)
        if datatype == "BYTES" and any(isinstance(v, list) for v in values):
            rows = [[str(x) for x in v] if isinstance(v, list) else [str(v)] for v in values]
            k = max(map(len, rows))
            data: list[Any] = [x for r in rows for x in r + [""] * (k - len(r))]
            shape = [len(rows), k]
        else:
            data, shape = [v if datatype == "FP64" else str(v) for v in values], [len(values)]
        inputs.append({"name": info.name, "datatype": datatype, "shape": shape, "data": data})
    return {"inputs": inputs}


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

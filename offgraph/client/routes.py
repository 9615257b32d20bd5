"""The HTTP API's calls, once for both clients: method, path, body, what may be retried, how the answer reads.

Routes and bodies are the server's (``offgraph/server/README.md``, API). Which calls are retried:

* ``GET /v1/models[/{name}]`` on a 503 and on a connection failure: reading changes nothing.
* ``POST :score`` on a 503 only. The server answers a score with 503 before it scores (the model's
  first load is under way; the connection cap, answered by uvicorn before the app), or when the
  scoring failed (a store read error: the version is marked unhealthy and the server falls back to
  the previous one; rows of the write feed rewritten while they were read). Scoring writes
  nothing, so a retry never applies anything twice. A connection that fails may have delivered the
  request or not: it is raised at once, as for any POST.
* admin calls never: their 503 means the action was done but could not be saved, and a second
  ``:rollback`` would roll back once more.
* ``/healthz`` and ``/readyz`` never: a probe says how the server is now.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from offgraph.client.errors import ApiError, error_for
from offgraph.client.results import ModelStatus, Readiness, ScoreResult, parse

T = TypeVar("T")

JSON = {"content-type": "application/json"}

Features = Mapping[str, Any]
"""Raw features by input name: a request's, or one candidate's."""


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[Any], T]  # the parsed JSON body of a success -> the result
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    retry_unavailable: bool = False
    retry_connection: bool = False
    admin: bool = False  # waits for a version to load: the client's admin timeout
    answers: frozenset[int] = frozenset({200})  # statuses that are results, not errors

    def result(self, response: httpx.Response) -> T:
        """The call's result from its answer, or the answer's typed error."""
        if response.status_code not in self.answers:
            raise error_for(response)
        try:
            return self.read(response.json())
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ApiError(
                f"unexpected answer to {self.method} {self.path}: {type(e).__name__}: {e}",
                status=response.status_code,
                body=response.text,
            ) from e


def _name(model: str) -> str:
    # quoted whole: a name with '/' or ':' stays one path segment, which the server refuses (400) by name
    return quote(model, safe="")


def _json(obj: Any) -> bytes:
    # NaN and Infinity are written as such (json's default) for the server to refuse with a 422 naming
    # the field, rather than failing here without saying where
    return json.dumps(obj).encode()


def score(
    model: str, request: Features, candidates: Sequence[Features], version: int | None, label: str | None = None
) -> Call[ScoreResult]:
    body: dict[str, Any] = {"request": dict(request), "candidates": [dict(c) for c in candidates]}
    if version is not None:
        body["version"] = version
    if label is not None:
        body["label"] = label
    return Call(
        "POST",
        f"/v1/models/{_name(model)}:score",
        lambda d: parse(ScoreResult, d),
        body=_json(body),
        headers=JSON,
        retry_unavailable=True,
    )


def models() -> Call[list[ModelStatus]]:
    return Call(
        "GET",
        "/v1/models",
        lambda d: [parse(ModelStatus, m) for m in d["models"]],
        retry_unavailable=True,
        retry_connection=True,
    )


def model(name: str) -> Call[ModelStatus]:
    return Call(
        "GET",
        f"/v1/models/{_name(name)}",
        lambda d: parse(ModelStatus, d),
        retry_unavailable=True,
        retry_connection=True,
    )


def admin(
    name: str,
    action: str,
    token: str | None,
    body: dict[str, Any] | None = None,
    method: str = "POST",
    path: str | None = None,
) -> Call[ModelStatus]:
    """``POST /v1/models/{name}:{action}`` (load, unload, rollback), or ``method path`` (labels), with
    ``Authorization: Bearer token`` (none without a token: the server answers 401)."""
    headers = {**JSON} if body is not None else {}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return Call(
        method,
        path or f"/v1/models/{_name(name)}:{action}",
        lambda d: parse(ModelStatus, d),
        body=None if body is None else _json(body),
        headers=headers,
        admin=True,
    )


def load(name: str, version: int | None, token: str | None) -> Call[ModelStatus]:
    return admin(name, "load", token, {} if version is None else {"version": version})


def set_label(name: str, label: str, version: int, token: str | None) -> Call[ModelStatus]:
    path = f"/v1/models/{_name(name)}/labels/{quote(label, safe='')}"
    return admin(name, "label", token, {"version": version}, method="PUT", path=path)


def remove_label(name: str, label: str, token: str | None) -> Call[ModelStatus]:
    path = f"/v1/models/{_name(name)}/labels/{quote(label, safe='')}"
    return admin(name, "label", token, None, method="DELETE", path=path)


def ready() -> Call[Readiness]:
    return Call("GET", "/readyz", lambda d: parse(Readiness, d), answers=frozenset({200, 503}))


def healthy() -> Call[bool]:
    return Call("GET", "/healthz", lambda d: d.get("status") == "ok")

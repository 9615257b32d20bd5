"""Error responses: every problem becomes ``{"detail": "<what is wrong>"[, "errors": [...]]}``.

Validation errors name the location of each problem (``candidates[3].genres``);
``offgraph.features.FeatureValueError`` (a bad raw value found by FG) is a 422. Details are rendered
without absolute paths unless the request holds the admin token (``offgraph.server.http.redact``).

Only a bug in the server or the scorer can give a 500: ``InternalErrorMiddleware`` logs its
traceback and answers a generic 500 (no exception text, no paths). It is an ordinary
middleware rather than an ``Exception`` handler on purpose: Starlette runs that handler in its
outermost ``ServerErrorMiddleware``, which re-raises after the response, and uvicorn then drops
the keep-alive connection without ``Connection: close``: the client's next request on it fails.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from offgraph.features import FeatureValueError
from offgraph.server.http.redact import view_for
from offgraph.server.http.route_match import allowed_methods

log = logging.getLogger("offgraph.server")

MAX_LISTED_ERRORS = 20


class ApiError(HTTPException):
    """An HTTP error with an explicit message."""


class BodyValidationError(RequestValidationError):
    """A JSON body its pydantic model refused: the 422 speaks of that body (``what``, e.g. "load body") and
    names the keys it takes, so that each route's errors are about its own body."""

    def __init__(self, errors: Sequence[Any], what: str, keys: Sequence[str]):
        super().__init__(errors)
        self.what, self.keys = what, tuple(keys)


def _quoted(keys: Sequence[str]) -> str:
    names = [f"'{k}'" for k in keys]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        if part in ("body",) and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "bool", "int", "float", "null", "list"):  # union branch tags of FeatureValue
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _describe(err: dict[str, Any], what: str, keys: Sequence[str]) -> tuple[str, str]:
    """(where, what is wrong) of one validation error in ``what`` (the body), whose top-level keys are ``keys``."""
    kind, msg = err.get("type"), err.get("msg", "invalid")
    if kind == "json_invalid":
        ctx = err.get("ctx") or {}
        loc = err.get("loc") or ()
        at = f" at position {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        return "body", f"not valid JSON: {ctx.get('error', msg)}{at}"
    where = _where(tuple(err.get("loc", ())))
    if kind == "finite_number":
        msg = "NaN and Infinity are not valid feature values (" + msg.lower() + ")"
    elif kind == "too_long" and where == "candidates":
        ctx = err.get("ctx") or {}
        msg = too_many_candidates(ctx.get("actual_length"), ctx.get("max_length"))  # type: ignore[arg-type]
    elif kind == "extra_forbidden":
        loc = [p for p in err.get("loc", ()) if p != "body"]
        name = str(loc[-1]) if loc else where
        msg = f"unknown field {name!r} in the {what}"
        if keys and len(loc) == 1:  # a top-level key: name the ones the body takes
            msg += f"; expected {_quoted(keys)}"
    return where, msg


def validation_detail(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    """(the 422's detail, its listed errors) of a validation error: REST's body and gRPC's message say the same."""
    errs = list(exc.errors())
    what, keys = (exc.what, exc.keys) if isinstance(exc, BodyValidationError) else ("request", ())
    described = [(*_describe(e, what, keys), e.get("type")) for e in errs[:MAX_LISTED_ERRORS]]
    more = f" (and {len(errs) - MAX_LISTED_ERRORS} more)" if len(errs) > MAX_LISTED_ERRORS else ""
    detail = f"invalid {what}: " + "; ".join(f"{w}: {m}" for w, m, _ in described) + more
    return detail, [{"loc": w, "msg": m, "type": t} for w, m, t in described]


def too_many_candidates(n: int, limit: int) -> str:
    """The words of a request over --max-candidates (REST's 422, gRPC's INVALID_ARGUMENT)."""
    return f"{n} candidates, at most {limit} per request (--max-candidates)"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, listed = validation_detail(exc)
        return JSONResponse({"detail": detail, "errors": listed}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        detail, headers = exc.detail, exc.headers
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405 and detail == "Method Not Allowed":
            detail = f"method {request.method} is not allowed on {request.url.path}"
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request.scope))}
        else:  # messages from the registry and the scorer may name directories
            return JSONResponse({"detail": view_for(request)(detail)}, status_code=exc.status_code, headers=headers)
        # A path no route takes belongs to neither API, so it answers with both one's key and the anchors'
        # ("error", TF Serving's and KServe's): a client of either reads the reason where it looks.
        return JSONResponse({"detail": detail, "error": detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(FeatureValueError)
    async def feature_value_error(request: Request, exc: FeatureValueError) -> JSONResponse:
        return JSONResponse({"detail": f"bad feature value: {exc}"}, status_code=422)


INTERNAL_ERROR = json.dumps(
    {"detail": "internal error: the server failed to answer this request; the details are in its log"}
).encode()


class InternalErrorMiddleware:
    """Pure ASGI, inside the user middlewares: an unexpected exception is logged with its traceback and
    answered with a generic JSON 500, and the keep-alive connection stays usable. An exception after the
    response has started cannot be answered: it is re-raised (uvicorn then closes the connection)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception:
            log.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(INTERNAL_ERROR)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": INTERNAL_ERROR})

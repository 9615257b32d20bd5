"""Error responses: every problem becomes ``{"detail": "<what is wrong>"[, "errors": [...]]}``.

Validation errors name the location of each problem (``candidates[3].genres``);
``features.FeatureValueError`` (a bad raw value found by FG) is a 422; only a bug
in the server or the scorer can give a 500, and it is logged with its traceback.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from features import FeatureValueError
from server.metrics import ServerMetrics

log = logging.getLogger("offgraph.server")

MAX_LISTED_ERRORS = 20


class ApiError(HTTPException):
    """An HTTP error with an explicit message."""


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


def _describe(err: dict[str, Any]) -> tuple[str, str]:
    """(where, what) of one validation error."""
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
        msg = (f"{ctx.get('actual_length')} candidates, at most {ctx.get('max_length')} per request "
               "(--max-candidates)")
    elif kind == "extra_forbidden":
        msg = "unknown key (the body holds 'request', 'candidates' and optionally 'version')"
    return where, msg


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = list(exc.errors())
        described = [(*_describe(e), e.get("type")) for e in errs[:MAX_LISTED_ERRORS]]
        more = f" (and {len(errs) - MAX_LISTED_ERRORS} more)" if len(errs) > MAX_LISTED_ERRORS else ""
        detail = "invalid request: " + "; ".join(f"{w}: {m}" for w, m, _ in described) + more
        listed = [{"loc": w, "msg": m, "type": t} for w, m, t in described]
        return JSONResponse({"detail": detail, "errors": listed}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405 and detail == "Method Not Allowed":
            detail = f"method {request.method} is not allowed on {request.url.path}"
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(FeatureValueError)
    async def feature_value_error(request: Request, exc: FeatureValueError) -> JSONResponse:
        return JSONResponse({"detail": f"bad feature value: {exc}"}, status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        metrics.errors.labels("500").inc()  # sent outside the counting middleware
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

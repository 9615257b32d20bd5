"""Errors of the TensorFlow Serving and KServe routes: ``{"error": "<what is wrong>"}``, as their clients read them.

``ErrorKeyRoute`` (the routers' ``route_class``) answers an exception of its route through the app's own
handler (``offgraph.server.http.errors``, ``offgraph.server.api.unavailable``: the same status, message, redaction and
headers, ``Retry-After`` included) and moves the message from ``detail`` to ``error``. The other routes keep
``{"detail": ...}``. An exception no handler takes is left to the 500 middleware. ``BadRequestRoute`` answers
400 where the others answer 422 (KServe v2's inference).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

from offgraph.server.api.schemas import VALIDATION_ERROR

_DROPPED = frozenset({"content-length", "content-type"})


class AnchorError(BaseModel):
    error: str = Field(description="What is wrong, in words.")


def error_key_responses(**descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for error codes, each an ``AnchorError``: ``error_key_responses(e404="...")``
    (a 422 is always listed, as FastAPI would otherwise document its own shape)."""
    out: dict[int | str, dict[str, Any]] = {
        int(code[1:]): {"model": AnchorError, "description": d} for code, d in descriptions.items()
    }
    out.setdefault(422, {"model": AnchorError, "description": VALIDATION_ERROR})
    return out


def _handler_for(request: Request, exc: Exception) -> Callable | None:
    handlers = request.app.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None


class ErrorKeyRoute(APIRoute):
    invalid_status = 422
    """The status of a request the route cannot use (the app's handlers answer 422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_with_error_key(request: Request) -> Response:
            try:
                return await handle(request)
            except Exception as exc:
                handler = _handler_for(request, exc)
                if handler is None:
                    raise
                answer = await handler(request, exc)
                body = json.loads(bytes(answer.body))
                headers = {k: v for k, v in answer.headers.items() if k not in _DROPPED}
                status = self.invalid_status if answer.status_code == 422 else answer.status_code
                return JSONResponse({"error": body["detail"]}, status_code=status, headers=headers)

        return handle_with_error_key


class BadRequestRoute(ErrorKeyRoute):
    """KServe v2's inference: every request it cannot use is a 400, as its protocol says (the 422s of the body's
    checks and of the score path, with their messages)."""

    invalid_status = 400

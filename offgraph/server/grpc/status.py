"""The one mapping of the score path's errors to gRPC status codes, with REST's words.

Every gRPC service answers an error with ``of(exc)``: the exceptions the REST routes answer (``ApiError`` by its
HTTP status, a body ``RequestValidationError``, ``FeatureValueError``, ``NotServing``, the 503s of
``offgraph.server.api.unavailable``) keep the messages REST gives them, paths redacted as for a caller without
the admin token. The codes:

=============================  =====================  ==========================================================
REST                           gRPC                   what
=============================  =====================  ==========================================================
400, 415, 422                  INVALID_ARGUMENT       a bad name, version, label, input, dtype, shape or value
404                            NOT_FOUND              unknown model, a version or label that does not serve
413                            RESOURCE_EXHAUSTED     too large (gRPC refuses a message over --max-body-mb itself)
401 / 403                      UNAUTHENTICATED / PERMISSION_DENIED
429, 503                       UNAVAILABLE            loading, a store that failed or did not answer, busy
(none)                         DEADLINE_EXCEEDED      the call's deadline passed before its turn in the pool
anything else                  INTERNAL               a bug: logged with its traceback, a generic message
=============================  =====================  ==========================================================
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from offgraph.features import FeatureValueError
from offgraph.server.api.state import DeadlineExpired
from offgraph.server.api.unavailable import unavailable_detail
from offgraph.server.http.errors import validation_detail
from offgraph.server.http.redact import redacted_view
from offgraph.server.models.served import NotServing

log = logging.getLogger("offgraph.server")

C = grpc.StatusCode
HTTP_CODES = {
    400: C.INVALID_ARGUMENT,
    401: C.UNAUTHENTICATED,
    403: C.PERMISSION_DENIED,
    404: C.NOT_FOUND,
    408: C.DEADLINE_EXCEEDED,
    413: C.RESOURCE_EXHAUSTED,
    415: C.INVALID_ARGUMENT,
    422: C.INVALID_ARGUMENT,
    429: C.UNAVAILABLE,
    503: C.UNAVAILABLE,
}
INTERNAL = "internal error: the server failed to answer this call; the details are in its log"


def of(exc: BaseException, models_dir: Path) -> tuple[grpc.StatusCode, str]:
    """(status code, message) of a call that raised ``exc``."""
    view = redacted_view(models_dir)
    if isinstance(exc, DeadlineExpired):
        return C.DEADLINE_EXCEEDED, str(exc)
    if isinstance(exc, RequestValidationError):
        return C.INVALID_ARGUMENT, view(validation_detail(exc)[0])
    if isinstance(exc, HTTPException):
        code = HTTP_CODES.get(exc.status_code)
        if code is None:
            code = C.INVALID_ARGUMENT if 400 <= exc.status_code < 500 else C.UNAVAILABLE
        return code, view(str(exc.detail))
    if isinstance(exc, FeatureValueError):
        return C.INVALID_ARGUMENT, view(f"bad feature value: {exc}")
    if isinstance(exc, NotServing):
        return C.NOT_FOUND, view(str(exc))
    if isinstance(exc, Exception):
        detail = unavailable_detail(exc)
        if detail is not None:
            return C.UNAVAILABLE, view(detail)
    log.error("internal error in a gRPC call", exc_info=exc)
    return C.INTERNAL, INTERNAL

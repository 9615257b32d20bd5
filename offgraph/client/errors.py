"""The client's errors: one per kind of answer a caller handles differently, all ``ApiError``s.

The server's error bodies are ``{"detail": "<what is wrong>"[, "errors": [...]]}``
(``{"error": ...}`` on the TF Serving-style routes): ``message`` is that text, ``body`` the whole
parsed body.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx


class ApiError(Exception):
    """An answer other than success, or no answer at all.

    Attributes:
        status: the HTTP status (None: no HTTP answer, see :class:`ConnectionFailed`).
        message: the server's message (its ``detail``), or what went wrong on the way.
        body: the parsed JSON body (the text when it is not JSON; None without an answer).
        attempts: how many times the call was tried (more than 1 after retries).
    """

    def __init__(self, message: str, *, status: int | None = None, body: Any = None):
        super().__init__(message)
        self.message, self.status, self.body = message, status, body
        self.attempts = 1

    def __str__(self) -> str:
        head = f"HTTP {self.status}: " if self.status is not None else ""
        tail = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"{head}{self.message}{tail}"


class InvalidRequest(ApiError):
    """422 (the body: ``errors`` lists each problem with its location) or 400 (an invalid model name)."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        """``[{"loc": "candidates[0].age", "msg": ..., "type": ...}, ...]``; empty when the server listed none."""
        listed = self.body.get("errors") if isinstance(self.body, dict) else None
        return list(listed or [])


class NotFound(ApiError):
    """404: no such model, version or route."""


class Unauthorized(ApiError):
    """401 (no or wrong admin token) or 403 (the server has no admin token: admin actions are off)."""


class TooLarge(ApiError):
    """413: the body is larger than the server's ``--max-body-mb``."""


class Unavailable(ApiError):
    """503 that lasted past the retries: a model still loading, a failed store read, the connection cap.

    ``retry_after``: the last answer's Retry-After in seconds (None without one).
    """

    def __init__(self, message: str, *, status: int | None = 503, body: Any = None, retry_after: float | None = None):
        super().__init__(message, status=status, body=body)
        self.retry_after = retry_after


class ConnectionFailed(ApiError):
    """No HTTP answer: the connection was refused or dropped, or a timeout ran out (``__cause__``: httpx's error)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    413: TooLarge,
    422: InvalidRequest,
}


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's delay: seconds, or an HTTP date (None when absent or unreadable)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_for(response: httpx.Response) -> ApiError:
    """The typed error of an unsuccessful answer, with the server's message."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    message = body.get("detail", body.get("error")) if isinstance(body, dict) else body
    if not isinstance(message, str) or not message:
        message = response.reason_phrase or f"HTTP {response.status_code}"
    status = response.status_code
    if status == 503:
        return Unavailable(message, body=body, retry_after=retry_after_seconds(response.headers.get("retry-after")))
    return _BY_STATUS.get(status, ApiError)(message, status=status, body=body)


def connection_failed(exc: httpx.TransportError, method: str, url: str) -> ConnectionFailed:
    what = "timed out" if isinstance(exc, httpx.TimeoutException) else "got no answer"
    return ConnectionFailed(f"{method} {url} {what}: {type(exc).__name__}: {exc}")

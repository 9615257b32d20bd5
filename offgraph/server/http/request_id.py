"""``x-request-id``: every answer carries one, and so does every log line written while it is handled.

A client's id is kept when it is 1 to 128 characters of ``A-Z a-z 0-9 . _ : + / = -`` starting with a
letter or digit (UUIDs, hex, base64 and the ids of the usual proxies fit); anything else (too long, spaces,
control characters, quotes, non-ASCII) is replaced by a fresh ``uuid4().hex``, never echoed: the id lands in
log lines and in other systems' headers. A request without one gets a fresh one.

Pure ASGI, outermost: the id is on every answer the app gives (413s, 500s and 503s included), and it is
set in a context variable for the request's task, which a log record factory appends to the message of
every record made meanwhile (``... [request_id=ID]``; ``record.request_id`` holds it, None outside a
request). The scoring pool runs each call in a copy of the caller's context, so its records carry it too.
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
MAX_LENGTH = 128
_VALID = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:+/=-]{0,%d}" % (MAX_LENGTH - 1))

REQUEST_ID: ContextVar[str | None] = ContextVar("offgraph_request_id", default=None)
"""The id of the request being handled in this context (None outside a request)."""


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's id: its first ``x-request-id`` header if that is a valid id, else a fresh one."""
    for key, value in headers:
        if key == HEADER:
            if _VALID.fullmatch(value):
                return value.decode("ascii")
            break
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app
        install_log_tag()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope["headers"])
        header = (HEADER, rid.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        token = REQUEST_ID.set(rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)


_installed = False


def install_log_tag() -> None:
    """Install (once per process) the log record factory that tags records made during a request."""
    global _installed
    if _installed:
        return
    _installed = True
    base = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = base(*args, **kwargs)
        rid = REQUEST_ID.get()
        record.request_id = rid
        if rid is not None:  # the id's characters hold no '%': the message's own formatting is unchanged
            record.msg = f"{record.msg} [request_id={rid}]"
        return record

    logging.setLogRecordFactory(factory)

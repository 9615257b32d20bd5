"""Connection limits of the HTTP server: head, body and keep-alive timeouts, a connection cap,
no HTTP/0.9.

uvicorn's httptools protocol has a keep-alive timeout but none for a request's head or body: a
client that connects and sends nothing, half a request line or half a body holds its connection
for as long as it likes, and an HTTP/0.9 line (``GET /``) waits for headers that never come.
``LimitedHttpToolsProtocol`` adds, per connection:

* head timeout: a request's head (request line + headers) must be complete within
  ``header_timeout_s`` of the connection's opening, or of the first byte of the next request on
  a kept-alive connection; else a 408 (part of a head came) or a plain close (nothing came).
  A head over ``MAX_HEAD_BYTES`` gets a 431.
* body timeout: the whole body within ``body_timeout_s`` of the head. While the app reads it,
  ``BodyTimeoutMiddleware`` answers the 408 (the app's error handling and metrics see it); the
  protocol closes the connection ``BODY_GRACE_S`` later whatever the app did (a body no route
  reads).
* an HTTP/0.9 request line (no version) gets a 400 at once.
* at ``max_connections`` open connections, a new one closes the connection idle the longest
  (waiting for a request head, or kept alive); with none idle, the new connection's request gets
  a 503 (uvicorn's own answer for its concurrency limit) and the connection closes.

The keep-alive timeout is uvicorn's (``timeout_keep_alive``). ``uvicorn_config`` builds the one
uvicorn configuration the single-process server and every ``--workers`` worker use.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from offgraph.server.config import HttpLimits

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; the app's heads are a few hundred bytes
BODY_GRACE_S = 1.0  # after the body timeout, time left to the app's 408 before the close
WARN_EVERY_S = 10.0  # evictions are logged at most this often (a flood of idle connections)
_IDLE, _HEAD, _BODY, _APP = "idle", "head", "body", "app"
_evictions = {"count": 0, "logged": float("-inf")}


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above (a subclass per config: ``protocol_class``)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._phase = _HEAD  # of the request the parser is in (or idle between requests)
        self._since = time.monotonic()  # when the phase began (oldest idle connection goes first)
        self._head_bytes = 0  # bytes received in the current head phase
        self._between = True  # no request begun since the last one ended: the next byte starts one
        self._line: bytearray | None = None  # start of a request line not yet complete, for the 0.9 check
        self._refusal: str | None = None

    # -- connection ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._close_oldest_idle():
            self.limit_concurrency = 0  # uvicorn answers this connection's request with a 503 and closes
        self._begin_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _close_oldest_idle(self) -> bool:
        idle = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, LimitedHttpToolsProtocol)
            and c._phase in (_IDLE, _HEAD)
            and not c.transport.is_closing()
            and (c.cycle is None or c.cycle.response_complete)
        ]  # not one with a response still due
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._since)
        now = time.monotonic()
        if now - _evictions["logged"] >= WARN_EVERY_S:
            self.logger.warning(
                "%d connections open (--max-connections %d): closing the ones idle the longest (%d so far)",
                len(self.connections),
                self.max_connections,
                _evictions["count"] + 1,
            )
            _evictions["logged"] = now
        _evictions["count"] += 1
        oldest._cancel()
        oldest.transport.close()
        return True

    # -- parsing ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._phase == _IDLE:
            self._begin_head()
        if self._between and self._line is None:
            self._line = bytearray()  # this chunk starts a request: check its request line
        if self._line is not None and self._http09(data):
            self._refuse(400, "HTTP/0.9 request line (no HTTP version): send HTTP/1.1")
            return
        if self._phase == _HEAD:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._phase == _HEAD and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
        elif self._phase == _BODY and self._timer is None:
            self._arm(self.body_timeout_s + BODY_GRACE_S, self._body_timeout)

    def _http09(self, data: bytes) -> bool:
        """Whether the request line starting in ``self._line`` + ``data`` lacks a version (HTTP/0.9)."""
        buf = self._line + data if self._line else data.lstrip(b"\r\n")
        end = buf.find(b"\n", 0, MAX_HEAD_BYTES)
        if end < 0:
            self._line = bytearray(buf) if len(buf) < MAX_HEAD_BYTES else None
            return False
        self._line = None
        return len(buf[:end].rstrip(b"\r").split(b" ")) == 2  # "GET /": method and target only

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._between = False
        if self._phase != _HEAD:  # a pipelined request, begun inside a chunk
            self._begin_head()

    def on_headers_complete(self) -> None:
        if self.parser.get_http_version() == "0.9":  # "GET /" + an empty line
            self._refusal = "HTTP/0.9 request (no HTTP version): send HTTP/1.1"
            raise ValueError(self._refusal)  # httptools -> HttpParserError -> uvicorn's 400
        self._cancel()
        self._phase, self._since = _BODY, time.monotonic()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel()
        self._phase, self._between = _APP, True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._phase == _APP and not self.pipeline:
            self._phase, self._since = _IDLE, time.monotonic()  # uvicorn's keep-alive timer runs now

    def send_400_response(self, msg: str) -> None:
        self._cancel()
        super().send_400_response(self._refusal or msg)

    # -- timers ----------------------------------------------------------------------------------
    def _begin_head(self) -> None:
        self._phase, self._since, self._head_bytes = _HEAD, time.monotonic(), 0
        self._arm(self.header_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        self._timer = None
        if self._phase != _HEAD or self.transport.is_closing():
            return
        if self._head_bytes:
            self._refuse(408, f"request head not complete within {self.header_timeout_s:g} s")
        else:
            self.transport.close()

    def _body_timeout(self) -> None:
        self._timer = None
        if self._phase != _BODY or self.transport.is_closing():
            return
        if self.pipeline:  # reading is paused until the previous response is out: not the client's fault
            self._arm(self.body_timeout_s, self._body_timeout)
            return
        self.logger.debug("request body not complete within %g s: closing the connection", self.body_timeout_s)
        self.transport.close()

    def _arm(self, delay: float, callback) -> None:
        self._cancel()
        self._timer = self.loop.call_later(delay, callback)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refuse(self, status: int, msg: str) -> None:
        """Answer ``status`` with ``msg`` (outside any request cycle) and close the connection."""
        self._cancel()
        body = msg.encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        self.transport.write(head + body)
        self.transport.close()


_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


def protocol_class(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol with ``limits`` (uvicorn builds one instance per connection)."""
    return type(
        "OffgraphHttpProtocol",
        (LimitedHttpToolsProtocol,),
        {
            "header_timeout_s": limits.header_timeout_s,
            "body_timeout_s": limits.body_timeout_s,
            "max_connections": limits.max_connections,
        },
    )


def uvicorn_config(app: ASGIApp, limits: HttpLimits, log_level: str, stop_timeout_s: float = 10.0, **bind: Any):
    """The uvicorn configuration of every server process (``bind``: host/port, or none with sockets;
    ``stop_timeout_s``: how long in-flight requests get to finish once the server stops)."""
    import uvicorn

    return uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol_class(limits),
        ws="none",
        access_log=False,
        log_config=None,  # its loggers go through the process's handler (offgraph.log_format)
        log_level=log_level,
        timeout_graceful_shutdown=stop_timeout_s,  # type: ignore[arg-type] # uvicorn takes a float too
        timeout_keep_alive=limits.keep_alive_timeout_s,  # type: ignore[arg-type] # uvicorn takes a float too
        **bind,
    )


class BodyTimeout(HTTPException):
    def __init__(self, seconds: float):
        super().__init__(
            408,
            f"request body not received within {seconds:g} s of the request head (--body-timeout)",
            headers={"connection": "close"},
        )


class BodyAbandoned(HTTPException):
    """The client closed its connection before its body was complete (nginx's 499): no one reads
    the answer, but the app ends the request as a client error, not as an internal one."""

    def __init__(self) -> None:
        super().__init__(499, "client closed the connection before the request body was complete")


class BodyTimeoutMiddleware:
    """Pure ASGI: the app's reads of a request body end by ``body_timeout_s`` after the request
    reached the app (its head was complete); past it a read raises ``BodyTimeout`` (a 408 that
    closes the connection), and a client gone before its body's end raises ``BodyAbandoned``
    (Starlette's ClientDisconnect would reach the app's 500 handler). Reads after the body's
    last chunk are not timed."""

    def __init__(self, app: ASGIApp, body_timeout_s: float):
        self.app = app
        self.timeout = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.timeout) from None
            if message["type"] == "http.disconnect":
                raise BodyAbandoned()
            body_done = not message.get("more_body", False)
            return message

        await self.app(scope, timed_receive, send)

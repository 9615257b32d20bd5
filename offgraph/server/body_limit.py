"""Request body size limit (pure ASGI): Content-Length is checked up front, the streamed size as it arrives."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, size: str):
        super().__init__(
            413,
            f"request body {size} is larger than the limit of {limit} bytes "
            f"({limit / 2**20:g} MiB); send fewer candidates per request",
        )


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
                break
        if length is not None and length > self.limit:
            # up to a few times the limit, let uvicorn read and drop the rest of the body so that the
            # client (which usually sends it all before reading) gets the 413; beyond, close the connection
            await _send_413(
                send, BodyTooLarge(self.limit, f"of {length} bytes (Content-Length)"), close=length > 4 * self.limit
            )
            return
        limit, received = self.limit, 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # FastAPI re-raises HTTPExceptions from body reading: a JSON 413
                    raise BodyTooLarge(limit, f"of more than {limit} bytes (streamed)")
            return message

        await self.app(scope, limited_receive, send)


async def _send_413(send: Send, exc: BodyTooLarge, close: bool) -> None:
    body = json.dumps({"detail": exc.detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})

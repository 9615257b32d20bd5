"""Request body limits: its size (pure ASGI: Content-Length is checked up front, the streamed size as it
arrives) and how deep its JSON nests (``json_too_deep``, checked by ``score_body.JsonBody`` before any decoder)."""

from __future__ import annotations

import json

import numpy as np
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


MAX_JSON_DEPTH = 64
"""How deep a JSON request body's arrays and objects may nest. The bodies the server takes nest 4 deep at most
(a score body: its object, ``candidates``, a candidate, a list value); the JSON decoders recurse once per level,
and one past Python's recursion limit (msgspec, on a ``:score`` body's candidates) is an internal error: a
deeper body is a 422 naming this limit, before any decoder runs."""

_WORD = 64  # bits of the masks' words: the bound is checked per 64 bytes of the body


def _words(mask: np.ndarray, words: int) -> np.ndarray:
    """``mask`` (one bool a byte) as bits, ``words`` little-endian uint64 words (zero-padded)."""
    out = np.zeros(words * 8, np.uint8)
    packed = np.packbits(mask, bitorder="little")
    out[: packed.size] = packed
    return out.view(np.uint64)


_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def _popcount(words: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 word, as int64 (numpy >= 2 has it in C; else a byte table)."""
    count = getattr(np, "bitwise_count", None)
    if count is not None:
        return count(words).astype(np.int64)
    return _POPCOUNT8[words.view(np.uint8)].reshape(-1, 8).sum(axis=1, dtype=np.int64)


def _in_string(quotes: np.ndarray) -> np.ndarray:
    """Bits inside strings (from an opening quote up to its closing one) of the unescaped ``quotes`` bits: a
    prefix XOR within each word (six shifts), the words after an odd number of quotes inverted."""
    x = quotes.copy()
    for shift in (1, 2, 4, 8, 16, 32):
        x ^= x << np.uint64(shift)
    before = _popcount(quotes)
    odd = ((np.cumsum(before) - before) & 1).astype(np.uint64)
    return x ^ (np.uint64(0) - odd)  # all ones where odd


def _unmark_escaped(body: np.ndarray, quote: np.ndarray) -> None:
    """Clear the quotes of ``quote`` escaped by a backslash: those after a run of an odd number of them
    (``\\"`` is escaped, ``\\\\"`` is not). Over the backslashes' positions only."""
    at = np.flatnonzero(body == 0x5C)
    if not at.size:
        return
    breaks = np.flatnonzero(np.diff(at) != 1)  # the last backslash of each run but the last run
    last = np.concatenate((at[breaks], at[-1:]))
    first = np.concatenate((at[:1], at[breaks + 1]))
    after = last[(last - first) % 2 == 0] + 1  # the byte after an odd run
    quote[after[after < body.size]] = False


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int | None:
    """The offset of the first byte of ``raw`` at which its arrays and objects nest deeper than ``limit``, or
    None. Brackets inside strings do not count (escaped quotes are told apart); no recursion, no Python loop
    over the bytes: numpy over the body as 64-bit words.

    Read as a JSON decoder reads it up to its first error (the prefix every decoder parses is read the same),
    so no decoder ever recurses deeper than ``limit`` on a body this passes. The depth is bounded per 64 bytes
    (the exact depth before the word + its opening brackets): a normal body is done there; in the words whose
    bound exceeds the limit the depth is followed bit by bit, and only the exact depth refuses a body."""
    n = len(raw)
    if n <= limit:  # ``limit`` + 1 opening brackets at least
        return None
    body = np.frombuffer(raw, np.uint8)
    words = -(-n // _WORD)
    quote = body == 0x22
    if b"\\" in raw:
        _unmark_escaped(body, quote)
    folded = body | 0x20  # [ -> {, ] -> }
    outside = ~_in_string(_words(quote, words))
    opens = _words(folded == 0x7B, words) & outside
    closes = _words(folded == 0x7D, words) & outside
    n_open = _popcount(opens)
    net = n_open - _popcount(closes)
    before = np.cumsum(net) - net  # the exact depth before each word
    suspect = np.flatnonzero(before + n_open > limit)  # the words that may go deeper than the limit
    for chunk in (suspect[:8], suspect[8:]):  # a deep body crosses in its first suspect words
        if chunk.size:
            step = _bits_of(opens[chunk]) - _bits_of(closes[chunk])
            over = np.flatnonzero(before[chunk, None] + np.cumsum(step, axis=1) > limit)
            if over.size:
                return int(chunk[over[0] // _WORD]) * _WORD + int(over[0] % _WORD)
    return None


def _bits_of(words: np.ndarray) -> np.ndarray:
    """The bits of uint64 ``words``, one row of 64 (int64 0/1) per word."""
    return np.unpackbits(words.view(np.uint8), bitorder="little").reshape(-1, _WORD).astype(np.int64)

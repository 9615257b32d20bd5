"""Absolute paths out of what clients see, unless they hold the admin token.

Model status (the training run's directory, refusal reasons, errors from RocksDB) and error
messages carry filesystem paths. Before they are rendered, a path under MODELS becomes a path
relative to MODELS (``ml/3: dense model checksum mismatch``), MODELS itself ``MODELS``, and any
other absolute path ``.../<its last component>``. A request with the admin bearer token sees
the full text. Only rendering changes: logs and the registry keep the full paths.
"""

from __future__ import annotations

import functools
import hmac
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Request

_PATH_CHARS = r"[^\s'\"`,;:()\[\]{}<>]"
_ABS_PATH = re.compile(r"(?<![\w./~-])(?!(?<=:)//[^/])/" + _PATH_CHARS + "*")
"""An absolute path: a '/' that does not continue a word or a relative path, nor start a URL's
``scheme://`` authority (a remote store's ``redis://HOST:PORT``), up to a delimiter."""


def token_matches(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison of a bearer token with the configured one (None configured: never)."""
    return expected is not None and given is not None and hmac.compare_digest(given.encode(), expected.encode())


def is_admin(request: Request) -> bool:
    """Whether the request carries ``Authorization: Bearer <the admin token>``."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and token_matches(request.state.server.config.admin_token, token.strip())


class PathRedactor:
    def __init__(self, models_dir: Path):
        roots = sorted({os.path.abspath(models_dir), os.path.realpath(models_dir)}, key=len, reverse=True)
        # a root followed by '/' (a path under MODELS) or by no path character (MODELS itself)
        self._models = re.compile(
            "(?:" + "|".join(re.escape(r.rstrip("/")) for r in roots) + ")(?:/|(?!" + _PATH_CHARS + "))"
        )

    def text(self, s: str) -> str:
        s = self._models.sub(lambda m: "" if m.group().endswith("/") else "MODELS", s)
        return _ABS_PATH.sub(lambda m: ".../" + os.path.basename(m.group().rstrip("/")), s)

    def value(self, v: Any) -> Any:
        """``text`` applied to every string in a JSON-like value (dict values, list items)."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        return v


@functools.lru_cache(maxsize=8)
def _redactor(models_dir: Path) -> PathRedactor:
    return PathRedactor(models_dir)


def redacted_view(models_dir: Path) -> Callable[[Any], Any]:
    """Paths redacted: the view of a caller without the admin token (gRPC callers: they send none)."""
    return _redactor(models_dir).value


def view_for(request: Request) -> Callable[[Any], Any]:
    """How this request may see a value: unchanged for the admin, paths redacted otherwise."""
    if is_admin(request):
        return lambda v: v
    return _redactor(request.state.server.config.models_dir).value


async def path_view(request: Request) -> Callable[[Any], Any]:
    """Dependency: ``view_for(request)``."""
    return view_for(request)

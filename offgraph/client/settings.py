"""What the sync and async clients share: their settings and how one call is prepared."""

from __future__ import annotations

from typing import Any

import httpx

from offgraph.client.retries import Retries
from offgraph.client.routes import Call

DEFAULT_TIMEOUT_S = 10.0
"""Per attempt: connect, each read and write, and the wait for a pooled connection."""

DEFAULT_ADMIN_TIMEOUT_S = 600.0
"""Admin calls answer once the version is loaded and warmed up, in every worker process: minutes at worst."""


class ClientSettings:
    """The base URL, timeouts, retries and admin token of one client (no state is shared between clients)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        admin_timeout: float | httpx.Timeout = DEFAULT_ADMIN_TIMEOUT_S,
        retries: Retries | None = None,
        admin_token: str | None = None,
    ):
        self.url = url.rstrip("/")
        self.timeout = httpx.Timeout(timeout)
        self.admin_timeout = httpx.Timeout(admin_timeout)
        self.retries = retries if retries is not None else Retries()
        self.admin_token = admin_token
        self._http = self._open()

    def _open(self) -> Any:
        """The client's own httpx client (each client has its own connection pool)."""
        raise NotImplementedError

    def token(self, token: str | None) -> str | None:
        """A call's admin token: its own, else the client's."""
        return token if token is not None else self.admin_token

    def request_kwargs(self, call: Call) -> dict[str, Any]:
        """``httpx.Client.request`` / ``AsyncClient.request`` arguments of one attempt of ``call``."""
        return {
            "method": call.method,
            "url": call.path,
            "content": call.body,
            "headers": call.headers,
            "timeout": self.admin_timeout if call.admin else self.timeout,
        }

    def retrying_kwargs(self, call: Call) -> dict[str, Any]:
        return self.retries.tenacity_kwargs(call.retry_unavailable, call.retry_connection)

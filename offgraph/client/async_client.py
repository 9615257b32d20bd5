"""``AsyncClient``: the HTTP API from asyncio code (one ``httpx.AsyncClient``, its connections kept alive)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import httpx
import tenacity

import offgraph.client.routes as routes
from offgraph.client.errors import ApiError, connection_failed
from offgraph.client.results import ModelStatus, Readiness, ScoreResult
from offgraph.client.routes import Call, Features
from offgraph.client.settings import ClientSettings

T = TypeVar("T")


class AsyncClient(ClientSettings):
    """``Client``'s calls as coroutines: ``async with AsyncClient(url) as c: await c.score(...)``.

    Arguments, results, errors and retries are :class:`~offgraph.client.Client`'s; retry waits are
    ``asyncio.sleep`` calls: the event loop runs on meanwhile.
    """

    _http: httpx.AsyncClient

    def _open(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url)

    async def score(
        self,
        model: str,
        request: Features,
        candidates: Sequence[Features],
        version: int | None = None,
        *,
        label: str | None = None,
    ) -> ScoreResult:
        return await self._run(routes.score(model, request, candidates, version, label))

    async def models(self) -> list[ModelStatus]:
        return await self._run(routes.models())

    async def model(self, name: str) -> ModelStatus:
        return await self._run(routes.model(name))

    async def load(self, model: str, version: int | None = None, *, token: str | None = None) -> ModelStatus:
        return await self._run(routes.load(model, version, self.token(token)))

    async def unload(self, model: str, *, token: str | None = None) -> ModelStatus:
        return await self._run(routes.admin(model, "unload", self.token(token)))

    async def rollback(self, model: str, *, token: str | None = None) -> ModelStatus:
        return await self._run(routes.admin(model, "rollback", self.token(token)))

    async def set_label(self, model: str, label: str, version: int, *, token: str | None = None) -> ModelStatus:
        return await self._run(routes.set_label(model, label, version, self.token(token)))

    async def remove_label(self, model: str, label: str, *, token: str | None = None) -> ModelStatus:
        return await self._run(routes.remove_label(model, label, self.token(token)))

    async def ready(self) -> Readiness:
        return await self._run(routes.ready())

    async def healthy(self) -> bool:
        try:
            return await self._run(routes.healthy())
        except ApiError:
            return False

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, call: Call[T]) -> T:
        async def attempt() -> T:
            kwargs = self.request_kwargs(call)
            try:
                response = await self._http.request(**kwargs)
            except httpx.TransportError as e:
                raise connection_failed(e, call.method, self.url + call.path) from e
            return call.result(response)

        return await tenacity.AsyncRetrying(**self.retrying_kwargs(call))(attempt)

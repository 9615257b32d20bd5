"""``Client``: the HTTP API from blocking code (one ``httpx.Client``, its connections kept alive)."""

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


class Client(ClientSettings):
    """A client of one ``offgraph serve``: ``with Client("http://127.0.0.1:8500") as c: c.score(...)``.

    Args:
        url: the server's base URL.
        timeout: seconds (or an ``httpx.Timeout``) per attempt of every call but the admin ones.
        admin_timeout: the same for ``load``, ``unload`` and ``rollback``, which wait for a load.
        retries: bounds of the retries (:class:`~offgraph.client.Retries`; ``Retries(attempts=1)``: none).
        admin_token: the bearer token of the admin calls that are given none.

    Errors are subclasses of :class:`~offgraph.client.ApiError` (``NotFound``, ``InvalidRequest``, ``Unauthorized``,
    ``TooLarge``, ``Unavailable``, ``ConnectionFailed``...), with the server's message.
    """

    _http: httpx.Client

    def _open(self) -> httpx.Client:
        return httpx.Client(base_url=self.url)

    def score(
        self,
        model: str,
        request: Features,
        candidates: Sequence[Features],
        version: int | None = None,
        *,
        label: str | None = None,
    ) -> ScoreResult:
        """Scores of ``candidates`` (raw item features each) for ``request`` (raw request features), in
        candidate order; ``version``: the version that must score them (404 unless it serves), or
        ``label``: the version that label names (``set_label``)."""
        return self._run(routes.score(model, request, candidates, version, label))

    def models(self) -> list[ModelStatus]:
        """Every model the server knows, with its versions on disk and the one it serves."""
        return self._run(routes.models())

    def model(self, name: str) -> ModelStatus:
        return self._run(routes.model(name))

    def load(self, model: str, version: int | None = None, *, token: str | None = None) -> ModelStatus:
        """Load, warm up, swap in and pin ``version`` (None: follow the newest complete version again)."""
        return self._run(routes.load(model, version, self.token(token)))

    def unload(self, model: str, *, token: str | None = None) -> ModelStatus:
        return self._run(routes.admin(model, "unload", self.token(token)))

    def rollback(self, model: str, *, token: str | None = None) -> ModelStatus:
        """Back to the version served before the current one, pinned."""
        return self._run(routes.admin(model, "rollback", self.token(token)))

    def set_label(self, model: str, label: str, version: int, *, token: str | None = None) -> ModelStatus:
        """Name ``version`` by ``label`` (``stable``, ``canary``), loading it beside the default version if it
        does not serve; ``score(..., label=label)`` is then scored by it."""
        return self._run(routes.set_label(model, label, version, self.token(token)))

    def remove_label(self, model: str, label: str, *, token: str | None = None) -> ModelStatus:
        """Remove the label; its version stops serving unless another label names it or it is the default."""
        return self._run(routes.remove_label(model, label, self.token(token)))

    def ready(self) -> Readiness:
        """``/readyz`` now (its 503 is ``ready=False``, not an error)."""
        return self._run(routes.ready())

    def healthy(self) -> bool:
        """``/healthz`` answers 200 now (False on any other answer, or none)."""
        try:
            return self._run(routes.healthy())
        except ApiError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: Call[T]) -> T:
        def attempt() -> T:
            kwargs = self.request_kwargs(call)
            try:
                response = self._http.request(**kwargs)
            except httpx.TransportError as e:
                raise connection_failed(e, call.method, self.url + call.path) from e
            return call.result(response)

        return tenacity.Retrying(**self.retrying_kwargs(call))(attempt)

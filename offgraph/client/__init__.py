"""A Python client of ``offgraph serve``'s HTTP API, sync and async, over httpx.

    import offgraph

    with offgraph.Client("http://127.0.0.1:8500") as c:
        r = c.score("movielens", {"user_id": 196}, [{"movie_id": 242}, {"movie_id": 302}])
        r.scores, r.version                               # [0.41..., 0.23...], 1
        c.model("movielens").loaded.version               # 1
        c.rollback("movielens", token=ADMIN_TOKEN)        # -> ModelStatus

    async with offgraph.AsyncClient(url) as c:
        r = await c.score(...)

Calls: ``score``, ``models``, ``model``, ``load``, ``unload``, ``rollback`` (admin: a bearer token,
per call or ``admin_token=`` for the client), ``ready``, ``healthy``. Results are frozen
dataclasses named as the API's bodies (``offgraph.client.results``).

Retries (``Retries``: attempts and total time bounded, via tenacity): a 503 is retried for the score
and read calls, after the server's Retry-After (else an exponential backoff with jitter); a connection
failure only for the reads (GET). Admin calls and probes are never retried (``offgraph.client.routes``
says why).

Errors: every failure is an ``ApiError`` (``status``, ``message``: the server's, ``body``, ``attempts``):
``NotFound`` (404), ``InvalidRequest`` (422, 400), ``Unauthorized`` (401, 403), ``TooLarge`` (413),
``Unavailable`` (503 after the retries), ``ConnectionFailed`` (no HTTP answer: refused, dropped or timed
out; ``status`` None), ``ApiError`` itself for any other status.

Each client owns its connection pool and settings; nothing is global. Importing this package loads
httpx and tenacity only (no TensorFlow, NumPy or server code).
"""

from offgraph.client.async_client import AsyncClient
from offgraph.client.errors import (
    ApiError,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from offgraph.client.results import (
    FeatureTable,
    LoadedVersion,
    ModelStatus,
    ModelVersionStatus,
    Readiness,
    RefusedVersion,
    ScoreResult,
    VersionStatusDetail,
)
from offgraph.client.retries import Retries
from offgraph.client.sync_client import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ConnectionFailed",
    "FeatureTable",
    "InvalidRequest",
    "LoadedVersion",
    "ModelStatus",
    "ModelVersionStatus",
    "NotFound",
    "Readiness",
    "RefusedVersion",
    "Retries",
    "ScoreResult",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "VersionStatusDetail",
]

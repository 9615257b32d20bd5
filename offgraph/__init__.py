"""offgraph: serve DeepFM CTR models whose embedding tables live out of the TensorFlow graph, in a
sharded, quantized RocksDB store.

    import offgraph
    scorer = offgraph.load("models/movielens")       # a model's newest complete version, or a version dir
    ctr = scorer.score(request, candidates)          # float32 [N]

    with offgraph.Client("http://127.0.0.1:8500") as c:   # a client of `offgraph serve` (offgraph.client)
        c.score("movielens", request, candidates).scores

Subpackages, lowest layer first (``lint-imports`` checks the order, pyproject.toml): ``config``,
``features``, ``store``, ``modeldir``, ``scoring``, ``model``, ``data``; then ``export``, ``streaming``,
``server``; then ``cli`` and ``testing``. Importing this package loads nothing heavy.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from offgraph.client import AsyncClient, Client
    from offgraph.scoring.scorer import Scorer

try:
    __version__ = version("offgraph")
except PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["AsyncClient", "Client", "__version__", "load"]

_CLIENTS = ("AsyncClient", "Client")


def __getattr__(name: str) -> Any:
    """``offgraph.Client`` / ``offgraph.AsyncClient``, imported on first use (httpx is not loaded before)."""
    if name in _CLIENTS:
        import offgraph.client

        return getattr(offgraph.client, name)
    raise AttributeError(f"module 'offgraph' has no attribute {name!r}")


def load(path: str | Path, **kwargs) -> Scorer:
    """The library scorer of a model directory's newest complete version, or of one version directory.

    Args:
        path: ``MODELS/NAME`` or ``MODELS/NAME/VERSION``.
        **kwargs: options of :class:`offgraph.scoring.scorer.Scorer` (``row_cache_mb``, ``store_mode``, ...).

    Returns:
        A :class:`~offgraph.scoring.scorer.Scorer`; ``score(request, candidates)`` gives float32 [N].
    """
    from offgraph.scoring.scorer import load as _load

    return _load(path, **kwargs)

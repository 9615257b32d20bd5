"""HTTP scoring server (FastAPI + uvicorn) over the library scorer.

    from offgraph.server import ServerConfig, create_app
    app = create_app(ServerConfig(models_dir="models"))

``offgraph serve --models MODELS`` runs it under uvicorn. The request path is
``offgraph.scoring.scorer.Scorer.score`` (the library scorer; ``offgraph.scoring.scorer``
imports no FastAPI); the server validates input, runs the scorer in
a bounded thread pool and adds nothing to the maths. Imports are lazy so that
``offgraph --help`` does not load TensorFlow.
"""

from __future__ import annotations

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str):
    if name == "ServerConfig":
        from offgraph.server.config import ServerConfig

        return ServerConfig
    if name == "create_app":
        from offgraph.server.app import create_app

        return create_app
    raise AttributeError(f"module 'server' has no attribute {name!r}")

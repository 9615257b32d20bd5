"""``create_app(config)``: the FastAPI app of one server process."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from offgraph.server.api.docs_assets import install_docs
from offgraph.server.api.openapi_examples import install_model_examples
from offgraph.server.api.routers import admin, experiment, health, kserve, models, score, tfserving
from offgraph.server.api.state import ServerState
from offgraph.server.api.unavailable import install_unavailable_handlers
from offgraph.server.config import ListenConfig, ServerConfig
from offgraph.server.http.body_limit import BodySizeLimitMiddleware
from offgraph.server.http.errors import InternalErrorMiddleware, install_error_handlers
from offgraph.server.http.http_limits import BodyTimeoutMiddleware
from offgraph.server.http.request_id import RequestIdMiddleware
from offgraph.server.models.experiment import Experiments
from offgraph.server.process.compute_threads import configure_blas_threads, configure_tf_threads
from offgraph.server.process.gc_tuning import tune_gc
from offgraph.server.process.metrics import HttpMetricsMiddleware
from offgraph.server.process.served_log import ServedLog, open_served_log

DESCRIPTION = """\
DeepFM CTR scoring with the embedding tables out of the TensorFlow graph.

* `POST /v1/models/{name}:score` scores candidates for one request. Raw feature names are the model's
  input names (`GET /v1/models/{name}` lists them); a missing key or null is *no value*, and
  **keys the model does not read are ignored**. NaN/Infinity, nested objects, an empty candidate
  list, too many candidates or a too large body are refused with a 4xx naming the problem.
* New versions under `MODELS/<name>/<version>/` are loaded in the background, warmed up and swapped in
  without dropping a request. Admin actions (`:load`, `:unload`, `:rollback`) need a bearer token.
* TensorFlow Serving's REST API (`:predict` with `{"instances"}`, model status, metadata) and KServe v2's
  health, readiness and model metadata are served beside these; their errors are `{"error": ...}`.
* Every answer carries an `x-request-id` header: the request's own (if it is a sane id) or a new one.
"""


def create_app(
    config: ServerConfig, listen: ListenConfig | None = None, served_log: ServedLog | None = None
) -> FastAPI:
    """Build the app. TF's thread pools are set here if the config names them (before any TF op). With
    ``listen.grpc_port``, the app's lifespan also runs the gRPC port (``offgraph.server.grpc.server``) on its loop.
    ``served_log``: where sampled scored requests are logged (``offgraph.server.process.served_log``; closed with
    the app); by default the one ``config`` asks for (``--served-log-rate`` and its sink; none when off)."""
    configure_tf_threads(config.intra_threads, config.inter_threads)
    configure_blas_threads(config.blas_threads)
    state = ServerState.build(config)
    if served_log is None:
        served_log = open_served_log(config)
    state.served_log = served_log

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.start()
        grpc_port = None
        try:
            if listen is not None and listen.grpc_port is not None:
                from offgraph.server.grpc.server import GrpcPort  # grpc is loaded by servers that serve it only

                grpc_port = GrpcPort(state, listen.host, listen.grpc_port, listen.workers > 1, listen.stop_timeout_s)
                await grpc_port.start()
            yield {"server": state}
        finally:
            if grpc_port is not None:
                await grpc_port.stop()  # before the scoring pool and the models close
            await state.stop()
            if served_log is not None:  # writes what is queued: in a thread, the loop stays free meanwhile
                await asyncio.get_running_loop().run_in_executor(None, served_log.close)

    # docs_url/redoc_url None: FastAPI's pages load their assets from a CDN; install_docs serves them locally
    app = FastAPI(
        title="offgraph", version="1", description=DESCRIPTION, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    install_docs(app)
    # every worker reads the records under MODELS; every protocol's score path assigns arms from them
    state.experiments = app.state.experiments = Experiments(state.models.models_dir)
    if served_log is not None:
        metrics = state.metrics
        served_log.count_with(
            lambda model, n: metrics.served_log_dropped.labels(model).inc(n),
            lambda model, n: metrics.served_log_written.labels(model).inc(n),
        )
    install_model_examples(app, state.models, config.max_candidates)
    # the score route, tried first (the busiest): one route, documented, answering without FastAPI's handler
    app.router.routes.insert(0, score.build_route(config))
    app.include_router(tfserving.build_router(config))
    for module in (models, admin, experiment, health, kserve):
        app.include_router(module.router)
    install_error_handlers(app)
    install_unavailable_handlers(app, state)
    app.add_middleware(InternalErrorMiddleware)  # innermost: its 500s are counted like any answer
    app.add_middleware(BodyTimeoutMiddleware, body_timeout_s=config.http.body_timeout_s)
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=config.max_body_bytes)
    app.add_middleware(HttpMetricsMiddleware, metrics=state.metrics)  # sees the 413s too
    app.add_middleware(RequestIdMiddleware)  # outermost: every answer carries its request's id
    if config.tune_gc:
        tune_gc()
    return app

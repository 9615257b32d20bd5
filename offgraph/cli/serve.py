"""`offgraph serve`: the HTTP scoring server under uvicorn."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

from offgraph.cli import add_cpus_argument, pin_cpus
from offgraph.cli.settings_flags import add_settings_flags, settings_from_args
from offgraph.cli.settings_sources import add_settings_sources
from offgraph.server.config import ListenConfig, ServerConfig

# set by offgraph.server.process.workers, or library-only
STARTUP_FAILURE = 3  # uvicorn's exit code when it cannot start, a bind error included

log = logging.getLogger("offgraph.server")

NOT_FLAGS = {
    "item_cache_size",
    "warmup_candidates",
    "verify",
    "tune_gc",
    "workers",
    "worker_id",
    "control_dir",
    "models_uri",
}


def _pin(path: Path) -> str:
    return next(line for line in path.read_text().splitlines() if line and not line.startswith("#"))


_TFSERVING_API = f"pip install --no-deps '{_pin(Path(__file__).parents[1] / 'server' / 'grpc' / 'tfserving-api.txt')}'"
"""How to install TF Serving's protos (offgraph/server/grpc/tfserving-api.txt says why --no-deps)."""


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve every model under MODELS over HTTP (FastAPI + uvicorn)")
    add_settings_flags(
        p, ServerConfig, exclude=NOT_FLAGS, defaults={"intra_threads": 1, "inter_threads": 1, "blas_threads": 1}
    )
    add_settings_flags(p, ListenConfig)
    add_cpus_argument(p, "the server and its workers")
    add_settings_sources(p, sub)
    p.set_defaults(func=run)


def run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pin_cpus(args.cpus)  # first: every thread and worker process inherits it
    config = settings_from_args(ServerConfig, args)  # the admin token too: --admin-token or OFFGRAPH_ADMIN_TOKEN
    listen = settings_from_args(ListenConfig, args)
    if listen.grpc_port is not None and importlib.util.find_spec("tensorflow_serving") is None:
        print(f"offgraph serve: error: --grpc-port needs TF Serving's protos: {_TFSERVING_API}", file=sys.stderr)
        return 2
    if listen.workers > 1:
        from offgraph.server.process.workers import Supervisor

        return Supervisor(config, listen, serve_worker).run()
    from offgraph.server.process.workers import check_port_free, listening_socket, serve_on

    try:  # before TensorFlow and the models: a port in use is one line, at once
        sock = listening_socket(listen.host, listen.port)
        if listen.grpc_port is not None:
            check_port_free(listen.host, listen.grpc_port)
    except OSError as e:
        print(f"offgraph serve: error: {e}", file=sys.stderr)
        return STARTUP_FAILURE
    host, port = sock.getsockname()[:2]
    # TF's pools first, before anything can run a TF op
    from offgraph.server.process.compute_threads import configure_blas_threads, configure_tf_threads

    configure_tf_threads(config.intra_threads, config.inter_threads)
    configure_blas_threads(config.blas_threads)
    from offgraph.server.app import create_app

    log.info("serving on http://%s:%d", f"[{host}]" if ":" in host else host, port)
    try:
        started = serve_on(
            create_app(config, listen), sock, listen.log_level, config.http, listen.drain_seconds, listen.stop_timeout_s
        )
    except KeyboardInterrupt:  # a SIGINT before the server's own handling began
        return 0
    return 0 if started else 1


def serve_worker(config: ServerConfig, listen: ListenConfig) -> None:
    """One worker process of ``--workers N`` (spawned by ``offgraph.server.process.workers.Supervisor``: nothing
    of the parent's TensorFlow state is inherited): its own app on the shared port (``SO_REUSEPORT``)."""
    from offgraph.server.process.workers import VERBOSE_ENV, reuseport_socket, serve_on

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not os.environ.get(VERBOSE_ENV):  # `offgraph -v` shows TensorFlow's start-up lines, in workers too
        from offgraph.runtime import install_quiet_tensorflow_import

        install_quiet_tensorflow_import()
    from offgraph.log_format import configure_logging

    verbose = bool(os.environ.get(VERBOSE_ENV))
    configure_logging(getattr(logging, listen.log_level.upper()), verbose=verbose, tag=f"w{config.worker_id}")
    from offgraph.server.process.compute_threads import configure_blas_threads, configure_tf_threads

    configure_tf_threads(config.intra_threads, config.inter_threads)
    configure_blas_threads(config.blas_threads)
    from offgraph.server.app import create_app

    sock = reuseport_socket(listen.host, listen.port)
    serve_on(
        create_app(config, listen), sock, listen.log_level, config.http, listen.drain_seconds, listen.stop_timeout_s
    )

"""`offgraph serve`: the HTTP scoring server under uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from offgraph.cli import add_cpus_argument, pin_cpus
from offgraph.cli.settings_flags import add_settings_flags, settings_from_args
from offgraph.server.config import ListenConfig, ServerConfig

# set by offgraph.server.workers, or library-only
STARTUP_FAILURE = 3  # uvicorn's exit code when it cannot start, a bind error included

log = logging.getLogger("offgraph.server")

NOT_FLAGS = {"item_cache_size", "warmup_candidates", "verify", "tune_gc", "workers", "worker_id", "control_dir"}


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve every model under MODELS over HTTP (FastAPI + uvicorn)")
    add_settings_flags(p, ServerConfig, exclude=NOT_FLAGS, defaults={"intra_threads": 1, "inter_threads": 1})
    add_settings_flags(p, ListenConfig)
    add_cpus_argument(p, "the server and its workers")
    p.set_defaults(func=run)


def run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pin_cpus(args.cpus)  # first: every thread and worker process inherits it
    config = settings_from_args(ServerConfig, args, admin_token=args.admin_token or ServerConfig.admin_token_from_env())
    listen = settings_from_args(ListenConfig, args)
    if listen.workers > 1:
        from offgraph.server.workers import Supervisor

        return Supervisor(config, listen.host, listen.port, listen.workers, listen.log_level).run()
    from offgraph.server.workers import listening_socket, serve_on

    try:  # before TensorFlow and the models: a port in use is one line, at once
        sock = listening_socket(listen.host, listen.port)
    except OSError as e:
        print(f"offgraph serve: error: {e}", file=sys.stderr)
        return STARTUP_FAILURE
    host, port = sock.getsockname()[:2]
    # TF's pools first, before anything can run a TF op
    from offgraph.server.tf_threads import configure_tf_threads

    configure_tf_threads(config.intra_threads, config.inter_threads)
    from offgraph.server.app import create_app

    log.info("serving on http://%s:%d", f"[{host}]" if ":" in host else host, port)
    try:
        started = serve_on(create_app(config), sock, listen.log_level, config.http)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, once it has shut down
        return 0
    return 0 if started else 1

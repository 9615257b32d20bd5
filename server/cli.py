"""`offgraph serve`: the HTTP scoring server under uvicorn."""
from __future__ import annotations

import argparse
import os

from offgraph_cli import add_cpus_argument, pin_cpus
from server.config import ADMIN_TOKEN_ENV


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve every model under MODELS over HTTP (FastAPI + uvicorn)")
    p.add_argument("--models", required=True, help="MODELS directory: serves every MODELS/<name>/ at its newest "
                                                   "complete version")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8500)
    p.add_argument("--cache-mb", type=float, default=256.0,
                   help="row-cache budget in MiB, split between the models (default 256)")
    p.add_argument("--max-candidates", type=int, default=2000, help="most candidates per request (default 2000)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body in MiB (default 8)")
    p.add_argument("--intra-threads", type=int, default=1,
                   help="TensorFlow intra-op threads (default 1: per-request graphs are small; concurrency "
                        "comes from --score-threads)")
    p.add_argument("--inter-threads", type=int, default=1, help="TensorFlow inter-op threads (default 1)")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes sharing the port (default 1). One Python process scores on about one "
                        "core; use about one worker per core the server may use. Admin actions reach every "
                        "worker; metrics are summed; --cache-mb is split between the workers")
    p.add_argument("--score-threads", type=int, default=2,
                   help="threads running the scorer in each worker (default 2: the scorer holds the GIL for "
                        "most of a request, so more threads mostly add contention)")
    p.add_argument("--admin-token", default=None,
                   help=f"bearer token of the admin actions (default: ${ADMIN_TOKEN_ENV}; none: admin disabled)")
    p.add_argument("--poll-seconds", type=float, default=2.0, help="how often MODELS is scanned (default 2)")
    p.add_argument("--follow-seconds", type=float, default=0.05,
                   help="how often each model reads the live updater's feed of applied rows: the freshness of "
                        "streamed rows (default 0.05; plain file reads)")
    p.add_argument("--catch-up-seconds", type=float, default=30.0,
                   help="how often each model's RocksDB view catches up with the updater (default 30; a "
                        "catch-up holds the GIL for milliseconds per shard, the feed keeps rows fresh meanwhile)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_cpus_argument(p, "the server and its workers")
    p.set_defaults(func=run)


def run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pin_cpus(args.cpus)  # first: every thread and worker process inherits it
    from server.config import ServerConfig

    config = ServerConfig(
        models_dir=args.models, cache_mb=args.cache_mb, max_candidates=args.max_candidates,
        max_body_bytes=int(args.max_body_mb * 2**20), poll_seconds=args.poll_seconds,
        admin_token=args.admin_token or ServerConfig.admin_token_from_env(), score_threads=args.score_threads,
        follow_interval_s=args.follow_seconds, catch_up_s=args.catch_up_seconds,
        intra_threads=args.intra_threads, inter_threads=args.inter_threads)
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.workers > 1:
        from server.workers import Supervisor

        return Supervisor(config, args.host, args.port, args.workers, args.log_level).run()
    # TF's pools first, before anything can run a TF op
    from server.tf_threads import configure_tf_threads

    configure_tf_threads(args.intra_threads, args.inter_threads)
    import uvicorn

    from server.app import create_app

    app = create_app(config)
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", workers=1,
                access_log=False, log_level=args.log_level, timeout_graceful_shutdown=10)
    return 0

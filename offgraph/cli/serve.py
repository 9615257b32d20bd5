"""`offgraph serve`: the HTTP scoring server under uvicorn."""

from __future__ import annotations

import argparse
import os

from offgraph.cli import add_cpus_argument, pin_cpus
from offgraph.config import default
from offgraph.server.config import ADMIN_TOKEN_ENV, HttpLimits, MiB, ServerConfig


def server(name: str):
    return default(ServerConfig, name)


def http(name: str):
    return default(HttpLimits, name)


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve every model under MODELS over HTTP (FastAPI + uvicorn)")
    p.add_argument(
        "--models", required=True, help="MODELS directory: serves every MODELS/<name>/ at its newest complete version"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8500)
    p.add_argument(
        "--memory-mb",
        type=float,
        default=server("memory_mb"),
        help="what the caches of EACH worker process may hold, in MiB, all its models together (default "
        "%(default)g: a worker then stays within 1 GB of PSS, TensorFlow included). Each model gets "
        "an even share, split over its row cache (the big share), its store's block cache (the "
        "version's index), its FG item cache and its write-feed mappings; logged at start, on "
        "/metrics and in GET /v1/models/NAME",
    )
    p.add_argument(
        "--cache-mb",
        type=float,
        default=server("cache_mb"),
        help="row cache of the whole server in MiB instead of its share of --memory-mb, split between "
        "the workers and the models (default: the share); the other parts keep theirs",
    )
    p.add_argument(
        "--max-candidates",
        type=int,
        default=server("max_candidates"),
        help="most candidates per request (default %(default)s)",
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=server("max_body_bytes") / MiB,
        help="largest request body in MiB (default %(default)g)",
    )
    p.add_argument(
        "--max-request-values",
        type=int,
        default=server("max_request_values"),
        help="most feature values in one score request: request fields once, item and cross fields once "
        "per candidate (default %(default)s; more is a 422). Each id/tokenize field also has its own "
        "per-row max_values in the model's feature spec",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=http("header_timeout_s"),
        help="seconds for a request's line and headers to arrive, from the connection's opening or the "
        "next request's first byte (default %(default)g; then 408 or close)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=http("body_timeout_s"),
        help="seconds for a request's whole body to arrive after its headers (default %(default)g; then 408 and close)",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=http("keep_alive_timeout_s"),
        help="seconds an idle kept-alive connection stays open (default %(default)g)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=http("max_connections"),
        help="open connections per server process (default %(default)s); past it the connection idle the "
        "longest is closed, and with none idle a new connection's request gets a 503",
    )
    p.add_argument(
        "--intra-threads",
        type=int,
        default=1,
        help="TensorFlow intra-op threads (default 1: per-request graphs are small; concurrency "
        "comes from --score-threads)",
    )
    p.add_argument("--inter-threads", type=int, default=1, help="TensorFlow inter-op threads (default 1)")
    p.add_argument(
        "--workers",
        type=int,
        default=server("workers"),
        help="server processes sharing the port (default %(default)s). One Python process scores on about "
        "one core; use about one worker per core the server may use. Admin actions reach every "
        "worker; metrics are summed; each worker has its own --memory-mb",
    )
    p.add_argument(
        "--score-threads",
        type=int,
        default=server("score_threads"),
        help="threads running the scorer in each worker (default %(default)s: the scorer holds the GIL for "
        "most of a request, so more threads mostly add contention)",
    )
    p.add_argument(
        "--admin-token",
        default=None,
        help=f"bearer token of the admin actions (default: ${ADMIN_TOKEN_ENV}; none: admin disabled)",
    )
    p.add_argument(
        "--poll-seconds",
        type=float,
        default=server("poll_seconds"),
        help="how often MODELS is scanned (default %(default)g)",
    )
    p.add_argument(
        "--follow-seconds",
        type=float,
        default=server("follow_interval_s"),
        help="how often each model reads the live updater's feed of applied rows: the freshness of "
        "streamed rows (default %(default)g; plain file reads)",
    )
    p.add_argument(
        "--catch-up-seconds",
        type=float,
        default=server("catch_up_s"),
        help="how often each model's RocksDB view catches up with the updater (default %(default)g; a "
        "catch-up holds the GIL for milliseconds per shard, the feed keeps rows fresh meanwhile)",
    )
    p.add_argument(
        "--warmup-rows",
        type=int,
        default=server("warmup_rows"),
        help="rows of the serving version's row cache (most recently used first) a new version of the "
        "model reads into its caches before it replaces it (default %(default)s; 0: off)",
    )
    p.add_argument(
        "--load-share",
        type=float,
        default=server("load_share"),
        help="while a version serves, loading and warming the next takes at most this share of the "
        "time, so that its requests keep the rest (default %(default)g; 1: flat out)",
    )
    p.add_argument(
        "--store-io",
        default=server("store_io"),
        choices=["direct", "buffered"],
        help="read the stores' files with direct I/O, past the OS page cache (the default, "
        "predictable beyond RAM: what is cached is this process's own), or buffered through the "
        "page cache (a machine whose RAM holds the stores; --prefetch-store then applies) "
        "(default %(default)s)",
    )
    p.add_argument(
        "--prefetch-store",
        default=server("prefetch_store"),
        choices=["auto", "on", "off"],
        help="read each version's store files into the OS page cache before it serves, so that "
        "requests do not wait on cold blocks from disk: auto when they take at most half the "
        "available memory (default %(default)s)",
    )
    p.add_argument(
        "--prefetch-mb-s",
        type=float,
        default=server("prefetch_mb_s"),
        help="read rate limit of the prefetch in MiB/s while requests are served (default "
        "%(default)g; 0: none; with nothing serving yet it reads as fast as the disk goes)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_cpus_argument(p, "the server and its workers")
    p.set_defaults(func=run)


def run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pin_cpus(args.cpus)  # first: every thread and worker process inherits it
    config = ServerConfig(
        models_dir=args.models,
        memory_mb=args.memory_mb,
        cache_mb=args.cache_mb,
        max_candidates=args.max_candidates,
        max_body_bytes=int(args.max_body_mb * 2**20),
        poll_seconds=args.poll_seconds,
        max_request_values=args.max_request_values,
        http=HttpLimits(
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            keep_alive_timeout_s=args.keep_alive_timeout,
            max_connections=args.max_connections,
        ),
        admin_token=args.admin_token or ServerConfig.admin_token_from_env(),
        score_threads=args.score_threads,
        follow_interval_s=args.follow_seconds,
        catch_up_s=args.catch_up_seconds,
        intra_threads=args.intra_threads,
        inter_threads=args.inter_threads,
        warmup_rows=args.warmup_rows,
        load_share=args.load_share,
        store_io=args.store_io,
        prefetch_store=args.prefetch_store,
        prefetch_mb_s=args.prefetch_mb_s,
    )
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.workers > 1:
        from offgraph.server.workers import Supervisor

        return Supervisor(config, args.host, args.port, args.workers, args.log_level).run()
    # TF's pools first, before anything can run a TF op
    from offgraph.server.tf_threads import configure_tf_threads

    configure_tf_threads(args.intra_threads, args.inter_threads)
    import uvicorn

    from offgraph.server.app import create_app
    from offgraph.server.http_limits import uvicorn_config

    server = uvicorn.Server(
        uvicorn_config(create_app(config), config.http, args.log_level, host=args.host, port=args.port)
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, once it has shut down
        pass
    return 0 if server.started else 1

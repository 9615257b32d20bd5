"""`offgraph update`: the streaming updater process (this module registers only `update`)."""

from __future__ import annotations

import argparse
import json
import logging
import os

from offgraph.cli import add_cpus_argument, pin_cpus
from offgraph.cli.settings_flags import add_settings_flags, settings_from_args
from offgraph.cli.settings_sources import add_settings_sources
from offgraph.streaming.stop_watchdog import StopWatchdog
from offgraph.streaming.updater_config import OFFSET_RESET, UpdaterConfig

log = logging.getLogger("offgraph.update")


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("update", help="apply streaming row deltas to the live model version's store")
    p.add_argument("--models", required=True, help="models directory (MODELS/NAME/VERSION)")
    p.add_argument("--model", required=True, help="model name NAME")
    p.add_argument("--source", required=True, help="delta source: spool:DIR or kafka://HOST:PORT/TOPIC")
    p.add_argument(
        "--dead-letter",
        help="where refused deltas go: a folder for spool:DIR (default DIR/dead), a "
        "topic for kafka://... (default TOPIC.dead)",
    )
    p.add_argument(
        "--on-offset-reset",
        choices=OFFSET_RESET,
        default="stop",
        help="kafka://...: when a partition's offsets go backwards (the broker lost its log, the topic "
        "was re-created): stop (rc 2), or rebase (read its new log from the beginning, as a new "
        "stream); default %(default)s. See offgraph/streaming/README.md, 'Offset resets'",
    )
    p.add_argument(
        "--delete-applied",
        action="store_true",
        help="delete applied spool files instead of moving them to DIR/applied/",
    )
    add_settings_flags(p, UpdaterConfig, exclude={"version_check_s"})
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="raise the process's nice value by this much (e.g. 10: serving gets the CPU first)",
    )
    p.add_argument(
        "--idle-priority",
        action="store_true",
        help="run at SCHED_IDLE (Linux): the updater only gets CPU time that nothing else wants, so "
        "on a machine shared with a server it never preempts serving",
    )
    add_cpus_argument(p, "the updater")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default: none)")
    p.add_argument("--log-every", type=float, default=5.0, help="seconds between progress log lines")
    p.add_argument("--once", action="store_true", help="apply what can be applied now, then exit")
    p.add_argument("--max-seconds", type=float, help="exit after this many seconds (default: run until stopped)")
    add_settings_sources(p, sub)
    p.set_defaults(func=run_update)


def run_update(args) -> int:
    from offgraph.streaming.metrics import UpdaterMetrics
    from offgraph.streaming.sources import open_source
    from offgraph.streaming.updater import Updater

    watchdog = StopWatchdog()  # first: a SIGTERM from here on ends the process within its grace time
    config = settings_from_args(UpdaterConfig, args)
    pin_cpus(args.cpus)  # before the store opens: RocksDB's threads inherit it
    if args.nice:
        if args.nice < 0:
            raise ValueError(f"--nice must be >= 0, got {args.nice}")
        os.nice(args.nice)  # before the store opens: RocksDB's threads inherit it
    if args.idle_priority:
        if not hasattr(os, "SCHED_IDLE"):
            raise ValueError("--idle-priority needs Linux (SCHED_IDLE)")
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # inherited by RocksDB's threads too
    kw = {"dead_letter_dir": args.dead_letter, "delete_applied": args.delete_applied}
    if args.source.startswith("kafka:"):  # names the group whose (informational) offsets it commits
        kw["store_hint"] = f"{os.path.abspath(args.models)}/{args.model}@{os.uname().nodename}"
        kw["on_offset_reset"] = args.on_offset_reset
    source = open_source(args.source, **kw)
    metrics = UpdaterMetrics(args.model, port=args.metrics_port, log_every_s=args.log_every)
    up = Updater(args.models, args.model, source, config, metrics=metrics)
    watchdog.on_stop(up.stop)
    # run() starts it: a model with no complete version yet (its pod's server still copying one down from
    # object storage) and a remote store that does not answer yet (a cluster still starting or failing
    # over) are waited for; with --once no version is an error
    summary = up.run(once=args.once, max_seconds=args.max_seconds)
    print(json.dumps({"update": summary}), flush=True)
    return 0

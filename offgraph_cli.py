"""`offgraph` command line: each package registers its own subcommands."""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys

# subcommand modules, by name; each has register_cli(subparsers)
COMMANDS = [
    "dense_model.datasets",
    "dense_model.cli_train",
    "exporter.cli",
    "server.cli",
    "streaming.cli",
    "streaming.cli_stream_train",
]


def add_cpus_argument(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument("--cpus", default=None, metavar="LIST",
                   help=f"pin {who} (every thread it starts) to these CPUs, e.g. '0' or '0-3,6' (Linux; default: "
                        "all). Keeping a server and an updater on separate CPUs stops the kernel from moving the "
                        "server's threads around when the updater is busy (its p99 then does not rise)")


def pin_cpus(spec: str | None) -> set[int] | None:
    """Pin this process to the CPUs of ``spec`` ("0-3,6") before it starts threads; ValueError if invalid."""
    if spec is None:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise ValueError(f"--cpus {spec!r}: expected a list like '0' or '0-3,6'")
        cpus.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ValueError(f"--cpus {spec!r}: CPUs {sorted(cpus - allowed) or 'none'} are not available "
                         f"(available: {sorted(allowed)})")
    os.sched_setaffinity(0, cpus)
    logging.getLogger("offgraph").info("pinned to CPUs %s", sorted(cpus))
    return cpus


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="offgraph", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        importlib.import_module(mod).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # SpecError, DataError, FeatureValueError are ValueErrors
        print(f"offgraph {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

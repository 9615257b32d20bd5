"""`offgraph` command line: each package registers its own subcommands."""
from __future__ import annotations

import argparse
import logging
import os
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

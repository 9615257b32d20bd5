"""`offgraph` command line: each package registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys

from offgraph import __version__

# subcommand modules, by name; each has register_cli(subparsers) and imports nothing heavy at module level
# (no TensorFlow, NumPy or PyArrow): `offgraph --help` imports them all (tests/cli/test_cli_startup.py)
from offgraph.log_format import FORMAT_ENV, FORMATS, configure_logging
from offgraph.runtime import install_quiet_tensorflow_import, pin_cpus, uninstall_quiet_tensorflow_import  # noqa: F401 (pin_cpus: the subcommands')

COMMANDS = [
    "offgraph.cli.data",
    "offgraph.cli.train",
    "offgraph.cli.spec",
    "offgraph.cli.export",
    "offgraph.cli.import_model",
    "offgraph.cli.synth",
    "offgraph.cli.features",
    "offgraph.cli.serve",
    "offgraph.cli.plan",
    "offgraph.cli.update",
    "offgraph.cli.stream_train",
    "offgraph.cli.prune",
    "offgraph.cli.experiment",
]


def add_cpus_argument(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument(
        "--cpus",
        default=None,
        metavar="LIST",
        help=f"pin {who} (every thread it starts) to these CPUs, e.g. '0' or '0-3,6' (Linux; default: "
        "all). Keeping a server and an updater on separate CPUs stops the kernel from moving the "
        "server's threads around when the updater is busy (its p99 then does not rise)",
    )


class LazyChoices:
    """argparse ``choices``: the sorted names of ``module.attr``, imported the first time argparse needs
    them (to check a value given or to print that subcommand's help), so that building the parser
    imports no heavy module and keeps `offgraph --help` fast. Give the argument a ``metavar`` (argparse
    would list the choices in it when the argument is added) and "%(choices)s" in its help."""

    def __init__(self, module: str, attr: str):
        self.module, self.attr = module, attr
        self._names: list[str] | None = None

    def names(self) -> list[str]:
        if self._names is None:
            self._names = sorted(getattr(importlib.import_module(self.module), self.attr))
        return self._names

    def __contains__(self, value) -> bool:
        return value in self.names()

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


SERVER_EXTRA = "this command needs the server's dependencies: pip install 'offgraph[server]'"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand. Imports each COMMANDS module, which must not import TensorFlow
    (a subcommand imports what it needs when it runs): `offgraph --help` stays fast."""
    # here, not at the top: `pip install offgraph` (the client alone) has no pydantic, and `offgraph` then says so
    from offgraph.cli.settings_flags import Parser  # every parser's help states each flag's default

    parser = Parser(prog="offgraph", description=__doc__)
    parser.add_argument("--version", action="version", version=f"offgraph {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and TensorFlow's and absl's messages (hidden by default)",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        metavar="FORMAT",
        help="log lines on stderr: %(choices)s (json: one object per line, with time, level, logger, message "
        "and the line's extra fields) (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        importlib.import_module(mod).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    install_quiet_tensorflow_import()  # before the parser: no module may import TensorFlow unseen
    try:
        args = build_parser().parse_args(argv)
        if args.verbose:  # everything TensorFlow says, at the level the caller's environment asks for
            uninstall_quiet_tensorflow_import()
            os.environ["OFFGRAPH_VERBOSE"] = "1"  # offgraph.server.process.workers.VERBOSE_ENV: spawned workers follow
        else:  # read by TensorFlow when it is imported, and by the server's worker processes
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ[FORMAT_ENV] = args.log_format  # spawned workers log the same way
        configure_logging(logging.DEBUG if args.verbose else logging.INFO, args.log_format, verbose=args.verbose)
        try:
            return int(args.func(args) or 0)
        except (ValueError, OSError) as e:  # SpecError, DataError, FeatureValueError are ValueErrors
            print(f"offgraph {args.command}: error: {e}", file=sys.stderr)
            return 2
    except ModuleNotFoundError as e:
        if (e.name or "offgraph").partition(".")[0] == "offgraph" or not _server_extra_missing():
            raise  # a bug, not an install without the extra
        print(f"{_prog(sys.argv[1:] if argv is None else argv)}: error: {SERVER_EXTRA}", file=sys.stderr)
        return 2
    finally:  # main() may be called in a process that goes on (tests)
        uninstall_quiet_tensorflow_import()


def _server_extra_missing() -> bool:
    """Whether a distribution of the extra ``server`` is not installed (``pip install offgraph``: the client)."""
    from importlib.metadata import PackageNotFoundError, distribution, requires

    try:
        wanted = requires("offgraph") or []
    except PackageNotFoundError:  # a source tree, not installed: no record to tell a missing extra by
        return True
    for req in wanted:
        name = re.match(r"[A-Za-z0-9._-]+", req)
        if name and re.search(r"""extra\s*==\s*["']server["']""", req):
            try:
                distribution(name.group(0))
            except PackageNotFoundError:
                return True
    return False


def _prog(argv: list[str]) -> str:
    """``offgraph CMD`` of an argument list the parser could not read (its first word not an option)."""
    words = iter(argv)
    for w in words:
        if w == "--log-format":
            next(words, None)
        elif not w.startswith("-"):
            return f"offgraph {w}"
    return "offgraph"


if __name__ == "__main__":
    sys.exit(main())

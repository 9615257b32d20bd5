"""`offgraph` command line: each package registers its own subcommands."""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import logging
import os
import re
import sys

# subcommand modules, by name; each has register_cli(subparsers) and imports nothing heavy at module level
# (no TensorFlow, NumPy or PyArrow): `offgraph --help` imports them all (tests/test_cli_startup.py)
COMMANDS = [
    "dense_model.cli_data",
    "dense_model.cli_train",
    "exporter.cli",
    "exporter.cli_synth",
    "exporter.cli_features",
    "server.cli",
    "server.plan",
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


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand. Imports each COMMANDS module, which must not import TensorFlow
    (a subcommand imports what it needs when it runs): `offgraph --help` stays fast."""
    parser = argparse.ArgumentParser(prog="offgraph", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and TensorFlow's C++ start-up messages (hidden by default)")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        importlib.import_module(mod).register_cli(sub)
    return parser


# Lines TensorFlow's C++ code writes to file descriptor 2 while `import tensorflow` runs, before any
# log level applies: absl's pre-initialisation notice and INFO lines (oneDNN, CPU features).
# TF_CPP_MIN_LOG_LEVEL does not reach them, and TF_ENABLE_ONEDNN_OPTS would change the maths.
_TF_IMPORT_NOISE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called"
                              r"|I\d{4} [\d:. ]+\d+ \S+:\d+\] ")


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs the first `import tensorflow` with fd 2 sent to a temporary file, then writes back to stderr
    every captured line but the start-up noise (all of it if the import fails). fd 2 is process-wide:
    meant for the CLI's own process, before it starts threads."""

    def __init__(self) -> None:
        self._loader: importlib.abc.Loader | None = None

    def find_spec(self, name, path, target=None):
        if name != "tensorflow" or self._loader is not None:
            return None
        uninstall_quiet_tensorflow_import()
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        import tempfile

        sys.stderr.flush()
        saved = os.dup(2)
        ok = False
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                module.__spec__.loader = module.__loader__ = self._loader  # invisible once imported
                self._loader.exec_module(module)
                ok = True
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                lines = captured.read().decode(errors="replace").splitlines(keepends=True)
                keep = [ln for ln in lines if not (ok and _TF_IMPORT_NOISE.match(ln))]
                sys.stderr.write("".join(keep))
                sys.stderr.flush()


def install_quiet_tensorflow_import() -> None:
    """Hide TensorFlow's C++ start-up lines when this process first imports it (no effect once it is
    imported). Set TF_CPP_MIN_LOG_LEVEL too for its later INFO and WARNING lines."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


def uninstall_quiet_tensorflow_import() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorFlowImport)]


def main(argv: list[str] | None = None) -> int:
    install_quiet_tensorflow_import()  # before the parser: no module may import TensorFlow unseen
    try:
        args = build_parser().parse_args(argv)
        if args.verbose:  # everything TensorFlow says, at the level the caller's environment asks for
            uninstall_quiet_tensorflow_import()
            os.environ["OFFGRAPH_VERBOSE"] = "1"  # server.workers.VERBOSE_ENV: spawned workers follow
        else:  # read by TensorFlow when it is imported, and by the server's worker processes
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            return int(args.func(args) or 0)
        except (ValueError, OSError) as e:  # SpecError, DataError, FeatureValueError are ValueErrors
            print(f"offgraph {args.command}: error: {e}", file=sys.stderr)
            return 2
    finally:  # main() may be called in a process that goes on (tests)
        uninstall_quiet_tensorflow_import()


if __name__ == "__main__":
    sys.exit(main())

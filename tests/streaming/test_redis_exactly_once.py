"""Exactly once into a Redis Cluster: a Kafka stream of row deltas applied by `offgraph update` to a version
whose rows live in a real cluster (3 masters, 3 replicas), while the updater is killed -9 and a master
holding the store's shards is killed -9 mid-stream (its replica takes over; the batches it had not
replicated are lost with their positions, the updater is fenced and replays them). Afterwards the store
holds exactly the last-write-wins state of every delta sent. ``OFFGRAPH_REDIS_STREAM_DELTAS`` sizes the
stream (CI default: small)."""

import json
import os
import signal
import time

import numpy as np
import pytest
from kafka_helpers import broker, caught_up, delta, rows_of, start_updater, stop, stored_positions  # noqa: F401
from kafka_helpers import sink as _sink
from kafka_helpers import topic_name as _topic
from redis_helpers import cluster  # noqa: F401 (the module's fixture)
from streaming_helpers import NAME, last_write_wins, train_tiny

from offgraph.export.export import export_run
from offgraph.store.redis_store import shard_key

DELTAS = int(os.environ.get("OFFGRAPH_REDIS_STREAM_DELTAS", "120000"))
PER_MESSAGE = 2000
UPDATER_KILLS = int(os.environ.get("OFFGRAPH_REDIS_STREAM_KILLS", "3"))
FAILOVERS = int(os.environ.get("OFFGRAPH_REDIS_STREAM_FAILOVERS", "1"))


@pytest.fixture(scope="module")
def redis_version(tmp_path_factory, cluster):  # noqa: F811
    root = tmp_path_factory.mktemp("redis-stream")
    vdir = root / "models" / NAME / "1"
    export_run(train_tiny(root), vdir, shards=6, quant="fp32", progress=False, backend=cluster.url)
    return vdir


class Supervised:
    """The updater as systemd runs it (Restart=always): started again whenever it exits."""

    def __init__(self, models, topic, broker, log):  # noqa: F811
        self.args, self.log = (models, topic, broker, log), log
        self.proc = start_updater(*self.args)
        self.exits: list[int] = []

    def tend(self) -> None:
        if self.proc.poll() is not None:
            self.exits.append(self.proc.returncode)
            self.proc = start_updater(*self.args)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.tend()


@pytest.mark.timeout(600)
def test_updater_kills_and_master_failovers_leave_exactly_the_last_write_wins_state(
    broker,  # noqa: F811
    cluster,  # noqa: F811
    redis_version,
    tmp_path,
    request,
):
    topic = _topic(request)
    models = redis_version.parent.parent
    namespace = json.loads((redis_version / "store" / "store.json").read_text())["config"]["namespace"]
    rng = np.random.default_rng(7)
    n_messages = max(4, DELTAS // PER_MESSAGE)
    deltas = [delta(rng, PER_MESSAGE, 1 + PER_MESSAGE * i) for i in range(n_messages)]
    for i in range(7, n_messages, 9):  # stale seqs among them: last write wins by seq, not by arrival
        deltas[i]["seqs"] = deltas[i]["seqs"] - 10_000
    sink = _sink(broker, topic, redis_version)
    up = Supervised(models, topic, broker, tmp_path / "update.log")
    kills_at = set(np.linspace(n_messages * 0.15, n_messages * 0.85, UPDATER_KILLS).astype(int).tolist())
    failovers_at = set(np.linspace(n_messages * 0.3, n_messages * 0.7, FAILOVERS).astype(int).tolist())
    failed_over = 0
    try:
        for i, d in enumerate(deltas):
            sink.emit(d)
            up.tend()
            if i in kills_at:
                sink.flush()
                time.sleep(0.3)  # the updater is applying: kill it mid-stream
                up.kill()
            if i in failovers_at:
                sink.flush()
                time.sleep(0.3)
                key = shard_key(namespace, i % 6)
                master = cluster.master_of(key)
                cluster.kill(master)  # kill -9 mid-stream: its replica is promoted
                cluster.wait_failover(key, master)
                cluster.start(master)  # back, as a replica of the new master
                failed_over += 1
        sink.flush()
        t_end = time.monotonic() + 240
        while not caught_up(redis_version, topic, sink.last_offsets):
            assert time.monotonic() < t_end, (stored_positions(redis_version, topic), up.log.read_text()[-3000:])
            up.tend()
            time.sleep(0.2)
    finally:
        stop(up.proc)
        sink.close()
    assert failed_over == FAILOVERS
    log = up.log.read_text()
    assert "error:" not in log, log[-3000:]  # the cluster's faults were waited for, not exits
    assert all(code == -signal.SIGKILL for code in up.exits), up.exits  # only the kills ended it
    t, r, s, v, w = last_write_wins(deltas)
    gv, gw, gs = rows_of(redis_version, t, r)
    wrong = int(np.sum((gs != s) | np.any(gv != v, axis=1) | (gw != w)))
    assert wrong == 0, f"{wrong} of {len(t)} rows differ from the last-write-wins state"
    print(
        f"redis exactly-once: {len(deltas) * PER_MESSAGE} deltas, {UPDATER_KILLS} updater kills, "
        f"{failed_over} master failovers, {log.count('reopening it')} reopens logged "
        f"({log.count('no longer holds')} fenced), 0 of {len(t)} rows differ"
    )


@pytest.mark.timeout(300)
def test_a_failover_that_loses_acknowledged_batches_is_fenced_and_replayed(
    broker,  # noqa: F811
    cluster,  # noqa: F811
    redis_version,
    tmp_path,
    request,
):
    """The loss made to happen: the replica of the master holding shard 0 is stopped (SIGSTOP) and its
    replication link cut, the updater applies batches the master acknowledges but cannot replicate, the master is killed -9 and the
    stale replica resumed and promoted. Shard 0 then holds older rows AND older positions; the updater's
    next batch there is fenced, it reopens the store, replays from those positions, and the store ends
    at exactly the last-write-wins state."""
    topic = _topic(request)
    models = redis_version.parent.parent
    namespace = json.loads((redis_version / "store" / "store.json").read_text())["config"]["namespace"]
    rng = np.random.default_rng(11)
    deltas = [delta(rng, PER_MESSAGE, 10**8 + 1 + PER_MESSAGE * i) for i in range(30)]
    sink = _sink(broker, topic, redis_version)
    up = Supervised(models, topic, broker, tmp_path / "update.log")
    try:
        for d in deltas[:10]:
            sink.emit(d)
        sink.flush()
        wait_caught_up(redis_version, topic, sink, up)
        master = cluster.master_of(shard_key(namespace, 0))
        (replica,) = cluster.replicas_of(master)
        cluster.pause(replica)
        cluster.cut_replication(master)  # (a paused replica still takes in what its socket receives)
        try:
            for d in deltas[10:20]:  # acknowledged by the master only
                sink.emit(d)
            sink.flush()
            wait_caught_up(redis_version, topic, sink, up)
            cluster.kill(master)
        finally:
            cluster.resume(replica)
        assert cluster.wait_failover(shard_key(namespace, 0), master).port == replica.port  # the stale one
        for d in deltas[20:]:
            sink.emit(d)
        sink.flush()
        wait_caught_up(redis_version, topic, sink, up)
        cluster.start(master)
    finally:
        stop(up.proc)
        sink.close()
    log = up.log.read_text()
    assert "no longer holds this writer's last batch" in log, log[-3000:]  # the loss happened, and was seen
    assert up.exits == [], up.exits
    t, r, s, v, w = last_write_wins(deltas)
    gv, gw, gs = rows_of(redis_version, t, r)
    wrong = int(np.sum((gs != s) | np.any(gv != v, axis=1) | (gw != w)))
    assert wrong == 0, f"{wrong} of {len(t)} rows differ from the last-write-wins state"


def wait_caught_up(vdir, topic, sink, up, timeout: float = 120) -> None:
    t_end = time.monotonic() + timeout
    while not caught_up(vdir, topic, sink.last_offsets):
        assert time.monotonic() < t_end, (stored_positions(vdir, topic), up.log.read_text()[-3000:])
        up.tend()
        time.sleep(0.1)

"""Kafka as the row-delta transport, against a real Kafka-protocol broker (Tansu, in-memory, on
loopback): the message format and partitioning, the source's contract, replicas that converge
(one SIGKILLed and restarted), a new replica from the version directory, poison messages to the
dead-letter topic, and a version switch."""

import json
import signal
import time

import numpy as np
from kafka_helpers import (  # noqa: F401
    P,
    broker,
    caught_up,
    consume_all,
    delta,
    rows_of,
    start_updater,
    stop,
    stored_positions,
    tiny_export,  # noqa: F401 - fixtures
)
from kafka_helpers import sink as _sink
from kafka_helpers import topic_name as _topic
from streaming_helpers import DIM, NAME, install_version, last_write_wins

from offgraph.store.keys import shard_of
from offgraph.streaming.kafka.messages import encode_messages


def test_messages_partition_rows_and_the_source_delivers_acks_seeks_and_dead_letters(
    broker, tiny_export, tmp_path, request
):
    from offgraph.streaming.sources import open_source

    topic = _topic(request)
    rng = np.random.default_rng(0)
    deltas = [delta(rng, 3000, 1 + 10_000 * i) for i in range(3)]
    vdir = install_version(tiny_export, tmp_path / "models", 1)
    with _sink(broker, topic, vdir) as sink:
        for d in deltas:
            sink.emit(d)
    start = json.loads((vdir / "stream-start.json").read_text())
    assert start == {"topic": topic, "partitions": {str(p): 0 for p in range(P)}}  # the version's markers
    src = open_source(f"kafka://{broker}/{topic}")
    try:
        assert src.position_keys() == [f"kafka/{topic}/{p}".encode() for p in range(P)]
        src.seek({})
        items = []
        t_end = time.monotonic() + 30
        while len(items) < sink.messages and time.monotonic() < t_end:
            src.wait(0.5)
            items = src.poll(1000)
        assert len(items) == sink.messages
        rows = 0
        for it in items:
            b = it.read()
            assert (b.model, b.model_version, b.dim) == (NAME, 1, DIM)
            assert (shard_of(b.table_ids, b.rows, P) == it.partition).all()  # each row in its partition
            rows += len(b)
        assert rows == 9000
        per_part = {}
        for it in items:  # in offset order within a partition
            per_part.setdefault(it.partition, []).append(it.offset)
        assert all(offs == sorted(offs) and offs[0] == 0 for offs in per_part.values())
        assert len(src.poll(1000)) == len(items)  # not consumed until acked
        first = [it for it in items if it.partition == 0][:2]
        src.ack(first[0])
        where = src.reject(first[1], "because: a test")
        assert f"{topic}.dead" in where
        pos = src.positions()
        assert pos == {f"kafka/{topic}/0".encode(): first[1].position}  # the offset and the message's fingerprint
        assert first[1].position.startswith(f"{first[1].offset:020d}.")
    finally:
        src.close()
    (dead,) = consume_all(broker, f"{topic}.dead", 1, expect=1)
    assert dead[3]["offgraph.dead_letter.reason"] == b"because: a test"
    assert dead[3]["offgraph.dead_letter.origin"] == f"{topic}/0/{first[1].offset}".encode()
    src2 = open_source(f"kafka://{broker}/{topic}")
    try:
        src2.seek(pos)
        got = []
        t_end = time.monotonic() + 30
        while len(got) < len(items) - 2 and time.monotonic() < t_end:
            src2.wait(0.5)
            got = src2.poll(1000)
        assert sorted((i.partition, i.offset) for i in got) == sorted(
            (i.partition, i.offset)
            for i in items
            if (i.partition, i.offset) not in {(0, first[0].offset), (0, first[1].offset)}
        )
    finally:
        src2.close()


def test_two_replicas_converge_one_killed_and_a_new_one_started_from_the_version_dir(
    broker, tiny_export, tmp_path, request
):
    topic = _topic(request)
    models = [tmp_path / f"replica{i}" for i in range(3)]
    vdirs = [install_version(tiny_export, m, 1) for m in models[:2]]
    sink = _sink(broker, topic, vdirs[0])
    rng = np.random.default_rng(1)
    deltas = [delta(rng, 2000, 1 + 2000 * i) for i in range(60)]
    for i in range(7, 60, 7):  # stale seqs among them: last write wins by seq, not by arrival
        deltas[i]["seqs"] = deltas[i]["seqs"] - 10_000
    logs = [tmp_path / f"update{i}.log" for i in range(3)]
    ups = [start_updater(models[i], topic, broker, logs[i]) for i in range(2)]
    try:
        for i, d in enumerate(deltas):
            sink.emit(d)
            if i == 25:
                sink.flush()
                time.sleep(0.5)  # replica 1 is applying: kill it mid-stream
                ups[1].send_signal(signal.SIGKILL)
                ups[1].wait(10)
            if i == 40:
                ups[1] = start_updater(models[1], topic, broker, logs[1])
        sink.flush()
        # a new replica from the exported version directory, as the producer recorded where it begins
        vdirs.append(install_version(tiny_export, models[2], 1))
        (vdirs[2] / "stream-start.json").write_bytes((vdirs[0] / "stream-start.json").read_bytes())
        ups.append(start_updater(models[2], topic, broker, logs[2]))
        t_end = time.monotonic() + 120
        while not all(caught_up(v, topic, sink.last_offsets) for v in vdirs):
            assert time.monotonic() < t_end, [stored_positions(v, topic) for v in vdirs]
            for u, lg in zip(ups, logs):
                assert u.poll() is None, lg.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        stop(*ups)
        sink.close()
    t, r, s, v, w = last_write_wins(deltas)
    got = [rows_of(vd, t, r) for vd in vdirs]
    for gv, gw, gs in got:
        assert gs.tolist() == s.tolist()
        np.testing.assert_array_equal(gv, v)
        np.testing.assert_array_equal(gw, w)
    assert " -> kafka topic" not in "".join(lg.read_text() for lg in logs)  # markers and deltas: none refused
    assert "the version begins at" in logs[2].read_text()


def test_poison_messages_go_to_the_dead_letter_topic_and_the_rest_is_applied(broker, tiny_export, tmp_path, request):
    from confluent_kafka import Producer

    topic = _topic(request)
    vdir = install_version(tiny_export, tmp_path / "models", 1)
    sink = _sink(broker, topic)
    rng = np.random.default_rng(2)
    good = [delta(rng, 500, 1 + 1000 * i) for i in range(4)]
    sink.emit(good[0])
    sink.flush()
    prod = Producer({"bootstrap.servers": broker, "log_level": 2})
    poison = {b"not arrow at all": "not an Arrow IPC file", b"": "empty"}
    for value in poison:
        prod.produce(topic, value=value, partition=1)
    bad_rows = delta(rng, 5, 10**9)
    bad_rows["rows"] = bad_rows["rows"] + 10**6  # beyond every table
    for p, value, hdrs in encode_messages(bad_rows, P):
        prod.produce(topic, value=value, partition=p, headers=hdrs)
    other = {**delta(rng, 5, 10**9), "model": "someone-else"}
    for p, value, hdrs in encode_messages(other, P):
        prod.produce(topic, value=value, partition=p, headers=hdrs)
    assert prod.flush(10) == 0
    n_bad = (
        2
        + len({int(x) for x in shard_of(bad_rows["table_ids"], bad_rows["rows"], P)})
        + len({int(x) for x in shard_of(other["table_ids"], other["rows"], P)})
    )
    for d in good[1:]:
        sink.emit(d)
    sink.flush()
    up = start_updater(tmp_path / "models", topic, broker, tmp_path / "update.log")
    try:
        t_end = time.monotonic() + 60
        while not caught_up(vdir, topic, sink.last_offsets):
            assert up.poll() is None and time.monotonic() < t_end, (tmp_path / "update.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        stop(up)
        sink.close()
    dead = consume_all(broker, f"{topic}.dead", 1, expect=n_bad)
    reasons = [m[3]["offgraph.dead_letter.reason"].decode() for m in dead]
    assert len(dead) == n_bad, reasons
    assert any("not an Arrow IPC file" in x for x in reasons) and any("empty" in x for x in reasons)
    assert any("rows beyond their table" in x for x in reasons)
    assert any("someone-else" in x for x in reasons)
    assert all(m[3]["offgraph.dead_letter.origin"].startswith(topic.encode() + b"/") for m in dead)
    t, r, s, v, w = last_write_wins(good)
    gv, gw, gs = rows_of(vdir, t, r)
    assert gs.tolist() == s.tolist()
    np.testing.assert_array_equal(gv, v)


def test_a_new_version_switches_the_topic_position_old_deltas_refused(broker, tiny_export, tmp_path, request):
    topic = _topic(request)
    models = tmp_path / "models"
    v1 = install_version(tiny_export, models, 1)
    rng = np.random.default_rng(3)
    up = start_updater(models, topic, broker, tmp_path / "update.log")
    sink = _sink(broker, topic, v1)
    try:
        d1 = [delta(rng, 300, 1 + 1000 * i) for i in range(3)]
        for d in d1:
            sink.emit(d)
        sink.flush()
        t_end = time.monotonic() + 60
        while not caught_up(v1, topic, sink.last_offsets):
            assert up.poll() is None and time.monotonic() < t_end, (tmp_path / "update.log").read_text()[-3000:]
            time.sleep(0.2)
        v2 = install_version(tiny_export, models, 2)
        sink.version_dir = v2
        d2 = [delta(rng, 300, 10_000 + 1000 * i, version=2) for i in range(3)]
        late_v1 = delta(rng, 50, 50_000, version=1)
        for d in d2[:2]:
            sink.emit(d)
        sink.emit(late_v1)  # produced after version 2 began: refused, not applied to either
        sink.emit(d2[2])
        sink.flush()
        t_end = time.monotonic() + 60
        while not caught_up(v2, topic, sink.last_offsets):
            assert up.poll() is None and time.monotonic() < t_end, (tmp_path / "update.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        stop(up)
        sink.close()
    assert json.loads((v2 / "stream-start.json").read_text())["topic"] == topic
    t, r, s, v, w = last_write_wins(d2)
    gv, _, gs = rows_of(v2, t, r)
    assert gs.tolist() == s.tolist()
    np.testing.assert_array_equal(gv, v)
    t1, r1, s1, _, _ = last_write_wins(d1)
    assert rows_of(v1, t1, r1)[2].tolist() == s1.tolist()  # v1 kept what it had
    n_late = len({int(x) for x in shard_of(late_v1["table_ids"], late_v1["rows"], P)})
    dead = consume_all(broker, f"{topic}.dead", 1, expect=n_late)
    assert len(dead) == n_late
    assert all(b"version 2 is live" in m[3]["offgraph.dead_letter.reason"] for m in dead)

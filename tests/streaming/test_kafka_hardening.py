"""The Kafka updater never stalls, crash-loops or loses rows at the broker's edges,
against a real Kafka-protocol broker (Tansu, in memory, on loopback) and `offgraph update` as a
subprocess: a 32 MiB message, offsets that go backwards (a broker that lost its log), a message
from the future, a hostile stream-start.json, a broker that is down."""

import logging
import time
import urllib.request

import numpy as np
from kafka_helpers import (  # noqa: F401
    P,
    broker,
    caught_up,
    consume_all,
    delta,
    raw_producer,
    sink,
    start_updater,
    stop,
    tiny_export,
    topic_name,
    wait_until,
)
from streaming_helpers import NAME, assert_store_holds, install_version, make_deltas, publish, spool_files

from offgraph.streaming.kafka.messages import encode_messages
from offgraph.testing.harness import free_port
from offgraph.testing.tansu import TansuBroker


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _metric(port: int, name: str) -> float | None:
    for line in _metrics(port).splitlines():
        if line.startswith(f'{name}{{model="{NAME}"}} '):
            return float(line.split()[-1])
    return None


# --------------------------------------------------------------------------- item 1
def test_a_32mib_message_is_dead_lettered_as_a_reference_and_the_rest_applied(broker, tiny_export, tmp_path, request):
    """32 MiB of zeros reach the broker zstd-compressed (Tansu takes 16 MiB a request); the updater
    reads at most 16 MiB, and the dead-letter producer cannot copy it either (was: KafkaException
    MSG_SIZE_TOO_LARGE from reject(), on every restart): a reference goes to the dead letters."""
    topic = topic_name(request)
    vdir = install_version(tiny_export, tmp_path / "models", 1)
    rng = np.random.default_rng(21)
    good = [delta(rng, 400, 1 + 1000 * i) for i in range(4)]
    out = sink(broker, topic)
    out.emit(good[0])
    out.flush()
    prod, delivered = raw_producer(broker, compression_type="zstd"), []
    prod.produce(topic, value=bytes(32 << 20), partition=1, on_delivery=lambda e, m: delivered.append((e, m.offset())))
    assert prod.flush(60) == 0 and delivered and delivered[0][0] is None, delivered
    huge_offset = delivered[0][1]
    for d in good[1:]:
        out.emit(d)
    out.flush()
    log = tmp_path / "update.log"
    up = start_updater(tmp_path / "models", topic, broker, log)
    try:
        wait_until(lambda: caught_up(vdir, topic, out.last_offsets), 120, up, log=log, what="applied past it")
    finally:
        stop(up)
        out.close()
    (dead,) = consume_all(broker, f"{topic}.dead", 1, expect=1)
    _, _, value, hdrs = dead
    assert not value
    assert hdrs["offgraph.dead_letter.topic"] == topic.encode()
    assert hdrs["offgraph.dead_letter.partition"] == b"1"
    assert hdrs["offgraph.dead_letter.offset"] == str(huge_offset).encode()
    assert hdrs["offgraph.dead_letter.size"] == str(32 << 20).encode()
    assert hdrs["offgraph.dead_letter.origin"] == f"{topic}/1/{huge_offset}".encode()
    assert b"message of 33554432 bytes" in hdrs["offgraph.dead_letter.reason"]
    assert b"payload is not copied" in hdrs["offgraph.dead_letter.reason"]
    assert_store_holds(vdir, good)


# --------------------------------------------------------------------------- item 2
def _two_logs(tiny_export, tmp_path, request, seed: int, rows: int, n_a: int, n_b: int):
    """A version, a broker of its own (restarted by the test: its log is lost) and two lists of deltas:
    A for the log before the loss, B (higher seqs) for the one after. (topic, models, vdir, A, B, broker, log)"""
    topic = topic_name(request)
    models = tmp_path / "models"
    vdir = install_version(tiny_export, models, 1)
    rng = np.random.default_rng(seed)
    a = [delta(rng, rows, 1 + 1000 * i) for i in range(n_a)]
    b = [delta(rng, rows, 100_000 + 1000 * i) for i in range(n_b)]
    kafka = TansuBroker(tmp_path / "tansu.log")
    kafka.start()
    return topic, models, vdir, a, b, kafka, tmp_path / "update.log"


def _run_until_it_exits(models, topic, bootstrap, log) -> tuple[int | None, str]:
    """An updater run (stopped after 90 s at most): its exit status and what it logged."""
    mark = log.stat().st_size
    up = start_updater(models, topic, bootstrap, log)
    try:
        up.wait(90)
    finally:
        stop(up)
    return up.returncode, log.read_text()[mark:]


def test_a_broker_that_lost_its_log_stops_the_updater_then_rebase_applies_the_new_log(tiny_export, tmp_path, request):
    """The issue's case: the store recorded offsets; the broker comes back empty (first: the
    partitions end before the recorded offsets), then takes a re-sent delta and new ones at
    offsets at and below the recorded ones (was: all acknowledged, none applied, nothing logged).
    Default: rc 2 with one line; rebase: all applied."""
    from offgraph.streaming.kafka.admin import ensure_topic

    topic, models, vdir, a, b, kafka, log = _two_logs(tiny_export, tmp_path, request, 22, 300, 6, 8)
    try:
        out = sink(kafka.bootstrap, topic)
        for d in a:
            out.emit(d)
        out.flush()
        up = start_updater(models, topic, kafka.bootstrap, log)
        try:
            wait_until(lambda: caught_up(vdir, topic, out.last_offsets), 120, up, log=log, what="A applied")
        finally:
            stop(up)
            out.close()
        kafka.kill()
        kafka.start()  # in-memory storage: the log is gone
        ensure_topic(kafka.bootstrap, topic, P)  # empty: every partition ends before its recorded offset
        rc, said = _run_until_it_exits(models, topic, kafka.bootstrap, log)
        assert rc == 2 and "the partition now ends at offset 0, before offset" in said, said[-3000:]
        out = sink(kafka.bootstrap, topic)
        for d in [a[-1], *b]:  # one re-sent, the rest new: offsets from 0 again, beyond the recorded ones
            out.emit(d)
        out.flush()
        rc, said = _run_until_it_exits(models, topic, kafka.bootstrap, log)
        assert rc == 2, said[-3000:]
        (line,) = [x for x in said.splitlines() if x.startswith("offgraph update: error:")]
        assert "offsets went backwards" in line and "--on-offset-reset stop" in line, line
        assert_store_holds(vdir, a)  # nothing of the new log acknowledged
        mport = free_port()
        up = start_updater(
            models, topic, kafka.bootstrap, log, "--on-offset-reset", "rebase", "--metrics-port", str(mport)
        )
        try:
            wait_until(
                lambda: caught_up(vdir, topic, out.last_offsets, epoch=1),
                120,
                up,
                log=log,
                what="the new log applied as epoch 1",
            )
            wait_until(
                lambda: (_metric(mport, "offgraph_update_offset_resets_total") or 0) >= 1,
                30,
                up,
                log=log,
                what="the reset counted on /metrics",
            )
        finally:
            stop(up)
            out.close()
    finally:
        kafka.kill()
    assert_store_holds(vdir, a + b)
    assert "--on-offset-reset rebase: reading its new log from the beginning as epoch 1" in log.read_text()


def test_a_broker_restarted_empty_under_a_running_updater_is_rebased(tiny_export, tmp_path, request):
    """The broker restarts empty while the updater runs, and is refilled beyond the offset the
    consumer asks for next (was: that fetch succeeded, the new log's first messages were skipped)."""
    topic, models, vdir, a, b, kafka, log = _two_logs(tiny_export, tmp_path, request, 23, 200, 5, 12)
    try:
        out = sink(kafka.bootstrap, topic)
        up = start_updater(models, topic, kafka.bootstrap, log, "--on-offset-reset", "rebase")
        try:
            for d in a:
                out.emit(d)
            out.flush()
            out.close()
            wait_until(lambda: caught_up(vdir, topic, out.last_offsets), 120, up, log=log, what="A applied")
            kafka.kill()
            kafka.start()
            out = sink(kafka.bootstrap, topic)
            for d in b:
                out.emit(d)
            out.flush()
            wait_until(
                lambda: caught_up(vdir, topic, out.last_offsets, epoch=1),
                120,
                up,
                log=log,
                what="the new log applied as epoch 1",
            )
        finally:
            stop(up)
            out.close()
    finally:
        kafka.kill()
    assert_store_holds(vdir, a + b)
    assert log.read_text().count("offsets went backwards") <= P  # one line per partition and reset


# --------------------------------------------------------------------------- item 3
def test_a_message_from_the_future_is_dead_lettered_after_the_wait_timeout(broker, tiny_export, tmp_path, request):
    """A message for version 2 (not on disk) stamped one day ahead by its producer: dead-lettered
    --wait-timeout after the updater first saw it (was: waited on the producer's clock, for good)."""
    topic = topic_name(request)
    vdir = install_version(tiny_export, tmp_path / "models", 1)
    rng = np.random.default_rng(24)
    out = sink(broker, topic)
    out.emit(delta(rng, 10, 1))  # the topic and the version's start markers
    out.flush()
    future = delta(rng, 40, 10**6, version=2)
    prod = raw_producer(broker)
    ahead_ms = int(time.time() * 1000) + 86_400_000
    n_future = 0
    for p, value, hdrs in encode_messages(future, P):
        prod.produce(topic, value=value, partition=p, headers=hdrs, timestamp=ahead_ms)
        n_future += 1
    assert prod.flush(10) == 0
    good = [delta(rng, 30, 1000 + 100 * i) for i in range(20)]
    for d in good:
        out.emit(d)
    out.flush()
    log = tmp_path / "update.log"
    t0 = time.monotonic()
    up = start_updater(tmp_path / "models", topic, broker, log, "--wait-timeout", "5")
    try:
        wait_until(lambda: caught_up(vdir, topic, out.last_offsets), 60, up, log=log, what="the messages behind it")
    finally:
        stop(up)
        out.close()
    assert time.monotonic() - t0 > 5
    dead = consume_all(broker, f"{topic}.dead", 1, expect=n_future)
    assert len(dead) == n_future
    assert all(b"model version 2, which is not complete" in m[3]["offgraph.dead_letter.reason"] for m in dead)
    assert_store_holds(vdir, good)


def test_a_spool_file_with_a_future_mtime_is_dead_lettered_after_the_wait_timeout(tiny_export, tmp_path):
    """The same for the spool: the wait counts from when this process first saw the file, not its mtime."""
    import os

    from streaming_helpers import updater

    models, spool = tmp_path / "models", tmp_path / "spool"
    vdir = install_version(tiny_export, models, 1)
    rng = np.random.default_rng(25)
    future = publish(spool, 2, make_deltas(rng, 10, seq0=1))
    ahead = time.time() + 86_400
    os.utime(future, (ahead, ahead))
    good = [make_deltas(rng, 20, seq0=100 + 100 * i) for i in range(5)]
    names = [publish(spool, 1, d).name for d in good]
    summary = updater(models, spool, wait_timeout_s=1.0).run(max_seconds=4)
    assert summary["files_dead_lettered"] == 1 and summary["files_applied"] == 5, summary
    assert spool_files(spool / "dead") == [future.name] and spool_files(spool / "applied") == names
    assert_store_holds(vdir, good)


# --------------------------------------------------------------------------- item 4
HOSTILE_STARTS = {  # stream-start.json content -> the field the warning names
    "a list": ("[1, 2]", "(the whole file)"),
    "partitions as a list": ('{"topic": "%s", "partitions": [0]}', "field partitions:"),
    "offset 10^29": ('{"topic": "%s", "partitions": {"0": 100000000000000000000000000000}}', "partitions.0"),
    "offset 2^63": ('{"topic": "%s", "partitions": {"0": 9223372036854775808}}', "partitions.0"),
    "partition x": ('{"topic": "%s", "partitions": {"x": 1}}', "partitions.x"),
    "negative partition": ('{"topic": "%s", "partitions": {"-1": 1}}', "partitions.-1"),
    "negative offset": ('{"topic": "%s", "partitions": {"0": -3}}', "partitions.0"),
    "bool offset": ('{"topic": "%s", "partitions": {"0": true}}', "partitions.0"),
    "float offset": ('{"topic": "%s", "partitions": {"0": 1.5}}', "partitions.0"),
    "topic a number": ('{"topic": 7, "partitions": {"0": 1}}', "field topic:"),
    "no partitions": ('{"topic": "%s"}', "field partitions:"),
    "null": ("null", "(the whole file)"),
    "garbage bytes": (b"\xff\xfe{", "unreadable"),
    "nested too deep": ("[" * 100_000, "unreadable"),
}


def test_a_hostile_stream_start_is_ignored_with_a_warning_naming_the_field(
    broker, tiny_export, tmp_path, request, caplog
):
    """Each start-up goes on from the topic's beginning, with a warning naming the file and the field
    (was: AttributeError, OverflowError or ValueError, rc 1, on every restart)."""
    from offgraph.streaming.kafka.source import KafkaSource
    from offgraph.streaming.updater import Updater

    topic = topic_name(request)
    models = tmp_path / "models"
    vdir = install_version(tiny_export, models, 1)
    out = sink(broker, topic)
    out.emit(delta(np.random.default_rng(26), 10, 1))
    out.close()
    path = vdir / "stream-start.json"
    for case, (content, field) in HOSTILE_STARTS.items():
        if isinstance(content, str):
            content = (content % topic if "%s" in content else content).encode()
        path.write_bytes(content)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="offgraph"):
            up = Updater(models, NAME, KafkaSource(f"//{broker}/{topic}"))
            try:
                up.start()
            finally:
                up.close()
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(str(path) in x and field in x and "from its beginning" in x for x in said), (case, said)
        assigned = [r.getMessage() for r in caplog.records if "partitions assigned from" in r.getMessage()]
        assert assigned and all(f"{p}: -2" in assigned[-1] for p in range(P)), (case, assigned)  # OFFSET_BEGINNING


# --------------------------------------------------------------------------- item 5
DOWN_S = 8.0


def test_a_broker_down_is_logged_once_per_change_and_shown_on_metrics(tiny_export, tmp_path, request):
    """While the broker is down: one ERROR line (was: ~20 a second), broker_up 0 and a growing
    connection-error counter on /metrics; a line when it is back, and broker_up 1."""
    from offgraph.streaming.kafka.admin import ensure_topic

    topic = topic_name(request)
    models = tmp_path / "models"
    install_version(tiny_export, models, 1)
    kafka = TansuBroker(tmp_path / "tansu.log")
    kafka.start()
    ensure_topic(kafka.bootstrap, topic, P)
    log, mport = tmp_path / "update.log", free_port()
    up = start_updater(models, topic, kafka.bootstrap, log, "--metrics-port", str(mport))
    try:
        up_is = lambda v: lambda: _metric(mport, "offgraph_update_broker_up") == v  # noqa: E731
        wait_until(up_is(1.0), 120, up, log=log, what="broker_up 1")
        mark = log.stat().st_size
        kafka.kill()
        t_down = time.monotonic()
        wait_until(up_is(0.0), 30, up, log=log, what="broker_up 0")
        while time.monotonic() - t_down < DOWN_S:  # the outage lasts DOWN_S: what does the log say meanwhile?
            assert up.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        errors = _metric(mport, "offgraph_update_broker_connection_errors_total")
        said = log.read_text()[mark:].splitlines()
        loud = [x for x in said if " ERROR " in x or " WARNING " in x]
        assert len(loud) <= 2, "\n".join(loud[:40])
        assert any("broker unreachable" in x for x in loud), loud
        assert errors is not None and errors >= 1, _metrics(mport)
        kafka.start()
        ensure_topic(kafka.bootstrap, topic, P)
        wait_until(up_is(1.0), 60, up, log=log, what="broker_up 1 again")
        wait_until(lambda: "broker reachable again" in log.read_text(), 30, up, log=log, what="the line saying so")
    finally:
        stop(up)
        kafka.kill()
    assert up.returncode == 0, log.read_text()[-3000:]


def test_broker_health_says_each_change_once_and_sums_up_while_down(caplog):
    """The state machine alone (a fake clock; confluent-kafka passes Python levels): 500 failures in a
    row are one ERROR, then a summary every SUMMARY_S; the broker back is one line; other repeated
    messages once a minute."""
    from offgraph.streaming.kafka.health import REPEAT_S, SUMMARY_S, BrokerHealth

    now = [0.0]
    downs = []
    h = BrokerHealth(
        "b:1", logging.getLogger("offgraph.test.health"), on_down=lambda: downs.append(now[0]), clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="offgraph.test.health"):
        h.stats('{"brokers": {"b:1/1": {"nodeid": 1, "state": "UP"}}}')
        assert h.up is True and not caplog.records  # up from the start: nothing to say
        for _i in range(500):
            now[0] += 0.05
            h.log(
                logging.ERROR,
                "%s [%s] %s",
                "FAIL",
                "rdkafka#consumer-1",
                "Connect to ipv4#127.0.0.1:1 failed: Connection refused",
            )
        assert h.up is False and h.errors == 500 and downs == [0.05]
        said = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert len(said) == 1 + int(25.0 // SUMMARY_S) and said[0][0] == "ERROR" and "unreachable" in said[0][1]
        now[0] += SUMMARY_S
        h.tick()
        assert "still unreachable after" in caplog.records[-1].getMessage()
        h.stats('{"brokers": {"b:1/1": {"nodeid": 1, "state": "UP"}}}')
        assert h.up is True and "reachable again" in caplog.records[-1].getMessage()
        n = len(caplog.records)
        for _ in range(100):
            h.log(logging.WARNING, "%s [%s] %s", "PROTOERR", "rdkafka#consumer-1", "something odd")
        now[0] += REPEAT_S
        h.log(logging.WARNING, "%s [%s] %s", "PROTOERR", "rdkafka#consumer-1", "something odd")
        assert len(caplog.records) == n + 2

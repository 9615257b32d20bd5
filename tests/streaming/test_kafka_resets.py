"""Kafka, exactly once across resets. A stream of DELTAS row deltas over 4
partitions, with KILLS kill -9 of `offgraph update --on-offset-reset rebase` at random points
(starting up, just after opening the store, mid-apply), 2 broker restarts under the running
updater (Tansu keeps its log in memory: each restart loses it), one topic deleted and
re-created, and poison messages among the deltas, one of them 32 MiB.

The producer here acts as a careful one: after its broker lost the log it re-sends every message
the store did not record as applied when it looked, just before the loss. Acknowledged means
recorded in the store: so the store must end equal to the last-write-wins state of the messages
recorded as applied at each loss plus every message of the final log; a message acknowledged
but not applied would be missing. No run may end by itself (only by SIGKILL, or SIGTERM at the
end, rc 0). Full size by default; OFFGRAPH_KAFKA_RESETS_DELTAS and OFFGRAPH_KAFKA_RESETS_KILLS
shrink it."""

import json
import os
import random
import re
import signal
import subprocess
import time

import numpy as np
import pytest
from kafka_helpers import P, raw_producer, start_updater, stop, tiny_export, update_kafka_cmd, wait_until  # noqa: F401
from streaming_helpers import (
    NAME,
    REPO,
    install_version,
    kill_at_a_random_point,
    last_write_wins,
    make_deltas,
    open_version_store,
)

from offgraph.streaming.deltas import read as read_delta_bytes
from offgraph.streaming.kafka.messages import encode_messages
from offgraph.streaming.kafka.source import fingerprint, parse_position
from offgraph.testing.tansu import TansuBroker

DELTAS = int(os.environ.get("OFFGRAPH_KAFKA_RESETS_DELTAS", "100000"))
KILLS = int(os.environ.get("OFFGRAPH_KAFKA_RESETS_KILLS", "20"))
BAD_ROW0 = 10000  # poison deltas name rows >= this in table 0 (good ones stay below 6000): never written
TOPIC = "deltas"


class Stream:
    """The producer: every message it had delivered, by log generation, with its fingerprint."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.gen = 0
        self.sent: list[dict] = []  # {gen, p, offset, fp, value, headers, good}
        self._prod = None
        self._pending: list = []  # produced, delivery not yet seen

    def produce(self, p: int, value: bytes, headers, good: bool, compress: bool = False) -> None:
        if compress:  # its own zstd producer, waited for
            prod = raw_producer(self.bootstrap, compression_type="zstd")
        else:
            prod = self._prod = self._prod or raw_producer(self.bootstrap, linger_ms=5)
        out: list = []
        while True:
            try:
                prod.produce(
                    TOPIC,
                    value=value,
                    partition=p,
                    headers=headers,
                    on_delivery=lambda err, m: out.append((err, m.offset(), m.timestamp()[1])),
                )
                break
            except BufferError:  # the local queue is full: let it drain
                prod.poll(0.05)
        prod.poll(0)
        if compress:
            assert prod.flush(60) == 0
        self._pending.append((out, p, value, headers, good))

    def flush(self) -> None:
        if self._prod is not None:
            assert self._prod.flush(60) == 0
        for out, p, value, headers, good in self._pending:
            ((err, off, ts),) = out
            assert err is None, err
            self.sent.append(
                {
                    "gen": self.gen,
                    "p": p,
                    "offset": off,
                    "fp": fingerprint(value, ts),
                    "value": value,
                    "headers": headers,
                    "good": good,
                }
            )
        self._pending = []

    def emit(self, d: dict) -> None:
        for p, value, hdrs in encode_messages(d, P):
            self.produce(p, value, hdrs, True)

    def new_log(self) -> None:
        """The broker lost the log: a new generation, a new producer (an idempotent one's state is gone too)."""
        self.flush()
        self._prod = None
        self.gen += 1

    def last(self) -> dict[int, tuple[int, str]]:
        """Per partition, (offset, fingerprint) of the current log's last good message (the store
        records the positions of applied messages, not of dead letters)."""
        out = {}
        for m in self.sent:
            if m["gen"] == self.gen and m["good"] and m["offset"] >= out.get(m["p"], (-1, ""))[0]:
                out[m["p"]] = (m["offset"], m["fp"])
        return out


def _recorded(vdir) -> dict[int, tuple[int, str] | None]:
    """Per partition, the (offset, fingerprint) the store records as applied on EVERY shard (the lowest)."""
    with open_version_store(vdir) as st:
        out = {}
        for p in range(P):
            vals = st.get_meta_per_shard(f"kafka/{TOPIC}/{p}".encode())
            out[p] = None if any(v is None for v in vals) else min(parse_position(v.decode()) for v in vals)[1:]
        return out


def _acked_in_current_log(stream: Stream, rec: dict) -> set[int]:
    """Indices (in stream.sent) of the current log's good messages the store records as applied."""
    out = set()
    for p, r in rec.items():
        if r is None:
            continue
        mine = [i for i, m in enumerate(stream.sent) if m["gen"] == stream.gen and m["p"] == p]
        if not any(stream.sent[i]["offset"] == r[0] and stream.sent[i]["fp"] == r[1] for i in mine):
            continue  # the record is of an older log: nothing of this one is applied yet
        out |= {i for i in mine if stream.sent[i]["offset"] <= r[0] and stream.sent[i]["good"]}
    return out


def _poison(rng, stream: Stream, kind: int) -> None:
    d = make_deltas(rng, 6, seq0=10**12, tables=0)
    d["rows"] = BAD_ROW0 + rng.permutation(5000)[:6]
    p = int(rng.integers(0, P))
    if kind == 0:
        stream.produce(p, rng.bytes(2000), [], False)
    elif kind == 1:
        stream.produce(p, b"", [], False)
    elif kind == 2:
        for q, value, hdrs in encode_messages({**d, "model": "someone-else", "model_version": 1}, P):
            stream.produce(q, value, hdrs, False)
    elif kind == 3:
        for q, value, hdrs in encode_messages({**d, "model": NAME, "model_version": 7}, P):  # a version never made
            stream.produce(q, value, hdrs, False)
    else:
        stream.produce(p, bytes(32 << 20), [], False, compress=True)  # 32 MiB of zeros, zstd on the wire


@pytest.mark.timeout(1200)
def test_kafka_exactly_once_across_kills_broker_restarts_and_a_recreated_topic(tiny_export, tmp_path):
    from offgraph.streaming.kafka.admin import ensure_topic

    models = tmp_path / "models"
    vdir = install_version(tiny_export, models, 1)
    rng, rnd = np.random.default_rng(31), random.Random(31)
    chunks, seq, n = [], 1, 0
    while n < DELTAS:  # messages of up to ~1000 rows, seqs mostly increasing, some stale, hot rows overwritten
        k = min(int(rng.integers(50, 1000)), DELTAS - n)
        d = {"model": NAME, "model_version": 1, **make_deltas(rng, k, seq0=seq, hot=6000)}
        if len(chunks) % 9 == 4:
            d["seqs"] = rng.integers(0, seq, k)
        seq, n = seq + k, n + k
        chunks.append(d)
    # the plan: four stretches of the stream, the events between them; kills and poison spread over it
    cut = sorted(rnd.sample(range(1, len(chunks)), 3))
    events = dict(zip(cut, ["broker restart", "topic re-created", "broker restart"]))
    kill_at = sorted(rnd.sample(range(len(chunks)), min(KILLS - 1, len(chunks))))  # one more at the re-creation
    poison_at = {i: j % 5 for j, i in enumerate(rnd.sample(range(len(chunks)), min(10, len(chunks))))}

    kafka = TansuBroker(tmp_path / "tansu.log")
    kafka.start()
    ensure_topic(kafka.bootstrap, TOPIC, P)
    stream = Stream(kafka.bootstrap)
    log = tmp_path / "update.log"
    rate = max(2000, DELTAS // 60)  # about a minute of applying: a backlog to kill into
    extra = (
        "--on-offset-reset",
        "rebase",
        "--wait-timeout",
        "0",
        "--batch-files",
        "8",
        "--log-every",
        "1",
        "--max-deltas-per-s",
        str(rate),
    )
    acked: set[int] = set()  # good messages of lost logs that the store had recorded as applied
    kills, exits, resets = 0, [], 0
    t0 = time.monotonic()

    launched = 0  # the log's size when the running updater was started

    def launch():
        nonlocal launched
        launched = log.stat().st_size if log.exists() else 0
        return start_updater(models, TOPIC, kafka.bootstrap, log, *extra)

    def applying() -> bool:  # the running updater has written rows (so it is connected, fetching)
        return re.search(rb"-> [1-9][0-9]* rows written", log.read_bytes()[launched:]) is not None

    def kill(proc, mode):
        nonlocal kills
        said = lambda what: log.read_bytes().count(what)  # noqa: E731
        opened, progress = said(b"recorded positions of"), said(b" rows written")
        kills += kill_at_a_random_point(
            proc, mode, rnd, lambda: said(b"recorded positions of") > opened, lambda: said(b" rows written") > progress
        )
        if proc.returncode != -signal.SIGKILL:
            exits.append((proc.returncode, log.read_text()[-2000:]))

    up = launch()
    try:
        for i, d in enumerate(chunks):
            if i in events:
                stream.flush()
                what = events[i]
                if (
                    what == "topic re-created"
                ):  # with the updater down (see offgraph/streaming/README.md, "Offset resets")
                    kill(up, 0)
                else:  # under an updater that is applying
                    wait_until(applying, 120, up, log=log, what="the updater applying before the broker restart")
                rec = _recorded(vdir)  # what the store records as applied now (it only grows until the loss)
                acked |= _acked_in_current_log(stream, rec)
                if what == "broker restart":
                    kafka.kill()
                    kafka.start()
                    ensure_topic(kafka.bootstrap, TOPIC, P)
                else:
                    from confluent_kafka.admin import AdminClient

                    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 2})
                    admin.delete_topics([TOPIC])[TOPIC].result(30)
                    del admin
                    ensure_topic(kafka.bootstrap, TOPIC, P)
                resets += 1
                lost = [m for j, m in enumerate(stream.sent) if m["gen"] == stream.gen and m["good"] and j not in acked]
                stream.new_log()
                for m in lost:  # re-send what the store did not record (applied later or not: either is fine)
                    stream.produce(m["p"], m["value"], m["headers"], True)
                if what == "topic re-created":
                    up = launch()
            stream.emit(d)
            if i in poison_at:
                _poison(rng, stream, poison_at[i])
            if i in kill_at:
                stream.flush()
                kill(up, kills % 3)  # modes 0, 1, 2 in turn
                up = launch()
        stream.flush()
        last = stream.last()
        t_end = time.monotonic() + 300  # the drain after the stream: seconds when all is well

        def done():
            try:
                rec = _recorded(vdir)
            except Exception:  # noqa: BLE001 - between opening steps
                return False
            return all(rec[p] == last[p] for p in last)

        while not done():
            assert up.poll() is None, f"the updater exited with rc {up.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < t_end, f"not caught up: {_recorded(vdir)} vs {last}"
            time.sleep(0.2)
        took = time.monotonic() - t0
    finally:
        stop(up)
        kafka_alive = kafka.proc is not None
    try:
        assert up.returncode == 0, log.read_text()[-3000:]
        again = subprocess.run(
            update_kafka_cmd(models, TOPIC, kafka.bootstrap, "--once", "--on-offset-reset", "rebase"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
    finally:
        kafka.kill()
    assert kafka_alive
    print(
        f"{DELTAS} deltas in {len(stream.sent)} messages ({sum(not m['good'] for m in stream.sent)} poison), "
        f"{kills} kills, {resets} log losses, {len(acked)} messages of lost logs acknowledged, {took:.0f}s"
    )
    assert kills >= KILLS, f"killed {kills} times, fewer than {KILLS}"
    assert not exits, f"runs that ended by themselves: {[rc for rc, _ in exits]}\n{exits[0][1] if exits else ''}"
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["update"]["files_applied"] == 0  # nothing redone
    said = log.read_text()
    assert "--on-offset-reset rebase" in said and "Traceback" not in said
    print(
        f"{said.count('offsets went backwards')} partition resets detected; the broker unreachable "
        f"{said.count('broker unreachable')} times, reachable again {said.count('reachable again')} times"
    )

    final = [j for j, m in enumerate(stream.sent) if m["gen"] == stream.gen and m["good"]]
    applied = [read_delta_bytes(stream.sent[j]["value"]) for j in sorted(acked | set(final))]
    cols = [
        {"table_ids": b.table_ids, "rows": b.rows, "seqs": b.seqs, "vectors": b.vectors, "first_order": b.first_order}
        for b in applied
    ]
    et, er, es, ev, ew = last_write_wins(cols)
    with open_version_store(vdir) as st:
        gs = st.row_seqs(et, er)
        v, w = st.read(et, er)
        bad = np.arange(BAD_ROW0, BAD_ROW0 + 5000)
        assert (st.row_seqs(np.zeros(len(bad), np.uint32), bad) == -1).all()  # no poison applied
    mismatched = int(((gs != es) | (v != ev).any(axis=1) | (w != ew)).sum())
    print(f"{len(et)} rows checked, {mismatched} mismatched")
    assert mismatched == 0

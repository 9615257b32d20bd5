"""``kafka://HOST:PORT/TOPIC``: row deltas from every partition of a Kafka topic (confluent-kafka).

- Every partition is assigned by hand (no consumer-group rebalancing): every replica's
  updater reads every delta. The group id (``offgraph-update-<model>-<store hash>`` by
  default) only names the offsets committed to the broker, which are informational: the
  positions that decide what was applied are the ones the updater records IN THE STORE,
  one key per partition (``kafka/<topic>/<partition>`` -> the last applied offset,
  zero-padded), in the same atomic batch as the rows.
- ``seek`` starts each partition after its recorded offset; a partition with none
  starts where the live version's deltas begin (``<version dir>/stream-start.json``,
  written by the producer that started the version), else at the beginning.
- Messages are buffered in arrival order (in order within a partition); ``poll`` returns
  the buffer's head until items are acked or rejected.
- ``reject``: the message goes to the dead-letter topic (default ``<topic>.dead``) with
  the reason and its origin (topic/partition/offset) in headers; the updater goes on once
  the broker has it (a dead letter is never dropped; after a crash before the next store
  write, it may be dead-lettered twice).
- ``backlog``: messages between the cursor and the end of each partition (as the broker
  reports it: informational, Tansu's can be off), rows counted in buffered messages and
  estimated for the rest, and the age of the oldest unapplied message (its timestamp).
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from streaming.delta_format import DeltaBatch, DeltaFormatError, read_delta_bytes
from streaming.delta_format_impl import count_rows
from streaming.kafka_admin import ensure_topic
from streaming.kafka_messages import (FORMAT_VERSION, H_ORIGIN, H_REASON, H_VERSION, MAX_MESSAGE_BYTES,
                                      parse_kafka_url, version_start_path)
from streaming.sources import Backlog, DeltaSource, SourceItem

log = logging.getLogger("offgraph.update.kafka")

OFFSET_DIGITS = 20
BUFFER_BYTES = 64 << 20  # consumed, not yet applied messages held at most (about)


def position(offset: int) -> str:
    return f"{offset:0{OFFSET_DIGITS}d}"


@dataclass(frozen=True)
class KafkaItem(SourceItem):
    """One message; ``read`` refuses an oversized or other-version message before decoding."""

    partition: int = 0
    offset: int = 0
    headers: tuple = ()

    def read(self) -> DeltaBatch:
        data = self.payload or b""
        if len(data) > 16 * MAX_MESSAGE_BYTES:
            raise DeltaFormatError(f"message of {len(data)} bytes; at most {16 * MAX_MESSAGE_BYTES} are read "
                                   f"(producers split batches into messages of {MAX_MESSAGE_BYTES} bytes)")
        version = dict(self.headers).get(H_VERSION)
        if version is not None and version != FORMAT_VERSION:
            raise DeltaFormatError(f"header {H_VERSION}={version!r}; this offgraph reads version "
                                   f"{FORMAT_VERSION.decode()}")
        return read_delta_bytes(data)


class KafkaSource(DeltaSource):
    scheme = "kafka"
    wakeup = "kafka"

    def __init__(self, location: str, *, dead_letter_dir: str | None = None, delete_applied: bool = False,
                 group_id: str | None = None, store_hint: str = "", metadata_timeout_s: float = 30.0,
                 config: dict | None = None) -> None:
        from confluent_kafka import Consumer

        super().__init__(None)
        self.url = f"kafka:{location}"
        self.bootstrap, self.topic = parse_kafka_url(self.url)
        self.dead_topic = str(dead_letter_dir) if dead_letter_dir else f"{self.topic}.dead"
        if "/" in self.dead_topic:
            raise ValueError(f"--dead-letter for a Kafka source names a topic, got {self.dead_topic!r}")
        gid = group_id or "offgraph-update-" + hashlib.sha1(store_hint.encode()).hexdigest()[:12]
        self._consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "logger": log, "group.id": gid, "group.protocol": "classic",
            "enable.auto.commit": True, "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "enable.partition.eof": False, "fetch.message.max.bytes": 16 * MAX_MESSAGE_BYTES,
            "socket.connection.setup.timeout.ms": 10000, **(config or {})})
        self._producer = None
        self.partitions = self._wait_for_partitions(metadata_timeout_s)
        ensure_topic(self.bootstrap, self.dead_topic, 1)
        self._buf: dict[tuple[int, int], KafkaItem] = {}  # (partition, offset) -> item, in arrival order
        self._buf_bytes = 0
        self._rows: dict[tuple[int, int], int] = {}
        self._cursor: dict[int, int] = {}  # partition -> last consumed offset
        self._rows_per_message = 0.0
        self._ends: dict[int, int] = {}
        self._stop = threading.Event()

    # -- set-up ---------------------------------------------------------------------
    def _wait_for_partitions(self, timeout_s: float) -> list[int]:
        t_end = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                md = self._consumer.list_topics(timeout=5)  # all: asking for one may auto-create it
                t = md.topics.get(self.topic)
                if t is not None and t.error is None and t.partitions:
                    return sorted(t.partitions)
                last = str(t.error) if t is not None and t.error is not None else "no partitions"
            except Exception as e:  # noqa: BLE001 - KafkaException: broker not reachable yet
                last = str(e)
            if time.monotonic() > t_end:
                self._consumer.close()
                raise ValueError(f"{self.url}: topic {self.topic!r} not found on {self.bootstrap} within "
                                 f"{timeout_s:g}s ({last}); create it (e.g. by starting the producer) first")
            time.sleep(0.5)

    def key(self, partition: int) -> bytes:
        return f"kafka/{self.topic}/{partition}".encode()

    def position_keys(self) -> list[bytes]:
        return [self.key(p) for p in self.partitions]

    def seek(self, positions: dict[bytes, str | None]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        assign = []
        for p in self.partitions:
            pos = positions.get(self.key(p))
            if pos:
                self._cursor[p] = int(pos)
                assign.append(TopicPartition(self.topic, p, int(pos) + 1))
            else:
                assign.append(TopicPartition(self.topic, p, OFFSET_BEGINNING))
        self._buf.clear()
        self._buf_bytes = 0
        self._consumer.assign(assign)
        log.info("%s: %d partitions assigned from %s", self.url, len(assign),
                 {tp.partition: tp.offset for tp in assign})

    def version_start(self, version_dir: Path) -> dict[bytes, str]:
        path = version_start_path(version_dir)
        try:
            rec = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("%s unreadable (%s): reading the topic from its beginning", path, e)
            return {}
        if rec.get("topic") != self.topic:
            return {}
        out = {}
        for p, off in rec.get("partitions", {}).items():
            if isinstance(off, int) and off > 0:
                out[self.key(int(p))] = position(off - 1)
        log.info("%s: the version begins at %s (from %s)", self.url, rec.get("partitions"), path)
        return out

    # -- delivery -------------------------------------------------------------------
    def _take(self, timeout: float, n: int = 1000) -> int:
        """Consume up to ``n`` messages (waiting up to ``timeout`` for the first) into the buffer."""
        if self._buf_bytes >= BUFFER_BYTES:
            return 0
        got = 0
        for m in self._consumer.consume(n, timeout):
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise OSError(f"{self.url}: fatal consumer error: {err}")
                log.warning("%s: %s", self.url, err)
                continue
            p, off = m.partition(), m.offset()
            value = m.value() or b""
            ts = m.timestamp()[1]
            item = KafkaItem(position=position(off), key=self.key(p), payload=value,
                             mtime=ts / 1000.0 if ts and ts > 0 else time.time(), partition=p, offset=off,
                             headers=tuple(m.headers() or ()))
            self._buf[(p, off)] = item
            self._buf_bytes += len(value)
            got += 1
        return got

    def poll(self, max_items: int) -> list[SourceItem]:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        if len(self._buf) < max_items:
            self._take(0.0, max_items - len(self._buf))
        out = []
        for item in self._buf.values():
            out.append(item)
            if len(out) == max_items:
                break
        return out

    def wait(self, timeout: float) -> None:
        """Wait for messages by consuming them (into the buffer), in slices so that
        :meth:`interrupt` ends it soon."""
        t_end = time.monotonic() + max(0.0, timeout)
        while not self._stop.is_set():
            left = t_end - time.monotonic()
            if left <= 0 or self._take(min(left, 0.1)):
                break
        self._stop.clear()

    def interrupt(self) -> None:
        self._stop.set()

    def _done(self, item: KafkaItem) -> None:
        from confluent_kafka import TopicPartition

        gone = self._buf.pop((item.partition, item.offset), None)
        if gone is not None:
            self._buf_bytes -= len(gone.payload or b"")
        n = self._rows.pop((item.partition, item.offset), None)
        if n is not None:
            self._rows_per_message = 0.9 * self._rows_per_message + 0.1 * n if self._rows_per_message else n
        self._cursor[item.partition] = max(self._cursor.get(item.partition, -1), item.offset)
        try:  # informational: for tools that show a group's lag
            self._consumer.store_offsets(offsets=[TopicPartition(self.topic, item.partition, item.offset + 1)])
        except Exception as e:  # noqa: BLE001 - never fatal: the store's record decides
            log.debug("store_offsets: %s", e)

    def ack(self, item: SourceItem) -> None:
        self._done(item)

    def reject(self, item: SourceItem, reason: str) -> str:
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap, "logger": log, "enable.idempotence": True,
                                       "message.max.bytes": 16 * MAX_MESSAGE_BYTES + 65536})
        errors: list = []
        origin = f"{self.topic}/{item.partition}/{item.offset}"
        hdrs = [h for h in item.headers if h[0] not in (H_REASON, H_ORIGIN)]
        hdrs += [(H_REASON, reason.encode("utf-8", "backslashreplace")), (H_ORIGIN, origin.encode())]
        self._producer.produce(self.dead_topic, value=item.payload, headers=hdrs,
                               on_delivery=lambda err, _msg: err and errors.append(err))
        left = self._producer.flush(30)
        if left or errors:  # never advance past a message that is neither applied nor dead-lettered
            raise OSError(f"{self.url}: could not dead-letter {origin} to topic {self.dead_topic!r}: "
                          f"{errors[0] if errors else 'not delivered within 30s'}")
        self._done(item)
        return f"kafka topic {self.dead_topic} ({origin})"

    def positions(self) -> dict[bytes, str]:
        return {self.key(p): position(o) for p, o in self._cursor.items()}

    # -- backlog --------------------------------------------------------------------
    def _end_offsets(self) -> dict[int, int]:
        """Each partition's end as the last fetch response reported it (no round trip: asking the
        broker blocks, and Tansu's direct answer can be wrong; -1001: not known yet)."""
        from confluent_kafka import TopicPartition

        for p in self.partitions:
            try:
                hi = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1]
            except Exception as e:  # noqa: BLE001 - informational only
                log.debug("watermarks of partition %d: %s", p, e)
                continue
            if hi >= 0:
                self._ends[p] = hi
        return self._ends

    def lag(self) -> dict[int, dict[str, float]]:
        """Per partition: messages behind the end the broker reports, their rows (counted in
        buffered messages, estimated for the rest), the oldest unapplied one's age, and the
        offset consumed last (-1: none yet)."""
        ends = self._end_offsets()
        now = time.time()
        per: dict[int, dict[str, float]] = {}
        for (p, off), item in list(self._buf.items()):
            if (p, off) not in self._rows:
                self._rows[(p, off)] = count_rows(item.payload or b"")
            d = per.setdefault(p, {"buffered": 0, "rows": 0, "oldest_s": 0.0})
            d["buffered"] += 1
            d["rows"] += self._rows[(p, off)]
            d["oldest_s"] = max(d["oldest_s"], now - item.mtime)
        out = {}
        for p in self.partitions:
            d = per.get(p, {"buffered": 0, "rows": 0, "oldest_s": 0.0})
            behind = max(d["buffered"], ends.get(p, 0) - (self._cursor.get(p, -1) + 1))
            rows = d["rows"] + (behind - d["buffered"]) * self._rows_per_message
            out[p] = {"messages": behind, "rows": int(round(rows)), "seconds": d["oldest_s"],
                      "offset": self._cursor.get(p, -1)}  # the last consumed (applied or refused) offset
        return out

    def pending(self) -> int:
        return len(self._buf)

    def backlog(self) -> Backlog:
        lag = self.lag()
        return Backlog(int(sum(d["messages"] for d in lag.values())), int(sum(d["rows"] for d in lag.values())),
                       max((d["seconds"] for d in lag.values()), default=0.0))

    def close(self) -> None:
        try:
            self._consumer.close()
        finally:
            if self._producer is not None:
                self._producer.flush(10)

    def describe(self) -> str:
        return self.url

"""The served log's Kafka sink (``--served-log-kafka kafka://HOST:PORT/TOPIC``): each batch as Arrow IPC streams
(zstd-compressed buffers), one stream per message of at most ``MAX_MESSAGE_BYTES``, produced with the project's
Kafka client (confluent-kafka, ``offgraph.streaming.kafka``: its URL form, topic creation and broker-health
logging).

A write returns once the broker has every message of the batch, or raises: the writer thread
(``served_log.ServedLog``) then counts the batch's records dropped. Nothing waits on the broker but the writer
thread: while the broker is down or slow the log's bounded queue fills and the records offered meanwhile are
dropped and counted at the request path, never blocking it. A message not delivered within ``timeout_s`` fails
its batch; the topic is then looked up (and created, e.g. on a broker restarted empty) again before the next
batch, so writing resumes once the broker is back.

``read_served_kafka(url)``: every record of the topic, from its beginning, as one Arrow table."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from offgraph.server.process.served_log_base import PartlyWritten, ServedSink, schema
from offgraph.streaming.kafka.admin import ensure_topic
from offgraph.streaming.kafka.health import BrokerHealth
from offgraph.streaming.kafka.messages import MAX_MESSAGE_BYTES, parse_kafka_url

log = logging.getLogger("offgraph.server.served_log")

TIMEOUT_S = 5.0
"""How long a batch's message may wait for the broker before the batch is dropped (and counted)."""


def encode_streams(table: Any, max_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[int, bytes]]:
    """``table`` as Arrow IPC streams of at most ``max_bytes`` each (a row that alone is bigger: one stream of it,
    which the broker may refuse): ``(rows, stream)``, in row order."""
    import pyarrow as pa

    options = pa.ipc.IpcWriteOptions(compression="zstd")

    def stream(part: Any) -> bytes:
        out = pa.BufferOutputStream()
        with pa.ipc.new_stream(out, part.schema, options=options) as writer:
            writer.write_table(part)
        return out.getvalue().to_pybytes()

    whole = stream(table)
    if len(whole) <= max_bytes or table.num_rows <= 1:
        return [(table.num_rows, whole)]
    half = table.num_rows // 2  # halves until each fits: sizes per row vary with the candidates
    return encode_streams(table.slice(0, half), max_bytes) + encode_streams(table.slice(half), max_bytes)


class KafkaServedSink(ServedSink):
    def __init__(self, url: str, partitions: int = 1, timeout_s: float = TIMEOUT_S):
        from confluent_kafka import Producer

        self.url = url
        self.bootstrap, self.topic = parse_kafka_url(url)
        self.partitions, self.timeout_s = partitions, timeout_s
        self._topic_known = False  # looked up (or created) since the last failed batch
        self._producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "message.max.bytes": MAX_MESSAGE_BYTES + 65536,
                "message.timeout.ms": int(timeout_s * 1000),
                # a broker back from an outage is found within a second (librdkafka's default backs off to 10 s)
                "reconnect.backoff.max.ms": 1000,
                **BrokerHealth(self.bootstrap, log).client_config(),  # a log line per change of the broker's state
            }
        )

    def _ensure_topic(self) -> None:
        """The topic exists (created when missing): asked on the producer's own connection first, so that a broker
        that is down costs one metadata timeout per batch, not an admin client's start."""
        from confluent_kafka import KafkaException

        try:
            md = self._producer.list_topics(timeout=self.timeout_s)
        except KafkaException as e:
            raise OSError(f"kafka {self.bootstrap}: no metadata within {self.timeout_s:g}s ({e})") from None
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            ensure_topic(self.bootstrap, self.topic, self.partitions, timeout_s=self.timeout_s)
        self._topic_known = True

    def ready(self) -> None:
        """The topic looked up (and created when missing) after a failed batch: while the broker is down this
        fails, after a metadata timeout, and the batch is dropped unencoded."""
        if not self._topic_known:
            try:
                self._ensure_topic()
            except Exception as e:
                raise OSError(f"{self.url}: {e}") from None

    def write(self, table: Any) -> None:
        written = 0
        try:
            for rows, value in encode_streams(table):
                self._deliver(value)
                written += rows
        except Exception as e:
            self._topic_known = False
            raise PartlyWritten(written, f"{self.url}: {e}") from None

    def _deliver(self, value: bytes) -> None:
        """Produce one message and wait for the broker's answer (at most ``timeout_s`` and a second)."""
        result: list = []
        try:
            self._producer.produce(self.topic, value=value, on_delivery=lambda err, msg: result.append(err))
        except BufferError:  # librdkafka's own queue is full: nothing was queued
            raise OSError("the producer's queue is full") from None
        self._producer.flush(self.timeout_s + 1.0)
        if not result:  # not answered in time: taken back, so that it is never written after being counted
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.flush(1.0)
            raise OSError(f"not delivered within {self.timeout_s + 1.0:g}s")
        if result[0] is not None:
            raise OSError(f"not delivered: {result[0]}")

    def close(self) -> None:
        self._producer.flush(self.timeout_s)

    def describe(self) -> str:
        return self.url


def read_served_kafka(url: str, timeout_s: float = 60.0) -> Any:
    """Every record of the served log on ``kafka://HOST:PORT/TOPIC`` (what its partitions hold now, from their
    beginning) as one Arrow table: its messages' streams in (partition, offset) order."""
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    bootstrap, topic = parse_kafka_url(url)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"offgraph-served-log-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    try:
        md = c.list_topics(topic, timeout=timeout_s)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise OSError(f"{url}: no such topic ({None if t is None else t.error})")
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in t.partitions}
        want = {p: end for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in want])
        got: dict[tuple[int, int], Any] = {}
        last = dict.fromkeys(want, -1)  # the newest offset read per partition
        t_end = time.monotonic() + timeout_s
        while any(last[p] < end - 1 for p, end in want.items()):
            if time.monotonic() > t_end:
                raise OSError(f"{url}: not every message read within {timeout_s:g}s")
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    raise KafkaException(m.error())
                p, o = int(m.partition() or 0), int(m.offset() or 0)  # a message without an error has both
                got[(p, o)] = pa.ipc.open_stream(m.value()).read_all()
                last[p] = max(last[p], o)
    finally:
        c.close()
    tables = [got[k] for k in sorted(got)]
    return pa.concat_tables(tables) if tables else schema().empty_table()

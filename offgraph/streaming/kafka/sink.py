"""``kafka://HOST:PORT/TOPIC`` sink: row deltas as messages (``kafka.messages``), with an idempotent producer.

- ``enable.idempotence``: a retried send is written once, in order within its partition.
- Each row goes to partition ``shard_of(table, row, partitions)``: all deltas of a row stay
  in order.
- The first emit of a (model, version) first writes an empty delta message for that
  version to every partition; their offsets are where the version begins. With a
  ``version_dir`` they are recorded in ``<version_dir>/stream-start.json`` (if no earlier
  producer recorded them), where a new replica's updater starts reading.
- A delivery error is never dropped: the next ``emit`` or ``close`` raises it (OSError).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from offgraph.streaming.deltas import encode_feature_delta
from offgraph.streaming.kafka.admin import ensure_topic
from offgraph.streaming.kafka.health import BrokerHealth
from offgraph.streaming.kafka.messages import (
    MAX_MESSAGE_BYTES,
    encode_messages,
    encode_one,
    feature_headers,
    headers,
    parse_kafka_url,
    version_start_path,
)
from offgraph.streaming.sinks import DeltaSink

log = logging.getLogger("offgraph.stream_train.kafka")


class KafkaSink(DeltaSink):
    scheme = "kafka"
    form = "kafka://HOST:PORT/TOPIC"

    def __init__(
        self, url: str, *, version_dir: str | Path | None = None, partitions: int = 4, config: dict | None = None
    ) -> None:
        from confluent_kafka import Producer

        self.url = url
        self.bootstrap, self.topic = parse_kafka_url(url)
        self.partitions = ensure_topic(self.bootstrap, self.topic, partitions)
        self.version_dir = Path(version_dir) if version_dir is not None else None
        self.health = BrokerHealth(self.bootstrap, log)  # a log line per change of the broker's state
        self._producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.max.bytes": MAX_MESSAGE_BYTES + 65536,
                **self.health.client_config(),
                **(config or {}),
            }
        )
        self._errors: list = []
        self._started: set[tuple[str, int]] = set()
        self.messages = 0
        self.last_offsets: dict[int, int] = {}  # partition -> offset of the newest delivered message

    @classmethod
    def open(cls, url: str, *, version_dir: str | Path | None, partitions: int) -> KafkaSink:
        return cls(url, version_dir=version_dir, partitions=partitions)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self._errors.append(err)
        else:
            p = msg.partition()
            self.last_offsets[p] = max(self.last_offsets.get(p, -1), msg.offset())

    def _raise_errors(self) -> None:
        if self._errors:
            err, self._errors = self._errors[0], []
            raise OSError(f"{self.url}: a delta message was not delivered: {err}")

    def _produce(self, partition: int, value: bytes, hdrs, on_delivery=None) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=value,
                    partition=partition,
                    headers=hdrs,
                    on_delivery=on_delivery or self._delivered,
                )
                break
            except BufferError:  # the local queue is full: let it drain
                self._producer.poll(0.05)
        self._producer.poll(0)
        self.messages += 1

    def start_version(self, model: str, version: int, dim: int) -> dict[int, int]:
        """Write the version's start markers (an empty delta per partition); their offsets."""
        offsets: dict[int, int] = {}

        def done(err, msg):
            self._delivered(err, msg)
            if err is None:
                offsets[msg.partition()] = msg.offset()

        empty = encode_one(
            model,
            version,
            table_ids=np.zeros(0, np.uint32),
            rows=np.zeros(0, np.int64),
            vectors=np.zeros((0, dim), np.float32),
            first_order=np.zeros(0, np.float32),
            seqs=np.zeros(0, np.int64),
            event_time_ms=np.zeros(0, np.int64),
        )
        for p in range(self.partitions):
            self._produce(p, empty, headers(model, version), on_delivery=done)
        if self._producer.flush(30):
            raise OSError(f"{self.url}: the start markers of {model}/{version} were not delivered within 30s")
        self._raise_errors()
        self._started.add((model, int(version)))
        if self.version_dir is not None:
            self._record_start(offsets)
        return offsets

    def _record_start(self, offsets: dict[int, int]) -> None:
        path = version_start_path(self.version_dir)
        if path.exists():  # an earlier producer of this version recorded where it begins
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"topic": self.topic, "partitions": {str(p): o for p, o in sorted(offsets.items())}}))
        os.replace(tmp, path)
        log.info("%s: version begins at %s (recorded in %s)", self.url, offsets, path)

    def emit(self, delta: dict) -> str:
        self._raise_errors()
        key = (delta["model"], int(delta["model_version"]))
        if key not in self._started:
            self.start_version(*key, dim=int(np.asarray(delta["vectors"]).shape[1]))
        n = 0
        for p, value, hdrs in encode_messages(delta, self.partitions):
            self._produce(p, value, hdrs)
            n += 1
        return f"{n} message(s) to {self.url}"

    def emit_features(self, **delta) -> str:
        """A feature-row delta (``offgraph.streaming.deltas.build_feature_table``'s kwargs) as ONE message on
        partition 0: feature rows are few, and one partition keeps a key's rows in order."""
        self._raise_errors()
        value = encode_feature_delta(**delta)
        if len(value) > MAX_MESSAGE_BYTES:
            raise ValueError(
                f"feature delta of {len(value)} bytes; at most {MAX_MESSAGE_BYTES} per message: "
                "send fewer rows per call"
            )
        self._produce(0, value, feature_headers(delta["model"]))
        return f"1 message to {self.url}"

    def flush(self, timeout_s: float = 60.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            raise OSError(f"{self.url}: {left} delta message(s) not delivered within {timeout_s:g}s")
        self._raise_errors()

    def close(self) -> None:
        self.flush()

    def describe(self) -> str:
        return self.url

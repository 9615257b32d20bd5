"""Kafka test helper: a reader of a whole topic (the broker itself: ``streaming.tansu``)."""
import os
import time


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

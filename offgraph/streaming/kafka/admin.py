"""Topics for the Kafka transport: created when missing, their partition count read back."""

from __future__ import annotations

import logging
import time

from offgraph.streaming.kafka.health import BrokerHealth

log = logging.getLogger("offgraph.kafka")


def ensure_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> int:
    """The partition count of ``topic``, creating it with ``partitions`` if it does not exist."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": 10000,
            **BrokerHealth(bootstrap, log).client_config(),
        }
    )  # a line per change, not per retry
    t_end = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < t_end:
        try:
            md = admin.list_topics(timeout=5)  # all topics: asking for one may auto-create it (broker default)
            t = md.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                return len(t.partitions)
            fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
            try:
                fut.result(10)
                log.info("created topic %s with %d partitions on %s", topic, partitions, bootstrap)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        except KafkaException as e:
            last = str(e)
            time.sleep(0.5)
    raise OSError(f"kafka {bootstrap}: topic {topic!r} neither found nor created within {timeout_s:g}s ({last})")

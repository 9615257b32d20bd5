"""Delta sinks: where a producer (``offgraph stream-train``) puts row deltas; one module per backend.

    sink = open_sink("spool:/data/spool")                   # or "kafka://HOST:PORT/TOPIC"
    sink.emit(delta)        # delta: write_delta_file's kwargs (model, model_version, table_ids, ...)
    sink.close()            # everything emitted is delivered (Kafka: flushed), or an OSError says why

``version_dir`` (the exported MODELS/NAME/VERSION the deltas are for, when known): a Kafka
sink records there where the version's deltas begin in the topic (``stream-start.json``),
so that a new replica of that version starts reading there.
"""

from __future__ import annotations

import abc
from pathlib import Path


class DeltaSink(abc.ABC):
    @abc.abstractmethod
    def emit(self, delta: dict) -> str:
        """Deliver ``delta``; returns where it went (a path, or a topic and message count)."""

    def close(self) -> None:  # noqa: B027 (optional: most backends hold nothing to release)
        pass

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SpoolSink(DeltaSink):
    """``spool:DIR``: one delta file per emit, published by rename (``publish_delta``)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def emit(self, delta: dict) -> str:
        from offgraph.streaming.deltas import publish_delta

        return str(publish_delta(self.dir, **delta))

    def describe(self) -> str:
        return f"spool:{self.dir}"


def open_sink(target: str, *, version_dir: str | Path | None = None, partitions: int = 4) -> DeltaSink:
    """``spool:DIR`` or ``kafka://HOST:PORT/TOPIC`` (``partitions``: created with this many if the
    topic does not exist) -> a DeltaSink; ValueError naming what is wrong."""
    if not isinstance(target, str):
        raise ValueError(f"delta sink must be a string, got {target!r}")
    if target.startswith("kafka://"):
        from offgraph.streaming.sink_kafka import KafkaSink

        return KafkaSink(target, version_dir=version_dir, partitions=partitions)
    scheme, sep, rest = target.partition(":")
    if scheme == "spool" and sep and rest:
        return SpoolSink(rest)
    raise ValueError(f"delta sink {target!r}: expected spool:DIR or kafka://HOST:PORT/TOPIC")

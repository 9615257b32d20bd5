"""What the served log's writer (``served_log``) and its sinks (``served_log_spool``, ``served_log_kafka``) share:
the records' Arrow schema and the sink's interface."""

from __future__ import annotations

from typing import Any


def schema():
    """The served log's Arrow schema (every sink writes it, every reader gives it back)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("request_id", pa.string()),
            ("time", pa.timestamp("ns", tz="UTC")),
            ("model", pa.string()),
            ("version", pa.int64()),
            ("arm", pa.string()),
            ("request", pa.string()),
            ("candidates", pa.list_(pa.string())),
            ("scores", pa.list_(pa.float32())),
            ("order", pa.list_(pa.int32())),
        ]
    )


class PartlyWritten(OSError):
    """A sink stored the first ``written`` rows of a batch, not the others (a broker lost on the way)."""

    def __init__(self, written: int, why: str):
        super().__init__(why)
        self.written = written


class ServedSink:
    """Where the writer thread puts each batch: ``ready()``, then ``write(table)`` (a ``schema()`` table) returns once the batch is
    stored, or raises (the batch is then dropped and counted; ``PartlyWritten``: its first rows were stored);
    called from the writer thread only."""

    def ready(self) -> None:
        """Raise when the sink cannot take a batch now (a broker known down): the writer then drops the batch
        before encoding it. Called before each write."""

    def write(self, table: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the sink holds (after the last write)."""

    def describe(self) -> str:
        raise NotImplementedError

"""``spool:DIR`` sink: one delta file per emit, published into the directory by rename."""

from __future__ import annotations

from pathlib import Path

from offgraph.streaming.deltas import publish_delta
from offgraph.streaming.sinks import DeltaSink


class SpoolSink(DeltaSink):
    scheme = "spool"
    form = "spool:DIR"

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def emit(self, delta: dict) -> str:
        return str(publish_delta(self.dir, **delta))

    def describe(self) -> str:
        return f"spool:{self.dir}"

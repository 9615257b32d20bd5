"""The one read of a delta file or message: its kind, recorded in its metadata (``offgraph.delta.kind``),
says which batch it is: row deltas (no kind) or feature rows (``features``)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from offgraph.streaming.deltas import _format, features, rows
from offgraph.streaming.deltas._format import DeltaFormatError
from offgraph.streaming.deltas.features import FeatureDeltaBatch
from offgraph.streaming.deltas.rows import DeltaBatch

AnyDeltaBatch = DeltaBatch | FeatureDeltaBatch


def read(source: str | os.PathLike | bytes | bytearray | memoryview) -> AnyDeltaBatch:
    """Read and check one delta file (a path) or its bytes (e.g. a broker message's payload); the
    batch of its kind. DeltaFormatError says what is wrong."""
    table = _format.read_table(source if isinstance(source, (bytes, bytearray, memoryview)) else Path(source))
    try:
        if _format.is_feature_table(table):
            return features.from_table(table)
        return rows.from_table(table)
    except DeltaFormatError:
        raise
    except (pa.ArrowException, ValueError, TypeError, OverflowError, IndexError, KeyError) as e:
        # a file no check foresaw must still be refused, never stop its reader
        raise DeltaFormatError(f"unreadable delta file: {type(e).__name__}: {e}") from None

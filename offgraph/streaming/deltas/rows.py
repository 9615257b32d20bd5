"""The row-delta file format, version 1 (see offgraph/streaming/README.md, "Delta files").

One file = one Arrow IPC **file** (``pyarrow.ipc``, random-access format, not the
stream format) holding K row deltas of ONE model version:

    schema metadata  b"offgraph.delta.version" = b"1"
                     b"model"                  = model name (utf-8)
                     b"model_version"          = decimal int (the version directory)
                     b"dim"                    = decimal int D (the embedding dim)
    columns          table_id       uint32        field index (manifest "table_id")
                     row            int64         row in that table, >= 0
                     vector         fixed_size_list<float32>[D]   new fp32 embedding
                     first_order    float32       new first-order weight
                     seq            int64         per-row sequence number (last write wins)
                     event_time_ms  int64         when the newest event behind the row happened

No nulls, no NaN/Inf, no negative rows/seqs/times, no two deltas of one (table_id, row)
with the same seq. K = 0 is a valid (empty) file. A writer writes ``path.tmp``
and renames it onto ``path`` (atomic); readers never see a partial file.

    from offgraph.streaming.deltas import write_delta_file, read, spool_file_name
    write_delta_file(spool / spool_file_name(), model="ml", model_version=3, table_ids=t,
                     rows=r, vectors=v, first_order=w, seqs=s, event_time_ms=now_ms)
    batch = read(path)      # DeltaBatch of NumPy arrays (zero-copy from a memory map)
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from offgraph.streaming.deltas import _format


@dataclass(frozen=True)
class DeltaBatch:
    """The K deltas of one file, NumPy arrays in file order."""

    model: str
    model_version: int
    dim: int
    table_ids: np.ndarray  # uint32 [K]
    rows: np.ndarray  # int64 [K]
    vectors: np.ndarray  # float32 [K, D]
    first_order: np.ndarray  # float32 [K]
    seqs: np.ndarray  # int64 [K]
    event_time_ms: np.ndarray  # int64 [K]
    # keys appended to vocabularies (version 2): table id -> (the first key's row, keys in row order), applied with
    # the rows in one batch (offgraph.store.vocabulary_appends)
    appends: dict[int, tuple[int, tuple[str, ...]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.rows.shape[0])


def write_delta_file(
    path,
    *,
    model: str,
    model_version: int,
    table_ids,
    rows,
    vectors,
    first_order,
    seqs,
    event_time_ms,
    vocabulary_appends=None,
    compression: str | None = None,
    fsync: bool = True,
) -> Path:
    """Write K deltas to ``path`` atomically (``path + ".tmp"``, then ``os.replace``).

    ``vectors`` float [K, D]; ``table_ids``, ``rows``, ``first_order``, ``seqs`` [K];
    ``event_time_ms`` [K] or one int for all. ``compression``: None (default, zero-copy
    reads), "lz4" or "zstd" (Arrow IPC buffer compression; readers handle it).
    ``fsync``: flush the file and its directory so a power loss cannot lose it. ``vocabulary_appends``:
    ``{table_id: (first row, [key, ...])}``, keys appended to vocabularies with these rows (format version 2).
    Raises DeltaFormatError (a ValueError) on invalid values.
    """
    path = Path(path)
    table = _format.build_table(
        model=model,
        model_version=model_version,
        table_ids=table_ids,
        rows=rows,
        vectors=vectors,
        first_order=first_order,
        seqs=seqs,
        event_time_ms=event_time_ms,
        vocabulary_appends=vocabulary_appends,
    )
    tmp = path.with_name(path.name + ".tmp")
    _format.write_table(tmp, table, compression=compression, fsync=fsync)
    os.replace(tmp, path)
    if fsync:
        _format.fsync_dir(path.parent)
    return path


def encode_delta(**columns) -> bytes:
    """The file bytes of K deltas (a Kafka message value); the kwargs of :func:`write_delta_file`
    but ``compression`` and ``fsync``."""
    buf = io.BytesIO()
    _format.write_ipc(buf, _format.build_table(**columns))
    return buf.getvalue()


def from_table(table) -> DeltaBatch:
    """A row-delta file's table (``_format.read_table``), checked (any problem: DeltaFormatError)."""
    return DeltaBatch(**_format.columns(table))

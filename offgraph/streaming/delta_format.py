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

    from offgraph.streaming.delta_format import write_delta_file, read_delta_file, spool_file_name
    write_delta_file(spool / spool_file_name(), model="ml", model_version=3, table_ids=t,
                     rows=r, vectors=v, first_order=w, seqs=s, event_time_ms=now_ms)
    batch = read_delta_file(path)      # DeltaBatch of NumPy arrays (zero-copy from a memory map)
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from offgraph.streaming import _delta_format as _impl
from offgraph.streaming._delta_format import (
    COLUMNS,
    FORMAT_VERSION,
    META_DIM,
    META_MODEL,
    META_MODEL_VERSION,
    META_VERSION,
    SUFFIX,
    DeltaFormatError,
)


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
    compression: str | None = None,
    fsync: bool = True,
) -> Path:
    """Write K deltas to ``path`` atomically (``path + ".tmp"``, then ``os.replace``).

    ``vectors`` float [K, D]; ``table_ids``, ``rows``, ``first_order``, ``seqs`` [K];
    ``event_time_ms`` [K] or one int for all. ``compression``: None (default, zero-copy
    reads), "lz4" or "zstd" (Arrow IPC buffer compression; readers handle it).
    ``fsync``: flush the file and its directory so a power loss cannot lose it.
    Raises DeltaFormatError (a ValueError) on invalid values.
    """
    path = Path(path)
    table = _impl.build_table(
        model=model,
        model_version=model_version,
        table_ids=table_ids,
        rows=rows,
        vectors=vectors,
        first_order=first_order,
        seqs=seqs,
        event_time_ms=event_time_ms,
    )
    tmp = path.with_name(path.name + ".tmp")
    _impl.write_table(tmp, table, compression=compression, fsync=fsync)
    os.replace(tmp, path)
    if fsync:
        _impl.fsync_dir(path.parent)
    return path


def read_delta_file(path) -> DeltaBatch:
    """Read and validate one delta file; DeltaFormatError says what is wrong. A feature-row delta
    (``offgraph.streaming.feature_delta``) is returned as its ``FeatureDeltaBatch``."""
    return _batch(_impl.read_file(Path(path)))


def read_delta_bytes(data: bytes) -> DeltaBatch:
    """:func:`read_delta_file` of an in-memory file (e.g. a broker message payload)."""
    return _batch(_impl.read_buffer(data))


def _batch(read):
    return DeltaBatch(**read) if isinstance(read, dict) else read


_name_lock = threading.Lock()
_name_state = {"last": 0, "counter": 0}


def spool_file_name(seq_hint: int | None = None) -> str:
    """A spool file name that sorts (as a string) in creation order within a process:
    ``f"{lead:020d}-{pid:07d}-{counter:06d}.delta.arrow"``.

    ``lead`` is ``time.time_ns()`` made strictly increasing within the process (or
    ``seq_hint`` if the producer keeps its own monotone number, e.g. its newest seq;
    then the time-based settle guard of the spool source does not apply). Across
    processes names sort by wall-clock time: publish with :func:`publish_delta` (the
    name is taken right before the rename) so a file never appears after a
    later-named one was consumed.
    """
    with _name_lock:
        if seq_hint is None:
            lead = max(time.time_ns(), _name_state["last"] + 1)
        else:
            if isinstance(seq_hint, bool) or not isinstance(seq_hint, (int, np.integer)) or seq_hint < 0:
                raise ValueError(f"seq_hint must be an int >= 0, got {seq_hint!r}")
            lead = int(seq_hint)
        if lead >= 10**20:
            raise ValueError(f"seq_hint must be < 10**20, got {lead}")
        _name_state["last"] = max(_name_state["last"], lead)
        _name_state["counter"] = (_name_state["counter"] + 1) % 1_000_000
        return f"{lead:020d}-{os.getpid() % 10**7:07d}-{_name_state['counter']:06d}{SUFFIX}"


def publish_delta(spool_dir, **kwargs) -> Path:
    """Write a delta file into ``spool_dir`` (kwargs of :func:`write_delta_file`) under a
    hidden temporary name, then name it with :func:`spool_file_name` and rename it in:
    the name is taken at publish time, so names sort in the order files appear.
    Creates ``spool_dir`` if needed. Returns the published path."""
    fsync = kwargs.pop("fsync", True)
    return publish_file(spool_dir, lambda hidden: write_delta_file(hidden, fsync=fsync, **kwargs), fsync=fsync)


def publish_file(spool_dir, write, fsync: bool = True) -> Path:
    """Publish one spool file: ``write(path)`` writes it under a hidden temporary name (and fsyncs
    it if asked), then it is named with :func:`spool_file_name` and renamed in (and the directory
    fsynced). Every kind of spool file (row deltas, feature deltas) goes through here."""
    spool_dir = Path(spool_dir)
    spool_dir.mkdir(parents=True, exist_ok=True)
    hidden = spool_dir / f".publish-{os.getpid()}-{threading.get_ident()}{SUFFIX}"
    write(hidden)
    final = spool_dir / spool_file_name()
    os.replace(hidden, final)
    if fsync:
        _impl.fsync_dir(spool_dir)
    return final


def parse_spool_name(name: str) -> int | None:
    """The leading number of a spool file name (None if it does not follow the pattern)."""
    return _impl.parse_lead(name, SUFFIX)


__all__ = [
    "DeltaBatch",
    "DeltaFormatError",
    "write_delta_file",
    "read_delta_file",
    "read_delta_bytes",
    "spool_file_name",
    "publish_delta",
    "parse_spool_name",
    "FORMAT_VERSION",
    "SUFFIX",
    "COLUMNS",
    "META_VERSION",
    "META_MODEL",
    "META_MODEL_VERSION",
    "META_DIM",
]

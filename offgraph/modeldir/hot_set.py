"""A version's static hot set: the rows its training data looked up most, hottest first.

The exporter counts how often the training rows look up each (table, row) through the shared FG
(``offgraph.export.hot_set``) and keeps the most frequent in ``hot_set.npz`` beside the manifest, which
records its size and sha256 (``HotSetRecord``). A server seeds a freshly started version's row cache
with them (``offgraph.server.models.loader``), so that its first requests hit where steady traffic would, instead
of paying the disk for every hot row once (as RecShard and Bandana place embeddings by training-time
key frequency). A version that replaces a serving one warms from that one's row cache instead: live
traffic beats the training log.

The file is plain NumPy (``np.savez``, no pickle): ``tables`` uint32, ``rows`` uint64 and ``counts``
uint64, one entry per row, ordered by count (descending), then table and row.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from offgraph.modeldir.layout import HOT_SET_FILE
from offgraph.modeldir.manifest import file_sha256
from offgraph.modeldir.manifest_model import HotSetRecord, Manifest


def write_hot_set(
    version_dir: Path, tables: np.ndarray, rows: np.ndarray, counts: np.ndarray, lookups: int, source: str
) -> dict:
    """Write ``hot_set.npz`` into ``version_dir`` (the entries as given: hottest first, counted over
    ``lookups`` lookups of the training rows of ``source``); returns the manifest's ``hot_set`` record.
    Raises ValueError when the arrays do not line up or are not ordered."""
    tables = np.ascontiguousarray(tables, dtype=np.uint32)
    rows = np.ascontiguousarray(rows, dtype=np.uint64)
    counts = np.ascontiguousarray(counts, dtype=np.uint64)
    if not (tables.ndim == rows.ndim == counts.ndim == 1 and len(tables) == len(rows) == len(counts)):
        raise ValueError(
            f"hot set: tables, rows and counts must be 1-d of one length, got {tables.shape}, {rows.shape}, {counts.shape}"
        )
    if len(counts) > 1 and np.any(np.diff(counts.astype(np.int64)) > 0):
        raise ValueError("hot set: entries must be ordered by count, hottest first")
    path = Path(version_dir) / HOT_SET_FILE
    with open(path, "wb") as f:
        np.savez(f, tables=tables, rows=rows, counts=counts)
    return {
        "path": HOT_SET_FILE,
        "rows": int(len(rows)),
        "lookups": int(lookups),
        "source": source,
        "sha256": file_sha256(path),
    }


def read_hot_set(version_dir: str | Path, manifest: Manifest) -> tuple[np.ndarray, np.ndarray] | None:
    """The version's hot set as ``(tables uint32, rows uint64)``, hottest first, or None when it has none.

    Raises ValueError naming the file when it differs from what the manifest recorded (sha256, size) or
    names a table or row the version does not have: a version whose files changed after export."""
    rec: HotSetRecord | None = manifest.hot_set
    if rec is None:
        return None
    path = Path(version_dir) / rec.path
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: the manifest records a hot set this version lacks ({e.strerror})") from None
    if hashlib.sha256(data).hexdigest() != rec.sha256:
        raise ValueError(f"{path}: its sha256 differs from the manifest's (changed or damaged after export)")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:  # the bytes just checked, not the file again
        tables, rows = z["tables"], z["rows"]
    if tables.dtype != np.uint32 or rows.dtype != np.uint64 or tables.shape != rows.shape or len(rows) != rec.rows:
        raise ValueError(
            f"{path}: expected {rec.rows} uint32 tables and uint64 rows, got {tables.dtype}{tables.shape} and {rows.dtype}{rows.shape}"
        )
    sizes = manifest.table_rows()
    known = np.array(sorted(sizes), dtype=np.uint32)
    if not np.all(np.isin(tables, known)):
        raise ValueError(f"{path}: names tables this version does not have")
    limit = np.zeros(int(known.max(initial=0)) + 1, dtype=np.uint64)
    limit[known] = [sizes[int(t)] for t in known]
    if np.any(rows >= limit[tables]):
        raise ValueError(f"{path}: names rows past the end of their tables")
    return tables, rows

"""Bulk load of an embedding store: tables streamed in chunks into external SST files per
shard (``sst_run``), ingested by move.

``load_tables`` runs over a backend's primitives only (``backend.StoreBackend``:
``_sst_writer_factory``, ``_ingest``); ``EmbeddingStore.bulk_load`` / ``bulk_load_tables`` (``base``)
check the mode and call it with the store's backend and codec.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from offgraph.store.backend import StoreBackend
from offgraph.store.keys import MAX_TABLE_ID, as_key_arrays, key_array, shard_of
from offgraph.store.quant import Codec
from offgraph.store.sst_run import SstRuns


def load_tables(
    storage: StoreBackend,
    codec: Codec,
    tables: Iterable[tuple[int, Iterable[tuple[Any, Any, Any]]]],
    *,
    total_rows: int | None = None,
    progress: bool | Callable[[int], None] = False,
    tmp_dir: str | None = None,
    workers: int | None = None,
) -> list[int]:
    """Load tables ``(table_id, chunks)`` into the open backend ``storage`` (mode ``"w"``), records
    encoded by ``codec``: what ``EmbeddingStore.bulk_load_tables`` documents. Returns rows loaded per table."""
    factory = storage._sst_writer_factory()
    if factory is None:
        raise NotImplementedError(
            f"the {storage.backend!r} store backend does not load external files: write the rows with write()"
        )
    if workers is None:
        big = total_rows is not None and total_rows >= (1 << 21)
        workers = min(4, os.cpu_count() or 1, storage.config.shards) if big else 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    S = storage.config.shards
    tmp = tempfile.mkdtemp(prefix=".ingest-", dir=tmp_dir or storage.path)
    bar = None
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=total_rows, unit="rows", unit_scale=True, desc="bulk load")
    done_all, loaded = 0, []
    last_key = (-1, -1)
    runs = None
    try:
        runs = SstRuns(factory, storage._ingest, tmp, workers)
        for table_id, chunks in tables:
            if isinstance(table_id, bool) or not isinstance(table_id, (int, np.integer)):
                raise ValueError(f"table_id must be an int, got {table_id!r}")
            if not 0 <= int(table_id) <= MAX_TABLE_ID:
                raise ValueError(f"table_id must be in [0, {MAX_TABLE_ID}], got {table_id}")
            table_id = int(table_id)
            done = 0
            for chunk in chunks:
                rows, records = _prepare_chunk(codec, chunk)
                if len(rows) == 0:
                    continue
                if (table_id, int(rows[0])) <= last_key:
                    runs.finish_and_ingest()
                shard = shard_of(np.uint64(table_id), rows, S)
                order = np.argsort(shard, kind="stable")  # rows stay ascending per shard
                counts = np.bincount(shard, minlength=S)
                ends = np.cumsum(counts)
                slices = [(s, int(ends[s] - counts[s]), int(ends[s])) for s in range(S) if counts[s]]
                keys = key_array(np.full(len(rows), table_id, dtype=np.uint32), rows[order])
                runs.add(slices, keys, records[order])
                last_key = (table_id, int(rows[-1]))
                done += len(rows)
                done_all += len(rows)
                if bar is not None:
                    bar.update(len(rows))
                elif callable(progress):
                    progress(done_all)
            loaded.append(done)
        runs.finish_and_ingest()
    finally:
        if runs is not None:
            runs.close()
        if bar is not None:
            bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return loaded


def _prepare_chunk(codec: Codec, chunk) -> tuple[np.ndarray, np.ndarray]:
    try:
        rows, vectors, first_order = chunk
    except (TypeError, ValueError):
        raise ValueError("each bulk_load chunk must be (rows, vectors, first_order)") from None
    _, r = as_key_arrays(0, rows)
    records = codec.encode(vectors, first_order)
    if len(records) != len(r):
        raise ValueError(f"chunk has {len(r)} rows but {len(records)} vectors")
    if len(r) > 1 and not (r[1:] > r[:-1]).all():
        order = np.argsort(r, kind="stable")
        r, records = r[order], records[order]
        keep = np.append(r[1:] != r[:-1], True)  # last duplicate wins
        r, records = r[keep], records[keep]
    return r, records

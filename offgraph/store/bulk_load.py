"""Bulk load of an embedding store: tables streamed in chunks into external SST files per
shard (``sst_run``), ingested by move.

A mixin of ``base.EmbeddingStore``: it uses the backend's primitives (``backend.StoreBackend``:
``_sst_writer_factory``, ``_ingest``) and the store's helpers (``_check_writable``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from offgraph.store.keys import MAX_TABLE_ID, as_key_arrays, key_array, shard_of
from offgraph.store.sst_run import SstRuns


class BulkLoad:
    """``bulk_load`` / ``bulk_load_tables`` of ``EmbeddingStore`` (mode ``"w"``)."""

    def bulk_load(
        self,
        table_id: int,
        chunks: Iterable[tuple[Any, Any, Any]],
        *,
        total_rows: int | None = None,
        progress: bool | Callable[[int], None] = False,
        tmp_dir: str | None = None,
        workers: int | None = None,
    ) -> int:
        """Load one table from chunks ``(rows int [k], vectors [k, D], first_order [k])``
        through external SST files (one per shard per run), ingested by MOVE.

        Chunks in ascending row order stream straight into S open SST writers (one
        chunk in memory at a time). A chunk that goes back in row order closes the
        current run (its files are ingested) and starts a new one, so any order works;
        later rows win over earlier ones, also within a chunk. ``progress``: True for
        a tqdm bar, or a callable given the number of rows done. ``workers``: processes
        writing SST files (None: ``min(4, CPUs, shards)`` when ``total_rows`` is at
        least 2**21, else 1 = in this process). ``tmp_dir`` must be on the store's
        filesystem for the move (default: inside the store). Returns rows loaded.
        """
        return self.bulk_load_tables(
            [(table_id, chunks)], total_rows=total_rows, progress=progress, tmp_dir=tmp_dir, workers=workers
        )[0]

    def bulk_load_tables(
        self,
        tables: Iterable[tuple[int, Iterable[tuple[Any, Any, Any]]]],
        *,
        total_rows: int | None = None,
        progress: bool | Callable[[int], None] = False,
        tmp_dir: str | None = None,
        workers: int | None = None,
    ) -> list[int]:
        """:meth:`bulk_load` of several tables ``(table_id, chunks)`` in ONE run of SST
        files per shard when table ids ascend (one file per shard instead of one per
        shard and table: less per-file overhead on disk and fewer files to open).
        ``total_rows`` counts all tables. Returns rows loaded per table."""
        self._check_writable()
        factory = self._sst_writer_factory()
        if factory is None:
            raise NotImplementedError(
                f"the {self.backend!r} store backend does not load external files: write the rows with write()"
            )
        if workers is None:
            big = total_rows is not None and total_rows >= (1 << 21)
            workers = min(4, os.cpu_count() or 1, self.config.shards) if big else 1
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        S = self.config.shards
        tmp = tempfile.mkdtemp(prefix=".ingest-", dir=tmp_dir or self.path)
        bar = None
        if progress is True:
            from tqdm import tqdm

            bar = tqdm(total=total_rows, unit="rows", unit_scale=True, desc="bulk load")
        done_all, loaded = 0, []
        last_key = (-1, -1)
        runs = None
        try:
            runs = SstRuns(factory, self._ingest, tmp, workers)
            for table_id, chunks in tables:
                if isinstance(table_id, bool) or not isinstance(table_id, (int, np.integer)):
                    raise ValueError(f"table_id must be an int, got {table_id!r}")
                if not 0 <= int(table_id) <= MAX_TABLE_ID:
                    raise ValueError(f"table_id must be in [0, {MAX_TABLE_ID}], got {table_id}")
                table_id = int(table_id)
                done = 0
                for chunk in chunks:
                    rows, records = self._prepare_chunk(chunk)
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

    def _prepare_chunk(self, chunk) -> tuple[np.ndarray, np.ndarray]:
        try:
            rows, vectors, first_order = chunk
        except (TypeError, ValueError):
            raise ValueError("each bulk_load chunk must be (rows, vectors, first_order)") from None
        _, r = as_key_arrays(0, rows)
        records = self.codec.encode(vectors, first_order)
        if len(records) != len(r):
            raise ValueError(f"chunk has {len(r)} rows but {len(records)} vectors")
        if len(r) > 1 and not (r[1:] > r[:-1]).all():
            order = np.argsort(r, kind="stable")
            r, records = r[order], records[order]
            keep = np.append(r[1:] != r[:-1], True)  # last duplicate wins
            r, records = r[keep], records[keep]
        return r, records

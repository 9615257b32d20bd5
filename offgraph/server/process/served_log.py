"""The served-request log: what each sampled :score request was answered with, for training and experiment reports.

``ServedLog(directory, rate)``: a request is sampled when xxhash64 of its request id falls under ``rate`` (the same
id is sampled the same way in every worker; 0: none, 1: all). ``offer`` takes a sampled request's record without
blocking: the request path only puts references into a bounded queue (``queue_size``); a full queue drops the
record and counts it (``dropped``, ``offgraph_served_log_dropped_total``), so a slow or failing disk never holds
up or fails a request. One writer thread turns the queued records into Arrow (the features as FG saw them,
after the feature-table join, as JSON text: types vary per model and JSON keeps each value exactly) and writes
each batch as an Arrow IPC file ``served-<pid>-<ns>.arrow`` in ``directory``, atomically (a reader never sees a
partial file); a batch it cannot write is dropped and counted too.

Columns (``SCHEMA``): request_id, time (UTC, ns), model, version (null: the prior arm), arm (``none`` outside an
experiment), request (JSON object), candidates (a JSON object each), scores (float32, candidate order) and order
(the candidates' indices by descending score: the order the caller shows).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import xxhash

QUEUE_SIZE = 10_000
"""Records waiting for the writer at most (each holds its request's joined features until written)."""
BATCH_ROWS = 1_000
FLUSH_S = 1.0
"""The writer writes a batch when it holds ``BATCH_ROWS`` records or its oldest waited this long."""
_UNIT = 2.0**-64


def sampled(request_id: str, rate: float) -> bool:
    """Whether the request ``request_id`` is logged at ``rate`` (its xxhash64 in [0, 1) under the rate)."""
    return rate >= 1.0 or (rate > 0.0 and xxhash.xxh64_intdigest(request_id.encode()) * _UNIT < rate)


def _schema():
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


def _json(value: Any) -> str:
    return json.dumps(dict(value), separators=(",", ":"), default=_plain)


def _plain(v: Any) -> Any:
    """NumPy scalars and arrays (FG may hold them) as JSON's numbers and lists."""
    if hasattr(v, "tolist"):
        return v.tolist()
    raise TypeError(f"not JSON: {type(v).__name__}")


class ServedLog:
    def __init__(
        self,
        directory: str | Path,
        rate: float,
        queue_size: int = QUEUE_SIZE,
        batch_rows: int = BATCH_ROWS,
        flush_s: float = FLUSH_S,
    ):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the served log's rate is in [0, 1], got {rate!r}")
        self.directory, self.rate = Path(directory), float(rate)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.batch_rows, self.flush_s = batch_rows, flush_s
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = self.written = 0  # records (dropped: counted by whoever dropped them, under _lock)
        self._lock = threading.Lock()
        self._on_drop = self._on_write = None  # count_with
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offgraph-served-log", daemon=True)
        self._thread.start()

    def count_with(self, on_drop, on_write) -> None:
        """Report each batch dropped and written: ``on_drop(model, n)``, ``on_write(model, n)`` (the server's
        counters; called from the writer thread, and ``on_drop`` from the request path when the queue is full)."""
        self._on_drop, self._on_write = on_drop, on_write

    def sampled(self, request_id: str) -> bool:
        return sampled(request_id, self.rate)

    def offer(
        self, request_id: str, model: str, version: int | None, arm: str, request: Any, candidates: Any, scores: Any
    ) -> bool:
        """Queue one record (never blocks); False: the queue was full, the record dropped and counted.
        ``request``/``candidates``: the joined features (mappings); ``scores``: a NumPy array."""
        record = (request_id, time.time_ns(), model, version, arm, request, candidates, scores)
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            self._count_drop(model, 1)
            return False

    def _count_drop(self, model: str, n: int) -> None:
        with self._lock:
            self.dropped += n
        if self._on_drop is not None:
            self._on_drop(model, n)

    def _run(self) -> None:
        batch: list = []
        oldest = 0.0
        while not (self._stop.is_set() and self._queue.empty() and not batch):
            try:
                rec = self._queue.get(timeout=0.05)
                if not batch:
                    oldest = time.monotonic()
                batch.append(rec)
            except queue.Empty:
                pass
            if batch and (
                len(batch) >= self.batch_rows or time.monotonic() - oldest >= self.flush_s or self._stop.is_set()
            ):
                self._write(batch)
                batch = []

    def _write(self, batch: list) -> None:
        import numpy as np
        import pyarrow as pa

        try:
            scores = [np.asarray(r[7], dtype=np.float32) for r in batch]
            cols = {
                "request_id": [r[0] for r in batch],
                "time": [r[1] for r in batch],
                "model": [r[2] for r in batch],
                "version": [r[3] for r in batch],
                "arm": [r[4] for r in batch],
                "request": [_json(r[5]) for r in batch],
                "candidates": [[_json(c) for c in r[6]] for r in batch],
                "scores": [s.tolist() for s in scores],
                # stable: ties keep the order sent
                "order": [np.argsort(-s, kind="stable").astype(np.int32).tolist() for s in scores],
            }
            table = pa.Table.from_pydict(cols, schema=_schema())
            name = f"served-{os.getpid()}-{time.time_ns()}.arrow"
            tmp = self.directory / f".{name}.tmp"
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, self.directory / name)
        except Exception:  # a disk full or gone, a value JSON cannot hold: the batch is lost, counted, serving goes on
            for model in {r[2] for r in batch}:
                self._count_drop(model, sum(r[2] == model for r in batch))
            return
        with self._lock:
            self.written += len(batch)
        if self._on_write is not None:
            for model in {r[2] for r in batch}:
                self._on_write(model, sum(r[2] == model for r in batch))

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        self._stop.set()
        self._thread.join(timeout_s)


def read_served(directory: str | Path):
    """Every record of the served log in ``directory`` as one Arrow table (files in name order)."""
    import pyarrow as pa

    files = sorted(Path(directory).glob("served-*.arrow"))
    tables = [pa.ipc.open_file(str(f)).read_all() for f in files]
    return pa.concat_tables(tables) if tables else _schema().empty_table()

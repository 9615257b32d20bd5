"""The served-request log: what each sampled scored request was answered with, for training and experiment reports.

``ServedLog(sink, rate)``: a request is sampled when xxhash64 of its request id falls under ``rate`` (the same id
is sampled the same way in every worker; 0: none, 1: all). ``offer`` takes a sampled request's record without
blocking: the request path only puts references into a bounded queue (``queue_size``); a full queue drops the
record and counts it (``dropped``, ``offgraph_served_log_dropped_total``), so a slow, failing or unreachable sink
never holds up or fails a request. One writer thread turns the queued records into one Arrow table per batch (the
features as the scorer saw them, as JSON text: types vary per model and JSON keeps each value exactly) and hands
it to the sink (``ServedSink.write``); a batch the sink cannot take (it raises) is dropped and counted too, and
the next batch is tried afresh: a sink that comes back is written to again. Every record offered is either
written or counted as dropped, once.

The candidates are logged as FG saw them, after the feature-table join: for a model with item tables the scorer
hands over references, never values (``Joined.as_seen``: a ``JoinedCandidates`` over the candidates as sent and the
scorer's per-candidate entries), and the writer thread merges each candidate's stored records into its dict as sent
(``FeatureJoin.fill``'s own rule), for a sampled request only: nothing is decoded, merged or copied per candidate
on the request path. The records are the very bytes the join merged when the candidate was joined, kept in its
candidate-cache entry (``candidate_cache.RECORDS``, from the record cache, one per item table): a candidate the
candidate cache held was not joined by its request, and reading the table again in the writer would log the
table's state at writing, not the one scored; the cache's entries are dropped whenever a table changes
(``FeatureJoin.generation``), so a held entry's records are the state its request was scored with. Without item
tables FG saw the candidates as sent: their JSON bytes are written as they are.

Sinks, one module each: ``served_log_spool.SpoolSink`` (a directory of Arrow IPC files, ``--served-log-dir``) and
``served_log_kafka.KafkaServedSink`` (one Arrow IPC stream per message on a Kafka topic, ``--served-log-kafka``);
their readers (``read_served``, ``read_served_kafka``) give the records back as one table. ``open_served_log``
builds the log an `offgraph serve` process (each worker its own) is configured with.

Columns (``served_log_base.schema()``): request_id, time (UTC, ns), model, version (null: the prior arm), arm (``none`` outside an
experiment), request (JSON object), candidates (a JSON object each), scores (float32, candidate order) and order
(the candidates' indices by descending score: the order the caller shows).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import xxhash

from offgraph.config import default
from offgraph.server.config import ServerConfig
from offgraph.server.process.served_log_base import PartlyWritten, ServedSink, schema

log = logging.getLogger("offgraph.server.served_log")

QUEUE_SIZE: int = default(ServerConfig, "served_log_queue")
"""Records waiting for the writer at most (each holds its request's joined features until written)."""
BATCH_ROWS = 1_000
FLUSH_S = 1.0
"""The writer writes a batch when it holds ``BATCH_ROWS`` records or its oldest waited this long."""
_UNIT = 2.0**-64


def sampled(request_id: str, rate: float) -> bool:
    """Whether the request ``request_id`` is logged at ``rate`` (its xxhash64 in [0, 1) under the rate)."""
    return rate >= 1.0 or (rate > 0.0 and xxhash.xxh64_intdigest(request_id.encode()) * _UNIT < rate)


def _json(value: Any) -> str:
    return json.dumps(dict(value), separators=(",", ":"), default=_plain)


def _plain(v: Any) -> Any:
    """NumPy scalars and arrays (FG and tensor columns may hold them) as JSON's numbers and lists; bytes (a BYTES
    tensor's elements) as text."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    raise TypeError(f"not JSON: {type(v).__name__}")


def _encoded(record: tuple) -> tuple:
    """A queued record (``ServedLog.offer``'s tuple) with its features as JSON text and its scores as float32. The
    candidates as the join gave them to FG (``JoinedCandidates``: made here, from the references the scorer handed
    over); else (no item table: FG saw them as sent) their own JSON bytes where the scorer has them: nothing decoded."""
    import numpy as np

    from offgraph.feature_tables.join import JoinedCandidates

    rid, t, model, version, arm, request, candidates, scores = record
    if isinstance(candidates, JoinedCandidates):
        texts = [_json(c) for c in candidates.dicts()]
    elif (raws := getattr(candidates, "json_raws", None)) is not None:
        texts = [b.decode() for b in raws]
    else:
        texts = [_json(c) for c in candidates]
    return (rid, t, model, version, arm, _json(request), texts, np.asarray(scores, np.float32))


def to_table(encoded: list) -> Any:
    """The Arrow table of encoded records (``_encoded``), in the writer thread: the per-candidate columns built
    flat (one array and the records' offsets), the order by one stable sort over (record, -score)."""
    import numpy as np
    import pyarrow as pa

    cols: dict[str, Any] = {name: [r[i] for r in encoded] for i, name in enumerate(schema().names[:6])}
    sizes = np.fromiter((len(r[7]) for r in encoded), np.int64, len(encoded))
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
    scores = np.concatenate([r[7] for r in encoded]) if encoded else np.zeros(0, np.float32)
    record = np.repeat(np.arange(len(encoded)), sizes)
    # stable: ties keep the order sent
    order = np.lexsort((-scores, record)) - np.repeat(offsets.to_numpy()[:-1], sizes)
    texts = pa.array([t for r in encoded for t in r[6]], pa.string())
    cols["candidates"] = pa.ListArray.from_arrays(offsets, texts)
    cols["scores"] = pa.ListArray.from_arrays(offsets, pa.array(scores, pa.float32()))
    cols["order"] = pa.ListArray.from_arrays(offsets, pa.array(order.astype(np.int32)))
    return pa.Table.from_pydict(cols, schema=schema())


class ServedLog:
    def __init__(
        self,
        sink: ServedSink,
        rate: float,
        queue_size: int = QUEUE_SIZE,
        batch_rows: int = BATCH_ROWS,
        flush_s: float = FLUSH_S,
    ):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the served log's rate is in [0, 1], got {rate!r}")
        self.sink, self.rate = sink, float(rate)
        self.batch_rows, self.flush_s = batch_rows, flush_s
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = self.written = 0  # records (counted by whoever dropped or wrote them, under _lock)
        self._lock = threading.Lock()
        self._on_drop: Callable[[str, int], None] | None = None
        self._on_write: Callable[[str, int], None] | None = None
        self._failing = False  # the last batch failed: its error was logged, the next ones' are not
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offgraph-served-log", daemon=True)
        self._thread.start()

    def count_with(self, on_drop: Callable[[str, int], None], on_write: Callable[[str, int], None]) -> None:
        """Report each batch dropped and written: ``on_drop(model, n)``, ``on_write(model, n)`` (the server's
        counters; called from the writer thread, and ``on_drop`` from the request path when the queue is full)."""
        self._on_drop, self._on_write = on_drop, on_write

    def sampled(self, request_id: str) -> bool:
        return sampled(request_id, self.rate)

    def offer(
        self, request_id: str, model: str, version: int | None, arm: str, request: Any, candidates: Any, scores: Any
    ) -> bool:
        """Queue one record (never blocks); False: the queue was full, the record dropped and counted.
        ``request``/``candidates``: the features (a mapping; a sequence of mappings); ``scores``: a NumPy array."""
        record = (request_id, time.time_ns(), model, version, arm, request, candidates, scores)
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            self._count(self._on_drop, [record], dropped=True)
            return False

    def _count(self, report: Callable[[str, int], None] | None, batch: list, dropped: bool) -> None:
        with self._lock:
            if dropped:
                self.dropped += len(batch)
            else:
                self.written += len(batch)
        if report is not None:
            for model in {r[2] for r in batch}:
                report(model, sum(r[2] == model for r in batch))

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
        self.sink.close()

    def _write(self, batch: list) -> None:
        try:  # before any encoding: a sink known down costs the process nothing but this call
            self.sink.ready()
        except Exception as e:
            self._fail(str(e), batch)
            return
        encoded, kept = [], []
        for r in batch:
            try:
                encoded.append(_encoded(r))
                kept.append(r)
            except Exception as e:  # a value JSON cannot hold, a candidate list that cannot be read: this one only
                self._fail(f"a record of {r[2]} cannot be encoded: {e}", [r])
        if not kept:
            return
        try:
            self.sink.write(to_table(encoded))
        except Exception as e:  # a sink down or full: the batch (or its rest) is lost, counted
            written = e.written if isinstance(e, PartlyWritten) else 0
            if written:
                self._count(self._on_write, kept[:written], dropped=False)
            self._fail(str(e), kept[written:])
            return
        if self._failing:
            log.warning("served log %s: written again", self.sink.describe())
        self._failing = False
        self._count(self._on_write, kept, dropped=False)

    def _fail(self, why: str, records: list) -> None:
        """Count ``records`` dropped; log why, once per run of failures."""
        if not self._failing:
            log.error("served log %s: %d record(s) dropped: %s", self.sink.describe(), len(records), why)
        self._failing = True
        self._count(self._on_drop, records, dropped=True)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the writer (and close the sink); what is still queued after
        ``timeout_s`` (a sink that hangs) is counted as dropped, never lost uncounted."""
        self._stop.set()
        self._thread.join(timeout_s)
        left = []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if left:
            self._count(self._on_drop, left, dropped=True)


def open_served_log(config: ServerConfig) -> ServedLog | None:
    """The served log ``config`` asks for (``--served-log-rate`` and its sink), None when off."""
    if config.served_log_rate <= 0:
        return None
    sink: ServedSink
    if config.served_log_kafka is not None:
        from offgraph.server.process.served_log_kafka import KafkaServedSink

        sink = KafkaServedSink(config.served_log_kafka)
    else:
        from offgraph.server.process.served_log_spool import SpoolSink

        assert config.served_log_dir is not None  # ServerConfig checks that a rate has its sink
        sink = SpoolSink(config.served_log_dir)
    return ServedLog(sink, config.served_log_rate, queue_size=config.served_log_queue)

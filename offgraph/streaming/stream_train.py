"""The incremental (streaming) trainer: fresh labelled events -> row deltas in a spool.

    trainer = open_trainer(model_dir="models/ml", config=StreamTrainConfig(lr=0.05))
    summary = stream_train_table(trainer, read_table("events.parquet"), spool_dir="spool/")

For each batch of events (in time order): the shared FG, the rows the events
touch (current values: the trainer's own latest value for a row it touched
before, else the model's), one gradient step on those rows only (embeddings and
first-order weights; the dense head frozen), and, every K events or T seconds,
ONE delta file with the new fp32 values of the rows touched since the last one
(``offgraph.streaming.deltas.publish_delta``). ``offgraph update`` applies it.

Two model sources:

* an exported version (``--model``): rows read from its store (dequantized), the
  gradient taken THROUGH the dense SavedModel's serving signature;
* a training run (``--run``): the Keras DeepFM's tables and head.

The maths (pooling, loss, gradient, optimizers, local row state) is in
``_stream_train``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import tensorflow as tf
from tqdm import tqdm

from offgraph.features.fg import FeatureGenerator, FeatureValueError
from offgraph.features.spec import FeatureSpec
from offgraph.model.metrics import auc, logloss
from offgraph.streaming import _stream_train as impl
from offgraph.streaming.stream_train_config import StreamTrainConfig

if TYPE_CHECKING:
    from offgraph.streaming.sinks import DeltaSink

log = logging.getLogger("offgraph.stream_train")


# -- model sources ------------------------------------------------------------------------
@dataclass
class ModelSource:
    """What the trainer needs from a model: spec, row reader, frozen logit function."""

    spec: FeatureSpec
    dim: int
    read_rows: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]  # (tables, rows) -> (v, w)
    logit_fn: impl.LogitFn
    name: str | None
    version: int | None
    description: str
    close: Callable[[], None] = lambda: None
    keep: list = field(default_factory=list)  # objects that must stay alive (the loaded SavedModel)
    version_dir: Path | None = None  # the exported MODELS/NAME/VERSION, when the rows come from one


def exported_source(model_dir: str | Path) -> ModelSource:
    """A version directory, or a model directory's newest complete version."""
    from offgraph.modeldir.version import ModelVersion
    from offgraph.scoring.scorer import resolve_version

    vdir = resolve_version(model_dir)
    mv = ModelVersion.open(vdir)
    spec = mv.spec
    store = mv.open_store("r")
    loaded, serve = mv.dense

    def read_rows(tables, rows):
        v, w, _ = store.read_unique(tables, rows)
        return v, w

    def logit_fn(emb, fo):
        return serve(emb=emb, first_order=fo)["logit"]

    version = mv.version
    return ModelSource(
        spec,
        mv.manifest.embedding_dim,
        read_rows,
        logit_fn,
        vdir.parent.name,
        version,
        f"exported {vdir} ({mv.manifest.store.quant}, gradient through the dense SavedModel)",
        close=store.close,
        keep=[loaded, serve],
        version_dir=Path(vdir),
    )


def run_source(run_dir: str | Path) -> ModelSource:
    """A training run: the Keras DeepFM's tables and (frozen) head."""
    from offgraph.model.model import load_run

    model, spec, _ = load_run(run_dir)
    emb_vars = [t.embeddings for t in model.front.emb_tables]
    w_vars = [t.embeddings for t in model.front.w_tables]
    d = spec.model.embedding_dim

    def read_rows(tables, rows):
        v = np.zeros((len(rows), d), np.float32)
        w = np.zeros(len(rows), np.float32)
        for t in np.unique(tables):  # one gather per table, not per row
            m = tables == t
            v[m] = tf.gather(emb_vars[int(t)], rows[m]).numpy()
            w[m] = tf.gather(w_vars[int(t)], rows[m]).numpy()[:, 0]
        return v, w

    def logit_fn(emb, fo):
        return model.head((emb, fo), training=False)

    return ModelSource(spec, d, read_rows, logit_fn, None, None, f"run {run_dir} (Keras head and tables)", keep=[model])


# -- the trainer --------------------------------------------------------------------------
class StreamTrainer:
    """Gradient steps on the rows fresh events touch; emits their new values as deltas."""

    def __init__(self, source: ModelSource, config: StreamTrainConfig, model_name: str, model_version: int):
        if not model_name:
            raise ValueError("a model name is needed for the deltas (--model-name)")
        if model_version is None or int(model_version) < 0:
            raise ValueError(f"a model version >= 0 is needed for the deltas (--model-version), got {model_version!r}")
        spec = source.spec
        if max(f.rows for f in spec.fields) > impl.ROW_LIMIT:
            raise ValueError("tables of more than 2**48 rows are not supported by the stream trainer")
        if spec.numeric:  # the frozen head would need the dense [N, k] input, which this trainer does not feed
            raise ValueError(
                f"numeric fields {[f.name for f in spec.numeric]} are not supported by the stream "
                "trainer yet (it updates table rows; train and export such a model instead)"
            )
        self.source, self.cfg, self.spec = source, config, spec
        self.model_name, self.model_version = model_name, int(model_version)
        self.poolings = [f.pooling for f in spec.fields]
        self.half_lives = [f.half_life for f in spec.fields]
        if config.fields is not None:
            unknown = sorted(set(config.fields) - set(spec.field_names))
            if unknown or not config.fields:
                raise ValueError(
                    f"--fields: unknown field(s) {unknown} (the spec has {spec.field_names})"
                    if unknown
                    else "--fields names no field"
                )
            self.trainable = np.isin(np.arange(len(spec.fields)), [spec.field_index(f) for f in config.fields])
        else:
            self.trainable = np.ones(len(spec.fields), bool)
        self.fg = FeatureGenerator(spec)
        self.rows = impl.LocalRows(source.dim, config.adagrad_init)
        self._grad = impl.make_grad_fn(source.logit_fn, len(spec.fields), source.dim)
        self._predict = impl.make_predict_fn(source.logit_fn, len(spec.fields), source.dim)
        self.next_seq = int(config.seq_start if config.seq_start is not None else time.time_ns())
        self.events = 0
        self.files: list[Path] = []
        self.bce_sum = 0.0
        self._labels: list[np.ndarray] = []
        self._preds: list[np.ndarray] = []

    def _current(self, idx: impl.BatchIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, vectors, first_order) of a batch's unique rows: the trainer's latest values, else
        the model's (read once, then kept locally)."""
        keys = idx.keys
        slots = self.rows.lookup(keys)
        miss = slots < 0
        if miss.any():
            v0, w0 = self.source.read_rows(idx.tables[miss], idx.rows[miss])
            slots[miss] = self.rows.add(keys[miss], v0, w0)
        return slots, self.rows.vectors[slots], self.rows.first_order[slots]

    def predict(self, columns: dict[str, list], n: int) -> np.ndarray:
        """CTRs (before calibration) of n events with the trainer's current rows; no update."""
        if n == 0:
            return np.zeros(0, np.float32)
        idx = impl.batch_index(self.fg.transform_columns(columns, n), self.poolings, self.half_lives)
        _, v, w = self._current(idx)
        logits = self._predict(
            tf.constant(v),
            tf.constant(w),
            tf.constant(idx.lookup),
            tf.constant(idx.segment),
            tf.constant(idx.scale),
            tf.constant(n, tf.int32),
        )
        return tf.sigmoid(logits).numpy()

    # one gradient step
    def train_batch(self, columns: dict[str, list], labels: np.ndarray, event_ms: np.ndarray) -> dict:
        """One step on n events (raw columns, 0/1 labels, event times in ms).
        Returns the batch's pre-update (progressive) predictions and loss."""
        n = len(labels)
        if n == 0:
            return {"n": 0, "bce": 0.0, "p": np.zeros(0, np.float32)}
        batch = self.fg.transform_columns(columns, n)
        idx = impl.batch_index(batch, self.poolings, self.half_lives)
        slots, v, w = self._current(idx)
        bce, logits, gv, gw = self._grad(
            tf.constant(v),
            tf.constant(w),
            tf.constant(idx.lookup),
            tf.constant(idx.segment),
            tf.constant(idx.scale),
            tf.constant(np.asarray(labels, np.float32)),
            tf.constant(self.cfg.l2, tf.float32),
        )
        gv, gw = gv.numpy(), gw.numpy()
        c = self.cfg
        if not self.trainable.all():  # rows of frozen fields: read, used, never changed nor emitted
            keep = self.trainable[idx.tables]
            slots, v, w, gv, gw = slots[keep], v[keep], w[keep], gv[keep], gw[keep]
            lookup_keep = keep[idx.lookup]
            lookup = np.cumsum(keep)[idx.lookup[lookup_keep]] - 1
            seg = idx.segment[lookup_keep]
        else:
            lookup, seg = idx.lookup, idx.segment
        lr_w = c.lr if c.lr_first_order is None else c.lr_first_order
        if c.optimizer == "sgd":
            v, w = impl.sgd_update(v, w, gv, gw, c.lr, lr_w)
        else:
            v, w, self.rows.acc_v[slots], self.rows.acc_w[slots] = impl.rowwise_adagrad_update(
                v, w, self.rows.acc_v[slots], self.rows.acc_w[slots], gv, gw, c.lr, lr_w, c.adagrad_eps
            )
        self.rows.vectors[slots] = v
        self.rows.first_order[slots] = w
        self.rows.touch(slots, impl.newest_per_row(lookup, seg, idx.num_fields, len(slots), event_ms))
        p = tf.sigmoid(logits).numpy()
        self.events += n
        self.bce_sum += float(bce)
        self._labels.append(np.asarray(labels, np.float32))
        self._preds.append(p)
        return {"n": n, "bce": float(bce), "p": p, "rows": len(slots)}

    # deltas
    def take_delta(self) -> dict | None:
        """The rows touched since the last call as write_delta_file kwargs (None if none)."""
        if self.rows.pending == 0:
            return None
        t, r, v, w, times = self.rows.take_dirty()
        seqs = np.arange(self.next_seq, self.next_seq + len(r), dtype=np.int64)
        self.next_seq += len(r)
        return dict(
            model=self.model_name,
            model_version=self.model_version,
            table_ids=t,
            rows=r,
            vectors=v,
            first_order=w,
            seqs=seqs,
            event_time_ms=times,
        )

    def emit(self, sink: DeltaSink | str | Path) -> str | None:
        """Deliver the rows touched since the last emit to ``sink`` (a DeltaSink, or a spool
        directory: ONE delta file); returns where they went (None: nothing to emit)."""
        from offgraph.streaming.sinks import DeltaSink
        from offgraph.streaming.spool.sink import SpoolSink

        delta = self.take_delta()
        if delta is None:
            return None
        where = (sink if isinstance(sink, DeltaSink) else SpoolSink(sink)).emit(delta)
        self.files.append(where)
        return where

    def progressive_predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """(labels, predictions) of every event trained on, in training order, each predicted
        BEFORE the step that used it."""
        if not self._labels:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(self._labels), np.concatenate(self._preds)

    def progressive(self) -> dict:
        """Progressive validation: every event scored by the model BEFORE it trained on it."""
        y, p = self.progressive_predictions()
        if len(y) == 0:
            return {"auc": float("nan"), "logloss": float("nan")}
        return {"auc": auc(y, p) if 0 < y.sum() < len(y) else float("nan"), "logloss": logloss(y, p)}

    def close(self) -> None:
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_trainer(
    model_dir: str | Path | None = None,
    run_dir: str | Path | None = None,
    config: StreamTrainConfig | None = None,
    model_name: str | None = None,
    model_version: int | None = None,
) -> StreamTrainer:
    """A trainer on an exported model (``model_dir``) or a run (``run_dir``, needs name and version)."""
    if (model_dir is None) == (run_dir is None):
        raise ValueError("give exactly one of --model MODEL_DIR and --run RUN")
    config = config or StreamTrainConfig()
    if model_dir is not None:
        source = exported_source(model_dir)
    else:
        if model_name is None or model_version is None:
            raise ValueError(
                "--run needs --model-name and --model-version: the deltas must name the model "
                "version (MODELS/NAME/VERSION) whose store they update"
            )
        source = run_source(run_dir)
    name = model_name or source.name
    version = model_version if model_version is not None else source.version
    if version is None:
        source.close()
        raise ValueError(f"cannot tell the model version from {model_dir}: pass --model-version")
    try:
        return StreamTrainer(source, config, name, version)
    except BaseException:
        source.close()
        raise


# -- a table of events --------------------------------------------------------------------
def prepare_events(spec: FeatureSpec, table: pa.Table, time_unit: str = "auto", source: str = "<events>"):
    """(table sorted by the spec's time column, labels float32, event times ms int64 or None)."""
    inputs = sorted({f.input for f in spec.fields if f.input})
    missing = [c for c in inputs if c not in table.column_names]
    if missing:
        raise ValueError(
            f"events {source}: input column(s) {missing} used by the spec are not in the table "
            f"(columns: {table.column_names})"
        )
    if spec.label not in table.column_names:
        raise ValueError(
            f"events {source}: the spec's label column '{spec.label}' is not in the table "
            f"(columns: {table.column_names})"
        )
    times = None
    if spec.time and spec.time in table.column_names:
        col = table.column(spec.time)
        if col.null_count:
            raise ValueError(f"events {source}: time column '{spec.time}' has {col.null_count} null value(s)")
        raw = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        order = np.argsort(raw, kind="stable")
        if (np.diff(order) != 1).any():
            table = table.take(pa.array(order))
            raw = raw[order]
        times = impl.to_millis(raw, time_unit)
    raw_labels = table.column(spec.label).to_pylist()
    labels = np.asarray([np.nan if v is None else v for v in raw_labels], dtype=np.float64)
    bad = np.flatnonzero(~np.isin(labels, (0.0, 1.0)))
    if len(bad):
        raise ValueError(
            f"events {source}: row {bad[0]} (in time order): label '{spec.label}' must be 0 or 1, "
            f"got {raw_labels[bad[0]]!r} ({len(bad)} bad rows)"
        )
    return table, labels.astype(np.float32), times


def stream_train_table(
    trainer: StreamTrainer,
    table: pa.Table,
    sink: DeltaSink | str | Path,
    *,
    progress: bool = True,
    source: str = "<events>",
    chunk_rows: int = 65536,
    on_emit: Callable[[str], None] | None = None,
) -> dict:
    """Train on every event of ``table`` in time order, emitting to ``sink`` (a DeltaSink, or a
    spool directory) every K events / T seconds and once at the end. Returns a summary."""
    from offgraph.streaming.sinks import DeltaSink
    from offgraph.streaming.spool.sink import SpoolSink

    cfg, spec = trainer.cfg, trainer.spec
    if not isinstance(sink, DeltaSink):
        if not Path(sink).is_dir():
            raise ValueError(f"spool directory {sink} does not exist")
        sink = SpoolSink(sink)
    table, labels, times = prepare_events(spec, table, cfg.time_unit, source)
    inputs = sorted({f.input for f in spec.fields if f.input})
    n = table.num_rows
    t0 = time.perf_counter()
    last_emit = t0
    since_emit = 0
    files0, rows0, events0 = len(trainer.files), trainer.rows.n_trained, trainer.events

    def emit():
        nonlocal last_emit, since_emit
        where = trainer.emit(sink)
        last_emit, since_emit = time.perf_counter(), 0
        if where is not None and on_emit is not None:
            on_emit(where)

    bar = tqdm(total=n, unit="ev", desc="stream-train", disable=not progress)
    try:
        for c0 in range(0, n, chunk_rows):
            chunk = table.slice(c0, chunk_rows)
            cols = {c: chunk.column(c).to_pylist() for c in inputs}
            m = chunk.num_rows
            pos = 0
            while pos < m:
                take = min(cfg.batch_size, m - pos)
                if cfg.every_events is not None:
                    take = min(take, cfg.every_events - since_emit)
                s, e = c0 + pos, c0 + pos + take
                ms = times[s:e] if times is not None else np.full(take, time.time_ns() // 1_000_000, np.int64)
                try:
                    trainer.train_batch({c: v[pos : pos + take] for c, v in cols.items()}, labels[s:e], ms)
                except FeatureValueError as err:
                    raise ValueError(f"events {source}: {err} (rows {s}..{e - 1} in time order)") from None
                pos += take
                since_emit += take
                bar.update(take)
                if (cfg.every_events is not None and since_emit >= cfg.every_events) or (
                    cfg.every_seconds is not None and time.perf_counter() - last_emit >= cfg.every_seconds
                ):
                    emit()
                bar.set_postfix(rows=trainer.rows.n_trained, files=len(trainer.files), refresh=False)
        emit()
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    prog = trainer.progressive()
    return {
        "events": trainer.events - events0,
        "rows_touched": trainer.rows.n_trained - rows0,
        "files": [str(p) for p in trainer.files[files0:]],
        "files_emitted": len(trainer.files) - files0,
        "seconds": seconds,
        "events_per_second": (trainer.events - events0) / max(seconds, 1e-9),
        "progressive_auc": prog["auc"],
        "progressive_logloss": prog["logloss"],
        "model": trainer.model_name,
        "model_version": trainer.model_version,
        "next_seq": trainer.next_seq,
        "config": cfg.model_dump(),
    }


__all__ = [
    "StreamTrainConfig",
    "StreamTrainer",
    "ModelSource",
    "open_trainer",
    "exported_source",
    "run_source",
    "prepare_events",
    "stream_train_table",
]

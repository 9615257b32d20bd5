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
from offgraph.model.losses import PAIR_ROWS_MAX, has_pointwise, is_listwise, uses_pairs
from offgraph.model.metrics import auc, logloss, make_metric_fn
from offgraph.model.relevance import binarise
from offgraph.modeldir.manifest import training_loss
from offgraph.store.keys import BIAS_ROW, BIAS_TABLE
from offgraph.store.vocabulary_appends import read_appended
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
    loss: str = "pointwise"  # the loss the model was trained with (offgraph.model.losses): streaming keeps it
    bias_offset: float = 0.0  # the streamed bias so far (the store's bias row; a run: 0)
    appended: dict[str, list[str]] = field(default_factory=dict)  # keys appended to its vocabularies (a run: none)


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

    def logit_fn(emb, fo, dense):
        return serve(emb=emb, first_order=fo, **({} if dense is None else {"dense": dense}))["logit"]

    version = mv.version
    try:
        _, bias_w, _ = store.read_unique(np.array([BIAS_TABLE], np.uint32), np.array([BIAS_ROW], np.int64))
        appended = {f.name: read_appended(store, t) for t, f in enumerate(spec.fields) if f.capacity}
    except BaseException:
        store.close()
        raise
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
        loss=training_loss(mv.manifest, source=str(vdir)),
        bias_offset=float(bias_w[0]),
        appended=appended,
    )


def run_source(run_dir: str | Path) -> ModelSource:
    """A training run: the Keras DeepFM's tables and (frozen) head."""
    from offgraph.model.model import load_run

    model, spec, metrics = load_run(run_dir)
    emb_vars = [t.embeddings for t in model.front.emb_tables]
    w_vars = [t.embeddings for t in model.front.w_tables]
    d = spec.model.embedding_dim

    # the rows reserved for appended keys hold the unknown row's values once exported: a new key starts from them
    reserved = np.array([f.appendable.start if f.capacity else f.rows for f in spec.fields], np.int64)

    def read_rows(tables, rows):
        v = np.zeros((len(rows), d), np.float32)
        w = np.zeros(len(rows), np.float32)
        rows = np.where(rows >= reserved[tables.astype(np.int64)], 0, rows)
        for t in np.unique(tables):  # one gather per table, not per row
            m = tables == t
            v[m] = tf.gather(emb_vars[int(t)], rows[m]).numpy()
            w[m] = tf.gather(w_vars[int(t)], rows[m]).numpy()[:, 0]
        return v, w

    def logit_fn(emb, fo, dense):
        return model.head((emb, fo) if dense is None else (emb, fo, dense), training=False)

    loss = training_loss({"training": {"config": metrics.get("config")}}, source=f"run {run_dir}")
    return ModelSource(
        spec, d, read_rows, logit_fn, None, None, f"run {run_dir} (Keras head and tables)", keep=[model], loss=loss
    )


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
        self.loss = source.loss
        self.lists = is_listwise(self.loss)  # batches of whole lists (the spec's group), graded labels allowed
        if self.lists and not spec.group:
            raise ValueError(
                f"the model was trained with the {self.loss!r} loss, which compares a list's candidates, but its "
                "spec names no group column to make the events' lists of"
            )
        if self.lists and spec.model.calibration.platt:
            # streaming moves the scores under the Platt fit of the exported ones: its CTRs would be silently off
            raise ValueError(
                f"the model was trained with the {self.loss!r} loss and its scores are CTRs through a Platt "
                "calibration fitted to the exported model's scores; stream training would change the scores under "
                "it (the calibration is not refitted while streaming): train it without the fit (no validation "
                "rows), so its scores are ranking scores, or retrain instead"
            )
        self.source, self.cfg, self.spec = source, config, spec
        self.num_dense = len(spec.numeric)  # the numeric fields' values feed the frozen head's dense input
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
        for name, keys in source.appended.items():
            if keys:
                self.fg.append_keys(name, keys)
        if config.append_ids:  # new ids of a trained vocabulary field take its free rows (emitted as appends)
            self.fg.grow([f.name for f, on in zip(spec.fields, self.trainable) if f.capacity and on])
        self.rows = impl.LocalRows(source.dim, config.adagrad_init)
        self._grad = impl.make_grad_fn(source.logit_fn, len(spec.fields), source.dim, self.num_dense, self.loss)
        self._predict = impl.make_predict_fn(source.logit_fn, len(spec.fields), source.dim, self.num_dense)
        # the streamed bias offset (offgraph.store.keys.BIAS_TABLE's row): its value, Adagrad accumulator, newest
        # event, and whether it changed since the last delta
        self.bias, self.bias_acc, self.bias_ms, self.bias_dirty = source.bias_offset, config.adagrad_init, 0, False
        # a loss over lists alone is blind to a shift of every score (its gradient is float noise): the bias stays
        self.bias_trains = config.train_bias and has_pointwise(self.loss)
        self.next_seq = int(config.seq_start if config.seq_start is not None else time.time_ns())
        self.events = 0
        self.files: list[Path] = []
        self.loss_sum = 0.0
        self._labels: list[np.ndarray] = []
        self._preds: list[np.ndarray] = []
        self._lists: list[np.ndarray] = []  # a loss over lists: each event's list, numbered across the batches

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
        batch = self.fg.transform_columns(columns, n, grow=False)  # ids new to a vocabulary: rows come with a step
        idx = impl.batch_index(batch, self.poolings, self.half_lives)
        _, v, w = self._current(idx)
        logits = self._predict(
            tf.constant(v),
            tf.constant(w),
            tf.constant(idx.lookup),
            tf.constant(idx.segment),
            tf.constant(idx.scale),
            tf.constant(self._dense(batch)),
            tf.constant(self.bias, tf.float32),
            tf.constant(n, tf.int32),
        )
        return tf.sigmoid(logits).numpy()

    def _dense(self, batch) -> np.ndarray:
        """The head's dense input [n, k] (k = 0: a model without numeric fields)."""
        return batch.dense if self.num_dense else np.zeros((batch.n, 0), np.float32)

    # one gradient step
    def train_batch(
        self, columns: dict[str, list], labels: np.ndarray, event_ms: np.ndarray, lists: np.ndarray | None = None
    ) -> dict:
        """One step on n events (raw columns, labels: 0/1, or grades >= 0 for a loss over lists, event times in
        ms; ``lists`` [n]: each event's list 0..G-1, whole lists, needed by such a loss). Returns the batch's
        pre-update (progressive) predictions and loss."""
        n = len(labels)
        if n == 0:
            return {"n": 0, "loss": 0.0, "p": np.zeros(0, np.float32)}
        if self.lists and lists is None:
            raise ValueError(f"the {self.loss!r} loss needs each event's list")
        batch = self.fg.transform_columns(columns, n)
        idx = impl.batch_index(batch, self.poolings, self.half_lives)
        slots, v, w = self._current(idx)
        loss, logits, gv, gw, gb = self._grad(
            tf.constant(v),
            tf.constant(w),
            tf.constant(idx.lookup),
            tf.constant(idx.segment),
            tf.constant(idx.scale),
            tf.constant(self._dense(batch)),
            tf.constant(self.bias, tf.float32),
            tf.constant(np.asarray(labels, np.float32)),
            tf.constant(np.zeros(n, np.int32) if lists is None else np.asarray(lists, np.int32)),
            tf.constant(self.cfg.l2, tf.float32),
        )
        gv, gw = gv.numpy(), gw.numpy()
        c = self.cfg
        self._step_bias(float(gb), int(np.max(event_ms)))
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
        self.loss_sum += float(loss)
        self._labels.append(np.asarray(labels, np.float32))
        self._preds.append(p)
        if lists is not None:
            base = int(self._lists[-1].max()) + 1 if self._lists else 0
            self._lists.append(base + np.asarray(lists, np.int64))
        return {"n": n, "loss": float(loss), "p": p, "rows": len(slots)}

    def _step_bias(self, g: float, newest_ms: int) -> None:
        """One step of the bias offset (``lr_bias``, else ``lr``; Adagrad with its own accumulator)."""
        c = self.cfg
        if not self.bias_trains or g == 0.0:
            return
        lr_b = c.lr if c.lr_bias is None else c.lr_bias  # every event pushes it: the small rate (StreamTrainConfig)
        if c.optimizer == "sgd":
            self.bias = float(np.float32(self.bias - lr_b * g))
        else:
            self.bias_acc = float(np.float32(self.bias_acc + g * g))
            self.bias = float(np.float32(self.bias - lr_b * g / (np.sqrt(self.bias_acc) + c.adagrad_eps)))
        self.bias_ms, self.bias_dirty = max(self.bias_ms, newest_ms), True

    # deltas
    def take_delta(self) -> dict | None:
        """The rows touched since the last call as write_delta_file kwargs (None if none)."""
        if self.rows.pending == 0 and not self.bias_dirty and not self.fg.has_new_keys:
            return None
        appends = self._take_appends()
        t, r, v, w, times = self.rows.take_dirty()
        if self.bias_dirty:  # the bias row's key is above every field's: last, as take_dirty's order asks
            t = np.append(t, np.uint32(BIAS_TABLE))
            r = np.append(r, np.int64(BIAS_ROW))
            v = np.concatenate([v, np.zeros((1, v.shape[1]), np.float32)])
            w = np.append(w, np.float32(self.bias))
            times = np.append(times, np.int64(self.bias_ms))
            self.bias_dirty = False
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
            **({"vocabulary_appends": appends} if appends else {}),
        )

    def _take_appends(self) -> dict[int, tuple[int, list[str]]]:
        """The keys given rows since the last delta, by table id: they go in the delta of their rows."""
        return {self.spec.field_index(name): got for name, got in self.fg.take_new_keys().items()}

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
        out = {}
        if self._lists:  # a loss over lists: how the stream ordered each list before learning from it
            out["ndcg@10"] = make_metric_fn("ndcg@10")(y, p, np.concatenate(self._lists))
        y = binarise(y).astype(np.float32)  # graded labels (a loss over lists): relevant or not, as training's AUC
        return {"auc": auc(y, p) if 0 < y.sum() < len(y) else float("nan"), "logloss": logloss(y, p), **out}

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
def event_inputs(spec: FeatureSpec) -> list[str]:
    """The raw columns an event needs: every field's input, the numeric fields' included."""
    return sorted(set(spec.raw_inputs("request")) | set(spec.raw_inputs("item")))


def prepare_events(
    spec: FeatureSpec, table: pa.Table, time_unit: str = "auto", source: str = "<events>", lists: bool = False
):
    """(table in time order, labels float32, event times ms int64 or None, lists int64 [n] or None). ``lists``
    (a loss over lists): each list (the rows of one value of the spec's group column) is made contiguous, the lists
    in the order of their first event, each numbered 0..; the labels may be grades >= 0 (else 0 or 1)."""
    inputs = event_inputs(spec)
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
    if lists and (spec.group is None or spec.group not in table.column_names):
        raise ValueError(
            f"events {source}: the model's loss compares a list's candidates; the spec's group column "
            f"{spec.group!r} (a list: the events of one value) is not in the table (columns: {table.column_names})"
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
    groups = None
    if lists:
        col = table.column(spec.group)  # type: ignore[arg-type]  # checked above
        if col.null_count:
            raise ValueError(f"events {source}: group column '{spec.group}' has {col.null_count} null value(s)")
        codes = np.asarray(col.combine_chunks().dictionary_encode().indices, dtype=np.int64)
        # pyarrow numbers the values in order of first appearance: grouped, each list in time order, the lists by
        # their first event
        order = np.argsort(codes, kind="stable")
        if (np.diff(order) != 1).any():
            table = table.take(pa.array(order))
            times = times[order] if times is not None else None
        groups = codes[order]
    raw_labels = table.column(spec.label).to_pylist()
    labels = np.asarray([np.nan if v is None else v for v in raw_labels], dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(labels) & (labels >= 0)) if lists else ~np.isin(labels, (0.0, 1.0)))
    if len(bad):
        want = "a grade >= 0" if lists else "0 or 1"
        raise ValueError(
            f"events {source}: row {bad[0]} (in time order): label '{spec.label}' must be {want}, "
            f"got {raw_labels[bad[0]]!r} ({len(bad)} bad rows)"
        )
    return table, labels.astype(np.float32), times, groups


def _cuts(n: int, groups: np.ndarray | None) -> np.ndarray | None:
    """Where a batch may end: every event (None), or the ends of lists (ascending, the last n)."""
    if groups is None:
        return None
    return np.r_[np.flatnonzero(np.diff(groups)) + 1, n]


def _end(pos: int, want: int, cuts: np.ndarray | None) -> int:
    """The end of a batch from ``pos`` of about ``want`` events: ``pos + want``, or with ``cuts`` the last list end
    within it (at least one whole list, however long)."""
    if cuts is None:
        return pos + want
    i = int(np.searchsorted(cuts, pos + want, side="right")) - 1
    if i < 0 or cuts[i] <= pos:
        i = int(np.searchsorted(cuts, pos, side="right"))
    return int(cuts[i])


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
    """Train on every event of ``table`` in time order (a loss over lists: whole lists a batch, in the order of
    their first event), emitting to ``sink`` (a DeltaSink, or a spool directory) every K events / T seconds
    and once at the end. Returns a summary."""
    from offgraph.streaming.sinks import DeltaSink
    from offgraph.streaming.spool.sink import SpoolSink

    cfg, spec = trainer.cfg, trainer.spec
    if not isinstance(sink, DeltaSink):
        if not Path(sink).is_dir():
            raise ValueError(f"spool directory {sink} does not exist")
        sink = SpoolSink(sink)
    table, labels, times, groups = prepare_events(spec, table, cfg.time_unit, source, lists=trainer.lists)
    inputs = event_inputs(spec)
    n = table.num_rows
    cuts = _cuts(n, groups)
    if cuts is not None and uses_pairs(trainer.loss):
        longest = int(np.diff(np.r_[0, cuts]).max()) if n else 0
        if longest > PAIR_ROWS_MAX:
            raise ValueError(
                f"events {source}: a list of {longest} events; the {trainer.loss!r} loss compares the pairs of a "
                f"batch of at most {PAIR_ROWS_MAX} rows"
            )
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
        c0 = 0
        while c0 < n:
            c1 = min(_end(c0, chunk_rows, cuts), n)
            chunk = table.slice(c0, c1 - c0)
            cols = {c: chunk.column(c).to_pylist() for c in inputs}
            pos = c0
            while pos < c1:
                take = cfg.batch_size
                if cfg.every_events is not None:
                    take = min(take, cfg.every_events - since_emit)
                e = min(_end(pos, take, cuts), c1)
                ms = times[pos:e] if times is not None else np.full(e - pos, time.time_ns() // 1_000_000, np.int64)
                lists = None
                if groups is not None:  # the batch's lists numbered 0..G-1
                    g = groups[pos:e]
                    lists = np.r_[0, np.cumsum(np.diff(g) != 0)]
                try:
                    trainer.train_batch({c: v[pos - c0 : e - c0] for c, v in cols.items()}, labels[pos:e], ms, lists)
                except FeatureValueError as err:
                    raise ValueError(f"events {source}: {err} (rows {pos}..{e - 1} in time order)") from None
                since_emit += e - pos
                bar.update(e - pos)
                pos = e
                if (cfg.every_events is not None and since_emit >= cfg.every_events) or (
                    cfg.every_seconds is not None and time.perf_counter() - last_emit >= cfg.every_seconds
                ):
                    emit()
                bar.set_postfix(rows=trainer.rows.n_trained, files=len(trainer.files), refresh=False)
            c0 = c1
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
        **({"progressive_ndcg@10": prog["ndcg@10"]} if "ndcg@10" in prog else {}),
        "loss": trainer.loss,
        "bias_offset": trainer.bias,
        # keys appended to each vocabulary field with a capacity (in all: the stored ones and this stream's)
        **(
            {"vocabulary_appended": {k: len(a.keys) for k, a in trainer.fg.appended.items()}}
            if trainer.fg.appended
            else {}
        ),
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
    "event_inputs",
    "stream_train_table",
]

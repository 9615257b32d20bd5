"""The incremental trainer's maths: FG batch -> unique rows -> pooled [N, F, D] in TF ->
frozen head (with the numeric fields' dense [N, k] input) + the streamed bias -> the model's loss ->
per-row gradients -> SGD / row-wise Adagrad.

One batch of n events touches U distinct (table, row) pairs through K lookups.
Everything is vectorized over the K lookups and the U rows:

    pooled[i, f] = sum_{k in lookups of event i, field f} scale_k * row[lookup_k]
    scale_k      = 1 / (number of values of event i in field f)   (mean pooling)
                 = 1                                              (sum pooling)

which is exactly ``offgraph.features.pooling`` (a field with no value has no lookup and
pools to zeros). In TF: ``tf.gather`` of the U rows by lookup, then ONE
``tf.math.unsorted_segment_sum`` over ``n * F`` segments (segment = i * F + f),
reshaped to [n, F, D] / [n, F]. The head (the exported dense SavedModel
signature, or the Keras head of a run) is frozen: the gradient is taken w.r.t.
its inputs only and flows back into the U rows. A model with numeric fields gets their
[n, k] values as the head's ``dense`` input (the same FG values as serving; not trained:
they are inputs). The logit is the head's plus the streamed bias offset ``b`` (the store's
bias row, ``offgraph.store.keys.BIAS_TABLE``: 0 until the trainer first moves it), which is
trained like a row's first-order weight, so the model's bias moves as Keras's would.

Loss of a batch: the model's own training loss (``offgraph.model.losses.make_loss_fn``, the
manifest's ``training_loss``), scaled to a SUM over the batch's units, so a row's step does
not shrink with the batch size: each event (pointwise: ``sum_i BCE(label_i, logit_i)``), or
each list (a loss that compares a list's candidates: the loss times the batch's number of
lists; batches hold whole lists), pushes the rows it touches like one online step; plus
``l2/2 * sum_{touched rows} (|v|^2 + w^2)``.

Optimizers (row-wise state kept locally for touched rows only; the bias has its own):

* ``sgd``:      v -= lr * g_v;  w -= lr_w * g_w;  b -= lr_b * g_b
* ``adagrad``:  row-wise Adagrad (as FBGEMM / TorchRec's ``EXACT_ROWWISE_ADAGRAD``):
                acc_v += mean_d(g_v^2);  v -= lr * g_v / (sqrt(acc_v) + eps)
                acc_w += g_w^2;          w -= lr_w * g_w / (sqrt(acc_w) + eps)
                (the vector and the first-order weight of a row have one
                accumulator each; accumulators start at ``adagrad_init``; the
                bias is a first-order weight with an accumulator of its own).

``lr_w`` (the first-order weights' learning rate) defaults to ``lr``: the weights
enter the logit linearly and tolerate larger steps than the embeddings. ``lr_b`` (the bias's) defaults to
``lr`` too, never to ``lr_w``: every event of a batch pushes the bias, a batch's worth of a row's step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from offgraph.features.fg import FGBatch
from offgraph.features.pooling import recency_weights
from offgraph.model.losses import LossKey, is_listwise, make_loss_fn
from offgraph.scoring.batch import batch_keys
from offgraph.store.keys import ROW_LIMIT, combine_keys, split_keys  # noqa: F401 (ROW_LIMIT: stream_train)
from offgraph.streaming.stream_train_config import TIME_UNITS


# -- batch layout -------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchIndex:
    """The lookups of n events: U unique rows, K lookups, pooled into n * F segments."""

    n: int
    num_fields: int
    tables: np.ndarray  # uint32 [U]
    rows: np.ndarray  # int64 [U]
    lookup: np.ndarray  # int64 [K]: which unique row each lookup reads
    segment: np.ndarray  # int32 [K]: event * F + field
    scale: np.ndarray  # float32 [K]: pooling weight of the lookup

    @property
    def keys(self) -> np.ndarray:
        return combine_keys(self.tables, self.rows)


def batch_index(batch: FGBatch, poolings: list[str], half_lives: Sequence[float | None] | None = None) -> BatchIndex:
    """Unique rows and pooling segments of an FG batch (``transform_columns``: no broadcast); a ``recency``
    field's scale is each value's ``recency_weights`` (``half_lives[f]``, the spec's ``half_life``)."""
    if any(batch.broadcast):
        raise ValueError(
            "stream training needs one FG row per event (transform_columns), not a broadcast request batch"
        )
    if len(poolings) != len(batch.fields):
        raise ValueError(f"{len(poolings)} poolings for {len(batch.fields)} fields")
    keys = batch_keys(batch)  # lookups in field order, then value order: matches the loop below
    n, F = batch.n, len(batch.fields)
    segs, scales = [], []
    for f, (rag, mode) in enumerate(zip(batch.fields, poolings)):
        lengths = rag.lengths
        segs.append(np.repeat(np.arange(n, dtype=np.int64) * F + f, lengths))
        if mode == "mean":
            scales.append(np.repeat(1.0 / np.maximum(lengths, 1).astype(np.float32), lengths))
        elif mode == "sum":
            scales.append(np.ones(int(lengths.sum()), np.float32))
        elif mode == "recency" and half_lives is not None and half_lives[f] is not None:
            scales.append(recency_weights(lengths, float(half_lives[f])))
        else:
            raise ValueError(f"field {f}: unknown pooling {mode!r} (recency needs its half_life)")
    segment = np.concatenate(segs).astype(np.int32) if segs else np.zeros(0, np.int32)
    scale = np.concatenate(scales).astype(np.float32) if scales else np.zeros(0, np.float32)
    if len(segment) != len(keys.inverse):
        raise ValueError("FG batch lookups and pooling segments disagree (internal error)")
    return BatchIndex(n, F, keys.unique_tables, keys.unique_rows, keys.inverse, segment, scale)


# -- the gradient -------------------------------------------------------------------------
LogitFn = Callable[[tf.Tensor, tf.Tensor, "tf.Tensor | None"], tf.Tensor]
"""(emb [n, F, D], first_order [n, F], dense [n, k] or None: a model without numeric fields) -> logits [n]."""


def pool_tf(vectors, first_order, lookup, segment, scale, n, num_fields: int):
    """Unique rows [U, D] / [U] -> emb [n, F, D], first_order [n, F] (offgraph.features.pooling semantics)."""
    dim = tf.shape(vectors)[1]
    nseg = n * num_fields
    v = tf.math.unsorted_segment_sum(tf.gather(vectors, lookup) * scale[:, None], segment, nseg)
    w = tf.math.unsorted_segment_sum(tf.gather(first_order, lookup) * scale, segment, nseg)
    return tf.reshape(v, tf.stack([n, num_fields, dim])), tf.reshape(w, tf.stack([n, num_fields]))


def _rows_spec(dim: int, num_dense: int) -> list[tf.TensorSpec]:
    """vectors, first_order, lookup, segment, scale, dense, bias: a batch's rows and the head's other inputs."""
    return [
        tf.TensorSpec([None, dim], tf.float32),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([None, num_dense], tf.float32),
        tf.TensorSpec([], tf.float32),
    ]


def _logits(logit_fn: LogitFn, num_fields: int, num_dense: int, n, vectors, first_order, lookup, segment, scale, dense):
    emb, fo = pool_tf(vectors, first_order, lookup, segment, scale, n, num_fields)
    return tf.reshape(logit_fn(emb, fo, dense if num_dense else None), [-1])


def make_grad_fn(logit_fn: LogitFn, num_fields: int, dim: int, num_dense: int = 0, loss: str = LossKey.POINTWISE):
    """A compiled ``(vectors, first_order, lookup, segment, scale, dense, bias, labels, lists, l2) ->
    (loss, logits, grad_vectors [U, D], grad_first_order [U], grad_bias)``; the head is frozen. ``lists``
    [n] int32 numbers each event's list 0..G-1 (a pointwise loss ignores it); ``dense`` [n, k] (k = 0: none)."""
    loss_fn = make_loss_fn(loss)
    per_list = is_listwise(loss)

    @tf.function(
        input_signature=[
            *_rows_spec(dim, num_dense),
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([], tf.float32),
        ]
    )
    def grad_fn(vectors, first_order, lookup, segment, scale, dense, bias, labels, lists, l2):
        n = tf.shape(labels)[0]
        with tf.GradientTape() as tape:
            tape.watch([vectors, first_order, bias])
            logits = _logits(logit_fn, num_fields, num_dense, n, vectors, first_order, lookup, segment, scale, dense)
            logits = logits + bias
            # the loss fns average (over events, lists or pairs): summed over the batch's units (module doc)
            units = tf.reduce_max(lists) + 1 if per_list else n
            main = loss_fn(labels, logits, lists) * tf.cast(units, tf.float32)
            reg = 0.5 * l2 * (tf.reduce_sum(tf.square(vectors)) + tf.reduce_sum(tf.square(first_order)))
            total = main + reg
        gv, gw, gb = tape.gradient(
            total, [vectors, first_order, bias], unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return main, logits, tf.convert_to_tensor(gv), tf.convert_to_tensor(gw), tf.convert_to_tensor(gb)

    return grad_fn


def make_predict_fn(logit_fn: LogitFn, num_fields: int, dim: int, num_dense: int = 0):
    """A compiled ``(vectors, first_order, lookup, segment, scale, dense, bias, n) -> logits [n]`` (no gradient)."""

    @tf.function(input_signature=[*_rows_spec(dim, num_dense), tf.TensorSpec([], tf.int32)])
    def predict_fn(vectors, first_order, lookup, segment, scale, dense, bias, n):
        return _logits(logit_fn, num_fields, num_dense, n, vectors, first_order, lookup, segment, scale, dense) + bias

    return predict_fn


# -- optimizers (NumPy, vectorized over the batch's unique rows) --------------------------
def sgd_update(v, w, gv, gw, lr: float, lr_w: float):
    """(v, w) after one SGD step (``lr_w``: the first-order weights' learning rate)."""
    return (v - lr * gv).astype(np.float32), (w - lr_w * gw).astype(np.float32)


def rowwise_adagrad_update(v, w, acc_v, acc_w, gv, gw, lr: float, lr_w: float, eps: float):
    """Returns (v, w, acc_v, acc_w) after one row-wise Adagrad step."""
    acc_v = acc_v + np.mean(gv * gv, axis=1)
    acc_w = acc_w + gw * gw
    v = v - lr * gv / (np.sqrt(acc_v)[:, None] + eps)
    w = w - lr_w * gw / (np.sqrt(acc_w) + eps)
    return v.astype(np.float32), w.astype(np.float32), acc_v.astype(np.float32), acc_w.astype(np.float32)


# -- local row state ----------------------------------------------------------------------
class LocalRows:
    """Touched rows' latest values and optimizer state, keyed by combined key (offgraph.store.keys.combine_keys).

    Lookups are vectorized (``np.searchsorted``) over two sorted key runs: a big one
    and a small recent one merged into it when it grows past a quarter of it, so
    inserts cost amortized O(log) per row, never a Python loop per row.
    """

    def __init__(self, dim: int, adagrad_init: float = 0.0, capacity: int = 1024):
        self.dim = dim
        self.adagrad_init = float(adagrad_init)
        self.size = 0
        self.keys = np.zeros(capacity, np.uint64)
        self.vectors = np.zeros((capacity, dim), np.float32)
        self.first_order = np.zeros(capacity, np.float32)
        self.acc_v = np.zeros(capacity, np.float32)
        self.acc_w = np.zeros(capacity, np.float32)
        self.event_ms = np.zeros(capacity, np.int64)
        self.dirty = np.zeros(capacity, bool)
        self.trained = np.zeros(capacity, bool)  # ever changed (rows only read stay False)
        self._runs = [(np.zeros(0, np.uint64), np.zeros(0, np.int64)), (np.zeros(0, np.uint64), np.zeros(0, np.int64))]

    def __len__(self) -> int:
        return self.size

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where the row was never touched."""
        keys = np.asarray(keys, np.uint64)
        out = np.full(len(keys), -1, np.int64)
        for sk, slots in self._runs:
            if len(sk) == 0:
                continue
            pos = np.minimum(np.searchsorted(sk, keys), len(sk) - 1)
            hit = sk[pos] == keys
            out[hit] = slots[pos[hit]]
        return out

    def add(self, keys: np.ndarray, vectors: np.ndarray, first_order: np.ndarray) -> np.ndarray:
        """Insert new (distinct, absent) keys with their current values; returns their slots."""
        keys = np.asarray(keys, np.uint64)
        k = len(keys)
        if k == 0:
            return np.zeros(0, np.int64)
        self._grow(self.size + k)
        slots = np.arange(self.size, self.size + k, dtype=np.int64)
        self.keys[slots] = keys
        self.vectors[slots] = vectors
        self.first_order[slots] = first_order
        self.acc_v[slots] = self.adagrad_init
        self.acc_w[slots] = self.adagrad_init
        self.event_ms[slots] = 0
        self.size += k
        (mk, ms), (rk, rs) = self._runs
        rk, rs = np.concatenate([rk, keys]), np.concatenate([rs, slots])
        if len(rk) > max(4096, len(mk) // 4):
            mk, ms, rk, rs = np.concatenate([mk, rk]), np.concatenate([ms, rs]), rk[:0], rs[:0]
            o = np.argsort(mk, kind="stable")
            mk, ms = mk[o], ms[o]
        else:
            o = np.argsort(rk, kind="stable")
            rk, rs = rk[o], rs[o]
        self._runs = [(mk, ms), (rk, rs)]
        return slots

    def _grow(self, need: int) -> None:
        cap = len(self.keys)
        if need <= cap:
            return
        new = max(need, 2 * cap)
        for name in ("keys", "vectors", "first_order", "acc_v", "acc_w", "event_ms", "dirty", "trained"):
            a = getattr(self, name)
            b = np.zeros((new,) + a.shape[1:], a.dtype)
            b[:cap] = a
            setattr(self, name, b)

    def touch(self, slots: np.ndarray, event_ms: np.ndarray) -> None:
        """Mark rows changed; ``event_ms`` [len(slots)]: the newest event behind each."""
        self.dirty[slots] = True
        self.trained[slots] = True
        self.event_ms[slots] = np.maximum(self.event_ms[slots], event_ms)

    def take_dirty(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tables, rows, vectors, first_order, event_ms) of the rows changed since the last
        call, ascending by (table, row); clears the dirty marks."""
        slots = np.flatnonzero(self.dirty[: self.size])
        slots = slots[np.argsort(self.keys[slots], kind="stable")]
        self.dirty[slots] = False
        t, r = split_keys(self.keys[slots])
        return t, r, self.vectors[slots].copy(), self.first_order[slots].copy(), self.event_ms[slots].copy()

    @property
    def n_trained(self) -> int:
        """Rows changed at least once."""
        return int(self.trained[: self.size].sum())

    @property
    def pending(self) -> int:
        return int(self.dirty[: self.size].sum())


def newest_per_row(
    lookup: np.ndarray, segment: np.ndarray, num_fields: int, num_rows: int, event_ms: np.ndarray
) -> np.ndarray:
    """[U]: the newest event time among the events that looked each unique row up."""
    out = np.zeros(num_rows, np.int64)
    np.maximum.at(out, lookup, np.asarray(event_ms, np.int64)[segment // num_fields])
    return out


# -- time ---------------------------------------------------------------------------------


def to_millis(times: np.ndarray, unit: str) -> np.ndarray:
    """Event times -> int64 epoch milliseconds. ``auto`` guesses the unit from the magnitude of
    epoch times (seconds below 1e11, ms below 1e14, us below 1e17, else ns)."""
    t = np.asarray(times, np.float64)
    if unit == "auto":
        m = float(np.nanmax(np.abs(t))) if len(t) else 0.0
        unit = "s" if m < 1e11 else "ms" if m < 1e14 else "us" if m < 1e17 else "ns"
    if unit not in TIME_UNITS:
        raise ValueError(f"unknown time unit {unit!r}: expected 'auto' or one of {sorted(TIME_UNITS)}")
    return np.floor(t * TIME_UNITS[unit]).astype(np.int64)

"""The dense head's forward in NumPy (float32 BLAS matmuls), its weights read from the loaded SavedModel.

The SavedModel stays the contract: this is a faster runtime of the same graph, taken only where it gives
the SavedModel's CTRs within ``PARITY`` on a probe batch at load (:func:`checked_head`). A TensorFlow call of
a signature costs about 0.3 ms before any arithmetic; the same head in NumPy is a handful of BLAS calls on arrays
the scorer already holds (``bench/results/dense-head/``: 3.5x faster at N = 50, 1.2x at 2,000 with one BLAS
thread; with OpenBLAS's own threads on a busy machine it loses from N = 200 up, hence
:func:`default_max_rows`).

The head (``offgraph.model.head.DeepFMHead``, its split form ``offgraph.model.split_head``):

  z     = x_r W1_r (once, [1, H]) + x_c W1_c + dense W1_k + b1     W1's rows gathered by field
  deep  = out(relu(... relu(z) ...))                                 (no hidden layer: z is the out unit's)
  s, q  = sum_f v_f, sum_f v_f^2 (request part once + candidates')
  logit = bias + sum first_order + dense . dense_w + 0.5 sum_d (s^2 - q) + deep
  ctr   = sigmoid(logit)

The weights are found by name on the loaded object (``loaded.head``: ``hidden[i]`` and ``out_unit``, each
with its kernel and bias, ``bias`` and ``dense_w``), the export's tracked attributes, so every version
exported so far has them; a version whose object lacks them keeps the SavedModel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PARITY = 1e-6
"""Max |CTR| difference from the SavedModel on the probe batch for the NumPy forward to serve (fp32)."""

NUMPY_HEAD_MAX_ROWS = 50
"""The scorer's default where BLAS may run several threads: requests of at most this many candidates through the
NumPy forward, larger ones through the SavedModel. Measured (``bench/results/dense-head/``, a busy 2-CPU machine):
with OpenBLAS's own threads the NumPy forward's median at N = 50 was 0.26-0.30x the SavedModel's in every run, but
from N = 200 up it went from 0.3x to 12x run to run (a matmul waits for its BLAS threads' time slices); with one
BLAS thread it was under the SavedModel's at every N up to 2000 (:func:`default_max_rows`)."""

SINGLE_THREAD_MAX_ROWS = 1 << 30
"""The default where BLAS runs one thread (:func:`blas_one_thread`): the NumPy forward at every N."""

PROBE_ROWS = 64
"""Candidates in the load's probe batch."""


@dataclass(frozen=True)
class HeadWeights:
    """The dense head's weights, float32: ``layers`` (kernel [in, out], bias [out]) hidden first, the out unit
    last (relu after every layer but the last), ``bias`` (the scalar), ``dense_w`` [k] (None without numeric
    fields), ``num_fields`` and ``dim`` (the first layer's rows: ``num_fields * dim`` then the k numeric ones)."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    bias: np.float32
    dense_w: np.ndarray | None
    num_fields: int
    dim: int


def blas_one_thread() -> bool:
    """Whether NumPy's BLAS runs one thread now, as its library says (threadpoolctl): set by OPENBLAS_NUM_THREADS /
    OMP_NUM_THREADS when it loaded, or later (``offgraph serve``'s ``--blas-threads``, 1 by default)."""
    from threadpoolctl import threadpool_info

    counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    return bool(counts) and max(counts) == 1


def default_max_rows() -> int:
    """The scorer's default bound on the candidates scored through the NumPy forward (the SavedModel above it)."""
    return SINGLE_THREAD_MAX_ROWS if blas_one_thread() else NUMPY_HEAD_MAX_ROWS


def _value(var: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(var.numpy(), dtype=np.float32))


def _kernel(layer: Any) -> Any:
    """A restored Dense layer's kernel variable (Keras 3 tracks it as ``_kernel``; older Keras as ``kernel``)."""
    for name in ("_kernel", "kernel"):
        var = getattr(layer, name, None)
        if var is not None:
            return var
    raise AttributeError("no kernel")


def read_weights(loaded: Any, num_fields: int, dim: int, num_dense: int) -> HeadWeights | None:
    """The weights of a loaded dense SavedModel (``offgraph.modeldir.dense.load_dense``'s object), or None when
    its object graph does not hold them where the export puts them, or their shapes do not chain."""
    try:
        head = loaded.head
        units = [*list(head.hidden), head.out_unit]
        layers = tuple((_value(_kernel(u)), _value(u.bias)) for u in units)
        bias = np.float32(head.bias.numpy())
        dense_w = _value(head.dense_w) if num_dense else None
    except (AttributeError, TypeError, ValueError):
        return None
    rows = num_fields * dim + num_dense
    for kernel, b in layers:
        if kernel.ndim != 2 or kernel.shape[0] != rows or b.shape != (kernel.shape[1],):
            return None
        rows = kernel.shape[1]
    if rows != 1 or (dense_w is not None and dense_w.shape != (num_dense,)):
        return None
    return HeadWeights(layers, bias, dense_w, num_fields, dim)


def _sigmoid(logit: np.ndarray) -> np.ndarray:
    # through tanh: no overflow for any logit (1 / (1 + exp(-x)) overflows exp below -88), float32 throughout
    out = np.tanh(logit * np.float32(0.5))
    out *= np.float32(0.5)
    out += np.float32(0.5)
    return out


class NumpyHead:
    """``whole(inputs)`` and ``split(inputs)``: CTRs [N] float32 of the signatures' inputs (``serving_default``'s
    ``emb``, ``first_order`` (, ``dense``); ``split``'s ``req_emb``, ``req_first_order``, ``cand_emb``,
    ``cand_first_order`` (, ``dense``)), by the weights ``w``; ``request_fields`` / ``candidate_fields``: the
    manifest's ``dense.split`` (empty: no split form)."""

    def __init__(self, w: HeadWeights, request_fields: Sequence[int] = (), candidate_fields: Sequence[int] = ()):
        self.w = w
        kernel1, b1 = w.layers[0]
        fd = w.num_fields * w.dim
        self._units = kernel1.shape[1]
        self._w1_dense, self._b1 = kernel1[fd:], b1
        self._rest = w.layers[1:]
        self._w1 = self._rows(kernel1, range(w.num_fields))
        self._w1_req = self._rows(kernel1, request_fields)
        self._w1_cand = self._rows(kernel1, candidate_fields)
        self._field_sum = self._w1[:, self._units :]  # [F*D, D]: sums over the fields of each of the D values

    def _rows(self, kernel1: np.ndarray, fields: Sequence[int]) -> np.ndarray:
        """The first layer's rows that ``fields``' values (in this order, D each) multiply, with D columns more
        that sum the fields' vectors: the FM's s comes out of the same BLAS call (a sum over the field axis
        of [N, F, D] is a strided reduction, slower than the matmul itself)."""
        d = self.w.dim
        f = np.asarray(list(fields), dtype=np.int64)
        idx = (f[:, None] * d + np.arange(d)).reshape(-1)
        field_sum = np.tile(np.eye(d, dtype=np.float32), (len(f), 1))
        return np.ascontiguousarray(np.concatenate([kernel1[idx], field_sum], axis=1))

    @staticmethod
    def _fm(s: np.ndarray, q: np.ndarray) -> np.ndarray:
        """0.5 sum_d (s_d^2 - q_d) [N], subtracted per d before the sum as the SavedModel does: the two sums
        apart are large beside their difference, and float32 loses it (1e-5 of the logit on the probe)."""
        q -= s * s
        return np.float32(-0.5) * q.sum(axis=1)

    def _tail(self, z: np.ndarray, first: np.ndarray, fm: np.ndarray, dense: np.ndarray | None) -> np.ndarray:
        """CTRs from the first layer's pre-activation ``z`` [N, H] (bias not yet added), the first-order sum and
        the FM term [N]."""
        w = self.w
        if dense is not None and w.dense_w is not None:
            dense = np.asarray(dense, dtype=np.float32)
            z += dense @ self._w1_dense
            first = first + dense @ w.dense_w
        z += self._b1
        for kernel, b in self._rest:
            np.maximum(z, 0, out=z)
            z = z @ kernel
            z += b
        logit = z[:, 0] + fm
        logit += first
        logit += w.bias
        return _sigmoid(logit)

    def whole(self, inputs: Mapping[str, Any]) -> np.ndarray:
        emb = np.asarray(inputs["emb"], dtype=np.float32)
        x = emb.reshape(emb.shape[0], -1)
        zs = x @ self._w1  # [N, H + D]: the first layer's x W1, then s
        h = self._units
        fm = self._fm(zs[:, h:], (x * x) @ self._field_sum)
        first = np.asarray(inputs["first_order"], dtype=np.float32).sum(axis=1)
        return self._tail(zs[:, :h], first, fm, inputs.get("dense"))

    def split(self, inputs: Mapping[str, Any]) -> np.ndarray:
        req = np.asarray(inputs["req_emb"], dtype=np.float32).reshape(1, -1)
        cand = np.asarray(inputs["cand_emb"], dtype=np.float32)
        x = cand.reshape(cand.shape[0], -1)
        zs = x @ self._w1_cand
        zs += req @ self._w1_req  # the request's part once, broadcast over the candidates
        h = self._units
        q = (x * x) @ self._field_sum[: x.shape[1]]
        q += (req * req) @ self._field_sum[: req.shape[1]]
        fm = self._fm(zs[:, h:], q)
        first = np.asarray(inputs["cand_first_order"], dtype=np.float32).sum(axis=1)
        first += np.float32(np.asarray(inputs["req_first_order"], dtype=np.float32).sum())
        return self._tail(zs[:, :h], first, fm, inputs.get("dense"))


def probe_inputs(specs: Mapping[str, Sequence[int | None]], rows: int = PROBE_ROWS, seed: int = 0) -> dict:
    """Random float32 inputs of a signature's shapes (``None``: ``rows``). Each candidate's values scaled by its
    own factor from 0.01 to 1: logits from near 0 (the sigmoid's steep middle) to large; the request's one row
    (the split signature's [1, ...] inputs) by 0.3."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in specs.items():
        dims = [rows if d is None else int(d) for d in shape]
        x = rng.normal(size=dims)
        per_row = np.geomspace(0.01, 1.0, rows) if shape and shape[0] is None else np.full(dims[0], 0.3)
        scale = per_row.reshape([-1] + [1] * (len(dims) - 1))
        out[name] = (x * scale).astype(np.float32)
    return out


def max_gap(numpy_call: Callable[[Mapping[str, Any]], np.ndarray], tf_call: Callable, specs: Mapping) -> float:
    """Max |CTR| difference of ``numpy_call`` from ``tf_call`` (a ``SignatureCall``) on :func:`probe_inputs`."""
    probe = probe_inputs(specs)
    want = np.asarray(tf_call(probe)["ctr"], dtype=np.float64)
    got = np.asarray(numpy_call(probe), dtype=np.float64)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.abs(got - want).max())


def checked_head(
    head: NumpyHead | None, tf_call: Callable, specs: Mapping, split: bool, source: str
) -> Callable[[Mapping[str, Any]], np.ndarray] | None:
    """``head``'s forward of one signature (``split``: the split one) if it gives ``tf_call``'s CTRs within
    ``PARITY`` on a probe of ``specs`` (the signature's input shapes); else None, logged once."""
    if head is None:
        log.warning("%s: the dense head's weights are not where the export puts them; the SavedModel serves", source)
        return None
    call = head.split if split else head.whole
    try:
        gap = max_gap(call, tf_call, specs)
    except Exception:  # noqa: BLE001 - any failure of the NumPy forward on the probe means: keep the SavedModel
        gap = float("inf")
    if not gap <= PARITY:
        log.warning(
            "%s: the NumPy dense head differs from the SavedModel by %.3g (> %g) on a probe; the SavedModel serves",
            source,
            gap,
            PARITY,
        )
        return None
    return call

"""Record formats by name: ``get_codec("fp32" | "fp16" | "int8", dim)``.

Each codec has a fixed ``record_bytes`` and fully vectorized
``encode(vectors [K, D] f32, first_order [K] f32) -> uint8 [K, record_bytes]`` and
``decode(uint8 [K, record_bytes]) -> (vectors [K, D] f32, first_order [K] f32)``.

One record per row = the embedding vector AND the first-order weight.

All multi-byte fields are little-endian. ``D`` is the embedding width.

========  ==============================================================  ============
format    record layout                                                   bytes
========  ==============================================================  ============
fp32      v[0..D-1] f32, w f32                                            4*D + 4
fp16      v[0..D-1] f16, w f16                                            2*D + 2
int8      q[0..D-1] u8, q_w u8, scale f16, offset f16                     D + 5
========  ==============================================================  ============

int8 is row-wise affine quantization as in FBGEMM / TorchRec (fp16 scale and bias),
applied to the D+1 values ``x = (v[0], ..., v[D-1], w)`` of a row (the first-order
weight is the row's (D+1)-th element, which keeps the record at D + 5 bytes):
``x'[d] = q[d] * scale + offset``. ``offset`` is ``min(x)`` rounded DOWN to fp16,
``scale`` is ``(max(x) - offset) / 255`` rounded UP to fp16, and
``q = round((x - offset) / scale)``, so every ``q`` lies in [0, 255] without clipping
and ``|x - x'| <= scale / 2`` (plus float32 rounding). With ``ulp16(a)`` the fp16
spacing at ``a`` (``max(|a| * 2**-10, 2**-24)``), that is, per element::

    |x - x'| <= 0.5 * ((max - min) + ulp16(min)) / 255 + 0.5 * ulp16(scale)   (+ f32 eps)

where min and max are over the D+1 values (vector and weight). A constant row gets
``scale = 0`` and decodes to ``offset`` (no division by zero). Trade-off: a
first-order weight far outside the range of its vector widens the row's range and so
the vector's error; 22-byte records with an fp16 weight avoided that but could not
meet the on-disk size goal (see offgraph/store/README.md).

What each format can hold (``Codec.check_storable`` says why not, naming the column,
delta, element and value; ``encode`` raises ValueError with the same words):
fp32: finite values; fp16 and int8: finite values with |x| <= 65504 (the fp16 range;
int8 keeps its scale and offset in fp16), never stored as inf.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Codec", "get_codec", "codec_names", "CODECS", "check_records"]

F16_MAX = 65504.0

_LE_F32 = np.dtype("<f4")
_LE_F16 = np.dtype("<f2")


def check_inputs(vectors, first_order, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate shapes; return float32 ``[K, D]`` and ``[K]`` arrays."""
    v = np.asarray(vectors, dtype=np.float32)
    w = np.asarray(first_order, dtype=np.float32)
    if v.ndim != 2 or v.shape[1] != dim:
        raise ValueError(f"vectors must have shape [K, {dim}], got {v.shape}")
    if w.ndim != 1 or w.shape[0] != v.shape[0]:
        raise ValueError(f"first_order must have shape [{v.shape[0]}], got {w.shape}")
    return v, w


def check_records(records, record_bytes: int) -> np.ndarray:
    r = np.asarray(records)
    if r.dtype != np.uint8 or r.ndim != 2 or r.shape[1] != record_bytes:
        raise ValueError(f"records must be uint8 [K, {record_bytes}], got {r.dtype} {r.shape}")
    return r


def first_bad(name: str, x: np.ndarray, bad: np.ndarray) -> str:
    """Where the first True of ``bad`` (same shape as ``x``) is, and its value: "column
    'vector' holds 3 values ...; first: delta 7, element 3: 70000.0"."""
    at = np.unravel_index(int(np.argmax(bad)), bad.shape)
    where = f"delta {int(at[0])}" + (f", element {int(at[1])}" if bad.ndim == 2 else "")
    return f"column {name!r} holds {int(np.count_nonzero(bad))} such values; first: {where}: {float(x[at])!r}"


def _within(a: np.ndarray, bound: float) -> bool:
    """All of ``a`` finite and within +-bound: two reductions, no temporary array (the hot
    path); NaN propagates into min and max."""
    if a.size == 0:
        return True
    lo, hi = float(a.min()), float(a.max())
    return bool(np.isfinite(lo) and np.isfinite(hi) and -bound <= lo and hi <= bound)


def finite_problem(vectors: np.ndarray, first_order: np.ndarray) -> str | None:
    for name, a in (("vector", vectors), ("first_order", first_order)):
        if not _within(a, np.inf):
            return f"values must be finite (no NaN/inf): {first_bad(name, a, ~np.isfinite(a))}"
    return None


def f16_range_problem(vectors: np.ndarray, first_order: np.ndarray) -> str | None:
    for name, a in (("vector", vectors), ("first_order", first_order)):
        if not _within(a, F16_MAX):
            bad = ~(np.abs(a) <= F16_MAX)  # NaN compares False: counted too
            return f"values must be finite and within +-{F16_MAX} (fp16 range): {first_bad(name, a, bad)}"
    return None


class Codec:
    """Base codec: fixed-size records, vectorized encode/decode."""

    name = ""

    def __init__(self, dim: int) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"codec dim must be a positive int, got {dim!r}")
        self.dim = int(dim)
        self.record_bytes = self._record_bytes()

    def _record_bytes(self) -> int:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim, "record_bytes": self.record_bytes}

    def check_storable(self, vectors, first_order) -> str | None:
        """Why these rows cannot be stored in this format (None: they can): the rule, the
        column, the first offending delta (and element) and its value. Vectorized; the
        same check :meth:`encode` refuses with, so a caller can refuse one input (e.g. one
        delta file) before anything is written."""
        v, w = check_inputs(vectors, first_order, self.dim)
        why = self._problem(v, w)
        return None if why is None else f"{self.name} records: {why}"

    def _refuse_unstorable(self, v: np.ndarray, w: np.ndarray) -> None:
        why = self._problem(v, w)
        if why is not None:
            raise ValueError(f"{self.name}: {why}")

    def _problem(self, v: np.ndarray, w: np.ndarray) -> str | None:
        raise NotImplementedError

    def decode_rows(self, records) -> np.ndarray:
        """float32 ``[K, D+1]``: each record's vector, then its weight (what pooling sums, in one array)."""
        raise NotImplementedError

    def decode(self, records) -> tuple[np.ndarray, np.ndarray]:
        """float32 vectors ``[K, D]`` and weights ``[K]``, each contiguous (:meth:`decode_rows` split)."""
        x = self.decode_rows(records)
        return np.ascontiguousarray(x[:, : self.dim]), x[:, self.dim].copy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, record_bytes={self.record_bytes})"


class FloatCodec(Codec):
    """Little-endian floats, the vector then the weight: ``fp32`` (4D+4 bytes, finite values)
    or ``fp16`` (2D+2 bytes, finite values within the fp16 range). The formats differ only in
    the float type and what it can hold."""

    def __init__(self, dim: int, name: str, dtype, problem) -> None:
        self.name, self._dtype, self._problem = name, np.dtype(dtype), problem
        super().__init__(dim)

    def _record_bytes(self) -> int:
        return self._dtype.itemsize * (self.dim + 1)

    def encode(self, vectors, first_order) -> np.ndarray:
        v, w = check_inputs(vectors, first_order, self.dim)
        self._refuse_unstorable(v, w)
        out = np.empty((v.shape[0], self.dim + 1), dtype=self._dtype)
        out[:, : self.dim] = v
        out[:, self.dim] = w
        return out.view(np.uint8)

    def decode_rows(self, records) -> np.ndarray:
        r = check_records(records, self.record_bytes)
        return np.ascontiguousarray(r).view(self._dtype).astype(np.float32)

    def __repr__(self) -> str:
        return f"FloatCodec({self.name!r}, dim={self.dim}, record_bytes={self.record_bytes})"


def fp32_codec(dim: int) -> FloatCodec:
    return FloatCodec(dim, "fp32", _LE_F32, finite_problem)


def fp16_codec(dim: int) -> FloatCodec:
    return FloatCodec(dim, "fp16", _LE_F16, f16_range_problem)


def f16_round(x: np.ndarray, direction: str) -> np.ndarray:
    """Round float32 ``x`` to float16 toward -inf ("down") or +inf ("up")."""
    h = x.astype(np.float16)
    back = h.astype(np.float32)
    if direction == "down":
        bad = back > x
        if bad.any():
            h[bad] = np.nextafter(h[bad], np.float16(-np.inf))
    elif direction == "up":
        bad = back < x
        if bad.any():
            h[bad] = np.nextafter(h[bad], np.float16(np.inf))
    else:
        raise ValueError(f"direction must be 'down' or 'up', got {direction!r}")
    return h


class Int8RowwiseCodec(Codec):
    """Row-wise uint8 affine quantization of (vector, weight) with fp16 scale/offset."""

    name = "int8"
    # scale and offset are fp16: offset = min(x) must be an fp16; max(x) is held to
    # the same range (one rule for both 16-bit formats)
    _problem = staticmethod(f16_range_problem)

    def _record_bytes(self) -> int:
        return self.dim + 5

    def encode(self, vectors, first_order) -> np.ndarray:
        v, w = check_inputs(vectors, first_order, self.dim)
        k, d = v.shape
        x = np.empty((k, d + 1), dtype=np.float32)
        x[:, :d] = v
        x[:, d] = w
        self._refuse_unstorable(v, w)
        lo, hi = x.min(axis=1), x.max(axis=1)
        offset16 = f16_round(lo, "down")
        offset = offset16.astype(np.float32)
        scale16 = f16_round((hi - offset) / np.float32(255.0), "up")
        scale = scale16.astype(np.float32)
        inv = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale > 0)
        x -= offset[:, None]
        x *= inv[:, None]
        np.rint(x, out=x)
        np.clip(x, 0, 255, out=x)
        out = np.empty((k, d + 5), dtype=np.uint8)
        out[:, : d + 1] = x
        meta = out[:, d + 1 :].view(_LE_F16)  # [k, 2]: scale, offset
        meta[:, 0] = scale16
        meta[:, 1] = offset16
        return out

    def decode_rows(self, records) -> np.ndarray:
        r = check_records(records, self.record_bytes)
        d = self.dim
        meta = np.ascontiguousarray(r[:, d + 1 :]).view(_LE_F16).astype(np.float32)
        x = r[:, : d + 1].astype(np.float32)
        x *= meta[:, 0:1]
        x += meta[:, 1:2]
        return x


CODECS: dict[str, Callable[[int], Codec]] = {  # name -> codec for a given dim
    "fp32": fp32_codec,
    "fp16": fp16_codec,
    "int8": Int8RowwiseCodec,
}


def get_codec(name: str, dim: int) -> Codec:
    """The codec called ``name`` for embedding width ``dim``."""
    try:
        make = CODECS[name]
    except KeyError:
        raise ValueError(f"unknown quantization {name!r}; known: {sorted(CODECS)}") from None
    return make(dim)


def codec_names() -> list[str]:
    return sorted(CODECS)

"""Record codecs of the embedding store: sizes, layouts, error bounds (no RocksDB needed)."""

import struct

import numpy as np
import pytest

from offgraph.store import get_codec
from offgraph.store.quant import codec_names

D = 16
EPS32 = 2.0**-24  # float32 unit roundoff


def sample(k=4000, dim=D, seed=0):
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal((k, dim)) * rng.choice([1e-4, 0.05, 1.0, 30.0], (k, 1))).astype(np.float32)
    w = (rng.standard_normal(k) * 0.05).astype(np.float32)
    v[0] = 0.25  # constant row
    v[1] = 0.0
    w[1] = 0.0  # all-zero row
    v[2] = -3.0
    w[2] = 7.0  # weight far outside the vector's range
    return v, w


def int8_bound(v, w):
    """Per-element bound of the row-wise int8 codec, from each row's own min/max over
    (vector, weight), derived in offgraph.store._quant: 0.5 * scale16 + float32 rounding,
    scale16 <= R / 255 * (1 + 2**-9) + 2**-24, R = (max - min) + max(|min| * 2**-9, 2**-24)."""
    x = np.concatenate([v, w[:, None]], axis=1).astype(np.float64)
    mn, mx = x.min(axis=1), x.max(axis=1)
    R = (mx - mn) + np.maximum(np.abs(mn) * 2.0**-9, 2.0**-24)
    scale16 = R / 255 * (1 + 2.0**-9) + 2.0**-24
    mag = np.maximum(np.abs(mn), np.abs(mx))
    return (0.5 * scale16 + 8 * EPS32 * (mag + R))[:, None]


def test_names_and_record_bytes():
    assert codec_names() == ["fp16", "fp32", "int8"]
    for dim in (1, 8, 16, 33):
        assert get_codec("fp32", dim).record_bytes == 4 * dim + 4
        assert get_codec("fp16", dim).record_bytes == 2 * dim + 2
        assert get_codec("int8", dim).record_bytes == dim + 5


def test_unknown_codec_and_bad_dim():
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        get_codec("int4", D)
    with pytest.raises(ValueError, match="dim"):
        get_codec("fp32", 0)


@pytest.mark.parametrize("name", ["fp32", "fp16", "int8"])
def test_shapes_and_dtypes(name):
    c = get_codec(name, D)
    v, w = sample(100)
    rec = c.encode(v, w)
    assert rec.dtype == np.uint8 and rec.shape == (100, c.record_bytes)
    dv, dw = c.decode(rec)
    assert dv.dtype == np.float32 and dv.shape == (100, D)
    assert dw.dtype == np.float32 and dw.shape == (100,)
    with pytest.raises(ValueError, match="shape"):
        c.encode(v[:, :-1], w)
    with pytest.raises(ValueError, match="first_order"):
        c.encode(v, w[:-1])
    with pytest.raises(ValueError, match="records"):
        c.decode(rec[:, :-1])


def test_fp32_exact_and_layout():
    c = get_codec("fp32", D)
    v, w = sample()
    v[3, 0] = np.finfo(np.float32).max
    v[3, 1] = np.finfo(np.float32).tiny
    rec = c.encode(v, w)
    dv, dw = c.decode(rec)
    assert np.array_equal(dv, v) and np.array_equal(dw, w)
    # documented layout: D little-endian float32 then w
    assert rec[5].tobytes() == struct.pack("<17f", *v[5].tolist(), float(w[5]))


def test_fp16_bound_and_layout():
    c = get_codec("fp16", D)
    v, w = sample()
    rec = c.encode(v, w)
    dv, dw = c.decode(rec)
    for x, y in ((v, dv), (w, dw)):
        x64 = x.astype(np.float64)
        # round to nearest fp16: relative 2**-11 (normal), absolute 2**-25 (subnormal)
        bound = np.maximum(np.abs(x64) * 2.0**-11, 2.0**-25)
        assert (np.abs(y - x64) <= bound).all()
    # the error is really that of a 16-bit float, not something finer
    big = np.abs(v) > 1e-3
    rel = np.abs(dv[big] - v[big]) / np.abs(v[big])
    assert rel.max() > 2.0**-13
    assert rec[4].tobytes() == struct.pack("<17e", *v[4].tolist(), float(w[4]))


def test_int8_within_bound_derived_from_row_range():
    c = get_codec("int8", D)
    v, w = sample()
    dv, dw = c.decode(c.encode(v, w))
    bound = int8_bound(v, w)
    assert (np.abs(dv - v) <= bound).all()
    assert (np.abs(dw - w) <= bound[:, 0]).all()
    assert np.isfinite(dv).all() and np.isfinite(dw).all()
    # and really 8-bit: typical errors are a sizeable fraction of the step
    rows = slice(3, None)
    step = (np.concatenate([v, w[:, None]], 1).max(1) - np.concatenate([v, w[:, None]], 1).min(1)) / 255
    frac = np.abs(dv[rows] - v[rows]) / step[rows, None]
    assert frac.max() > 0.4 and frac.mean() > 0.15


def test_int8_constant_rows_no_nan():
    c = get_codec("int8", D)
    v = np.full((3, D), 0.3, dtype=np.float32)
    w = np.full(3, 0.3, dtype=np.float32)
    v[1], w[1] = 0.0, 0.0
    v[2], w[2] = -1e-7, -1e-7
    dv, dw = c.decode(c.encode(v, w))
    assert np.isfinite(dv).all()
    assert np.abs(dv - v).max() <= 0.3 * 2**-10 and np.abs(dw - w).max() <= 0.3 * 2**-10
    assert (dv[1] == 0).all() and dw[1] == 0


def test_int8_layout_decoded_by_hand():
    c = get_codec("int8", D)
    v, w = sample(20)
    rec = c.encode(v, w)
    dv, dw = c.decode(rec)
    for i in (0, 5, 19):
        b = rec[i].tobytes()
        q = list(b[: D + 1])
        scale, offset = struct.unpack("<2e", b[D + 1 : D + 5])
        x = [qi * scale + offset for qi in q]
        np.testing.assert_allclose(dv[i], x[:D], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(dw[i], x[D], rtol=1e-6, atol=1e-7)
        assert min(q) == 0 or scale == 0  # offset is the row minimum (rounded down)


@pytest.mark.parametrize("name", ["fp32", "fp16", "int8"])
def test_vectorized_equals_row_by_row(name):
    c = get_codec(name, D)
    v, w = sample(50)
    whole = c.encode(v, w)
    rows = np.concatenate([c.encode(v[i : i + 1], w[i : i + 1]) for i in range(50)])
    assert np.array_equal(whole, rows)


@pytest.mark.parametrize("name", ["fp32", "fp16", "int8"])
def test_non_finite_rejected(name):
    c = get_codec(name, D)
    v, w = sample(10)
    v[4, 3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        c.encode(v, w)
    v[4, 3] = 0
    w[2] = np.inf
    with pytest.raises(ValueError, match="finite"):
        c.encode(v, w)


@pytest.mark.parametrize("name", ["fp16", "int8"])
def test_beyond_fp16_range_rejected(name):
    c = get_codec(name, D)
    v, w = sample(10)
    v[1, 1] = 70000.0
    with pytest.raises(ValueError, match="fp16 range"):
        c.encode(v, w)


@pytest.mark.parametrize("name", ["fp32", "fp16", "int8"])
def test_decode_rows_is_vector_then_weight(name):
    """The request path pools ``decode_rows``' [K, D+1]; it must hold exactly what ``decode`` gives apart."""
    c = get_codec(name, D)
    v, w = sample(64)
    if name == "fp16":
        v, w = np.clip(v, -60000, 60000), np.clip(w, -60000, 60000)
    rec = c.encode(v, w)
    rows = c.decode_rows(rec)
    dv, dw = c.decode(rec)
    assert rows.dtype == np.float32 and rows.shape == (64, D + 1)
    assert np.array_equal(rows[:, :D], dv) and np.array_equal(rows[:, D], dw)
    assert dv.flags.c_contiguous and dw.flags.c_contiguous
    rows[:] = -1  # a fresh array: writing it changes neither the records nor another decode
    assert np.array_equal(c.decode(rec)[0], dv)

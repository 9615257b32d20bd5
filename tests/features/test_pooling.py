import numpy as np
import pytest

from offgraph.features.pooling import pool_numpy


def manual_pool(values, offsets, mode):
    out = []
    for i in range(len(offsets) - 1):
        seg = values[offsets[i] : offsets[i + 1]]
        if len(seg) == 0:
            out.append(np.zeros(values.shape[1:], np.float32))
        else:
            out.append(seg.sum(0) / (len(seg) if mode == "mean" else 1))
    return np.stack(out)


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_pool_matches_manual_with_empty_rows(mode):
    rng = np.random.default_rng(0)
    offsets = np.array([0, 3, 3, 4, 8, 8])
    values = rng.normal(size=(8, 5)).astype(np.float32)
    np.testing.assert_allclose(pool_numpy(values, offsets, mode), manual_pool(values, offsets, mode), rtol=1e-6)
    w = rng.normal(size=8).astype(np.float32)
    got = pool_numpy(w, offsets, mode)
    assert got[1] == 0 and got[4] == 0
    np.testing.assert_allclose(got[0], w[:3].sum() / (3 if mode == "mean" else 1), rtol=1e-6)


def test_pool_all_empty_and_unknown_mode():
    assert pool_numpy(np.zeros((0, 4), np.float32), np.array([0, 0, 0]), "mean").shape == (2, 4)
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        pool_numpy(np.zeros((1, 4), np.float32), np.array([0, 1]), "max")

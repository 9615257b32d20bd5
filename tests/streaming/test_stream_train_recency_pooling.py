"""The stream trainer pools a recency field as training and serving do: each lookup's scale is its value's weight
2^(-k/H) normalised over the row (k places before the last value), hand-computed here for H = 1: 1/7, 2/7, 4/7."""

from __future__ import annotations

import numpy as np

from offgraph.features.fg import FGBatch, RaggedIds
from offgraph.streaming._stream_train import batch_index


def test_stream_training_scales_by_the_weights():
    hist = RaggedIds(np.array([7, 3, 9, 4], np.int64), np.array([0, 3, 3, 4]))
    user = RaggedIds(np.array([1, 2, 3], np.int64), np.array([0, 1, 2, 3]))
    idx = batch_index(FGBatch(3, (user, hist), (False, False)), ["mean", "recency"], [None, 1.0])
    np.testing.assert_allclose(idx.scale, [1, 1, 1, 1 / 7, 2 / 7, 4 / 7, 1], rtol=1e-7)

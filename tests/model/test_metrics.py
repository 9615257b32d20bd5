import numpy as np
import pytest

from offgraph.model.metrics import auc, logloss, make_metric_fn, ndcg_at_k, needs_groups


def rows():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, 40)
    p = rng.uniform(0.01, 0.99, 40)
    return y, p, rng.integers(0, 6, 40)


def test_metric_names():
    y, p, g = rows()
    assert make_metric_fn("auc")(y, p, None) == auc(y, p)
    assert make_metric_fn("logloss")(y, p, g) == logloss(y, p)
    assert make_metric_fn("ndcg@3")(y, p, g) == ndcg_at_k(y, p, g, 3)
    assert make_metric_fn("ndcg@3")(y, p, g) != make_metric_fn("ndcg@10")(y, p, g)
    assert [needs_groups(n) for n in ("auc", "logloss", "ndcg@10")] == [False, False, True]


@pytest.mark.parametrize("name", ["ndcg", "ndcg@0", "ndcg@x", "map@10", "AUC"])
def test_unknown_metric(name):
    with pytest.raises(ValueError, match="unknown metric"):
        make_metric_fn(name)


def test_ndcg_needs_groups():
    y, p, _ = rows()
    with pytest.raises(ValueError, match="request groups"):
        make_metric_fn("ndcg@10")(y, p, None)

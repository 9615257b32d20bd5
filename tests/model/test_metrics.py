"""Each metric against a value worked out by hand on tiny lists (the arithmetic in the comments)."""

import math

import numpy as np
import pytest

from offgraph.model.metrics import (
    auc,
    average_relevance_position,
    higher_is_better,
    logloss,
    make_metric_fn,
    mean_average_precision,
    mean_reciprocal_rank,
    ndcg_at_k,
    needs_groups,
)

INV_LOG2_3 = 1.0 / math.log2(3.0)


def lists():
    """Four lists:
    A: labels [2, 0, 1, 0], scores [0.9, 0.5, 0.5, 0.1]  graded; a tie at 0.5 between a 0 and a 1
    B: labels [1],          scores [0.3]                 one item
    C: labels [0, 0],       scores [0.2, 0.8]            gains of zero only: left out of every ranking metric
    D: labels [0, 1],       scores [0.7, 0.6]            binary, the relevant one second"""
    y = np.array([2, 0, 1, 0, 1, 0, 0, 0, 1], np.float32)
    s = np.array([0.9, 0.5, 0.5, 0.1, 0.3, 0.2, 0.8, 0.7, 0.6])
    g = np.array(["A"] * 4 + ["B"] + ["C"] * 2 + ["D"] * 2)
    return y, s, g


# Ranked by score, ties pessimistically (the less relevant first): A's labels in rank order [2, 0, 1, 0]
# (the 0 of the tie at rank 2, the 1 at rank 3); D's [0, 1].
# ndcg@10 (gains 2^g - 1, discount 1/log2(1 + rank)):
#   A: DCG = 3/1 + 0 + 1/log2(4) + 0 = 3.5; ideal [2, 1, 0, 0]: 3/1 + 1/log2(3); B: 1/1 = 1; D: (1/log2 3) / 1
NDCG10 = (3.5 / (3 + INV_LOG2_3) + 1.0 + INV_LOG2_3) / 3
# ndcg@1: A: 3/3 = 1; B: 1; D: 0 / 1 = 0
NDCG1 = (1.0 + 1.0 + 0.0) / 3
# ndcg@2: A: DCG = 3 + 0 = 3, ideal 3 + 1/log2 3; B: 1; D: (1/log2 3) / 1
NDCG2 = (3.0 / (3 + INV_LOG2_3) + 1.0 + INV_LOG2_3) / 3
# map (relevant: label > 0): A: relevant at ranks 1 and 3: (1/1 + 2/3) / 2 = 5/6; B: 1; D: at rank 2: (1/2) / 1
MAP = (5 / 6 + 1.0 + 0.5) / 3
# mrr: A: 1/1; B: 1/1; D: 1/2
MRR = (1.0 + 1.0 + 0.5) / 3
# arp (label-weighted mean rank): A: (2*1 + 1*3) / (2 + 1) = 5/3; B: 1; D: (1*2) / 1 = 2
ARP = (5 / 3 + 1.0 + 2.0) / 3
# auc (binarised, ties half): positives' scores .9 .5 .3 .6 (4), negatives' .5 .1 .2 .8 .7 (5);
#   pairs won: .9 beats all 5 -> 5; .5 beats .1 .2 and ties .5 -> 2.5; .3 beats .1 .2 -> 2; .6 beats .5 .1 .2 -> 3
AUC = (5 + 2.5 + 2 + 3) / 20


def test_each_metric_by_hand():
    y, s, g = lists()
    assert ndcg_at_k(y, s, g, 10) == pytest.approx(NDCG10)
    assert ndcg_at_k(y, s, g, 1) == pytest.approx(NDCG1)
    assert ndcg_at_k(y, s, g, 2) == pytest.approx(NDCG2)
    assert mean_average_precision(y, s, g) == pytest.approx(MAP)
    assert mean_reciprocal_rank(y, s, g) == pytest.approx(MRR)
    assert average_relevance_position(y, s, g) == pytest.approx(ARP)
    assert auc(y, s) == pytest.approx(AUC)
    # logloss of the binarised labels: label 2 counts as 1: -(ln 0.8 + ln 0.6) / 2
    assert logloss([2, 0], [0.8, 0.4]) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("ndcg@10", NDCG10), ("ndcg@1", NDCG1), ("ndcg@2", NDCG2), ("map", MAP), ("mrr", MRR), ("arp", ARP)],
)
def test_ranking_metrics_do_not_depend_on_row_order(name, expected):
    y, s, g = lists()
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(len(y))
        assert make_metric_fn(name)(y[perm], s[perm], g[perm]) == pytest.approx(expected)


def test_lists_without_a_relevant_item_give_nan():
    y, s, g = np.zeros(3), np.array([0.1, 0.2, 0.3]), np.array([0, 0, 1])
    for name in ("ndcg@10", "map", "mrr", "arp"):
        assert math.isnan(make_metric_fn(name)(y, s, g)), name
    assert math.isnan(auc(y, s))


def test_metric_names():
    y, s, g = lists()
    assert make_metric_fn("auc")(y, s, None) == auc(y, s)
    assert make_metric_fn("logloss")(y, s, g) == logloss(y, s)
    assert make_metric_fn("ndcg@3")(y, s, g) == ndcg_at_k(y, s, g, 3)
    assert make_metric_fn("map")(y, s, g) == mean_average_precision(y, s, g)
    names = ("auc", "logloss", "ndcg@10", "map", "mrr", "arp")
    assert [needs_groups(n) for n in names] == [False, False, True, True, True, True]
    assert [higher_is_better(n) for n in names] == [True, False, True, True, True, False]


@pytest.mark.parametrize("name", ["ndcg", "ndcg@0", "ndcg@x", "map@10", "AUC"])
def test_unknown_metric(name):
    with pytest.raises(ValueError, match="unknown metric"):
        make_metric_fn(name)


@pytest.mark.parametrize("name", ["ndcg@10", "map", "mrr", "arp"])
def test_ranking_metrics_need_groups(name):
    y, s, _ = lists()
    with pytest.raises(ValueError, match="request groups"):
        make_metric_fn(name)(y, s, None)

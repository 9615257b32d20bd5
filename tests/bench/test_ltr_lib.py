"""bench.ltr's shared lib: per-list metrics, bootstrap intervals, sampled lists, the generated data set."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bench.lib.ltr_data import generated_protocol, sample_lists, with_model
from bench.lib.ltr_stats import auc_ci, draws, mean_ci, paired_diff_ci, per_list
from offgraph.model.metrics import make_metric_fn

# two lists, rows interleaved: list "a" grades [2, 0, 1] scored [0.1, 0.9, 0.5]; list "b" grades [0, 0] (no
# relevant item); list "c" grades [1, 0] scored [0.7, 0.2]
GROUPS = np.array(["a", "b", "a", "c", "a", "b", "c"])
LABELS = np.array([2, 0, 0, 1, 1, 0, 0], float)
SCORES = np.array([0.1, 0.3, 0.9, 0.7, 0.5, 0.2, 0.2])


def test_per_list_values_by_hand():
    # list a ranked by score: grades 0, 1, 2: DCG@10 = 0 + 1/log2(3) + 3/log2(4), ideal 3 + 1/log2(3)
    dcg, ideal = 1 / math.log2(3) + 3 / 2, 3 + 1 / math.log2(3)
    v = per_list("ndcg@10", LABELS, SCORES, GROUPS)
    assert v[0] == pytest.approx(dcg / ideal) and math.isnan(v[1]) and v[2] == pytest.approx(1.0)
    # MRR: list a's first relevant at rank 2; list c's at rank 1
    v = per_list("mrr", LABELS, SCORES, GROUPS)
    assert v[0] == pytest.approx(0.5) and math.isnan(v[1]) and v[2] == 1.0
    # the mean of the finite ones is the package's value on all the lists
    for name in ("ndcg@1", "ndcg@5", "map", "mrr"):
        v = per_list(name, LABELS, SCORES, GROUPS)
        assert np.nanmean(v) == pytest.approx(make_metric_fn(name)(LABELS, SCORES, GROUPS)), name


def test_bootstrap_intervals():
    values = np.array([1.0, np.nan, 0.0, 0.5])
    w = draws(4, 500, seed=0)
    assert w.shape == (500, 4) and (w.sum(axis=1) == 4).all()
    ci = mean_ci(values, w)
    assert ci["value"] == pytest.approx(0.5) and ci["lists"] == 3 and 0.0 <= ci["lo"] < 0.5 < ci["hi"] <= 1.0
    same = paired_diff_ci(values, values, w)
    assert same == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
    # b beats a by 0.1 on every list: the paired interval is that exactly, whatever the spread between lists
    a = np.array([0.2, 0.9, 0.4, 0.6])
    d = paired_diff_ci(a + 0.1, a, w)
    assert d["diff"] == pytest.approx(0.1) and d["lo"] == pytest.approx(0.1) and d["hi"] == pytest.approx(0.1)


def test_auc_interval_resamples_whole_lists():
    ci = auc_ci(LABELS, SCORES, GROUPS, 50, seed=0)
    # positives 0.1, 0.7, 0.5 vs negatives 0.3, 0.9, 0.2, 0.2: of the 12 pairs, 0.7 and 0.5 each beat three
    # negatives, 0.1 none: 6 / 12
    assert ci["value"] == pytest.approx(6 / 12) and ci["lo"] <= ci["value"] <= ci["hi"]


def test_sampled_lists_are_distinct_rows_of_one_user():
    users = np.array([7] * 6 + [3] * 2 + [9] * 5)  # user 3 has too few rows for a list of 5
    rows, lists = sample_lists(users, per_user=4, size=5, rng=np.random.default_rng(0))
    assert len(rows) == 2 * 4 * 5 and len(np.unique(lists)) == 8
    for lst in np.unique(lists):
        r = rows[lists == lst]
        assert len(r) == 5 and len(set(r.tolist())) == 5 and len(set(users[r].tolist())) == 1
    assert 3 not in users[rows]
    user7 = {frozenset(rows[lists == lst].tolist()) for lst in np.unique(lists) if users[rows[lists == lst][0]] == 7}
    assert len(user7) > 1  # 6 choose 5: the draws differ


def test_generated_lists_offset_moves_clicks_not_order():
    p = generated_protocol(seed=0, n_lists=600, size=10, n_items=50)
    assert p.train.n == 480 * 10 and p.held.n == 120 * 10  # the last 20% of lists held out, whole
    assert set(np.unique(p.held.groups)).isdisjoint(np.unique(p.train.groups))
    again = generated_protocol(seed=0, n_lists=600, size=10, n_items=50)
    assert (again.train.labels == p.train.labels).all()  # seeded
    # the list-level offset: the click rate varies between lists far beyond a binomial's spread at one rate
    rates = np.bincount(np.unique(p.train.groups, return_inverse=True)[1], weights=p.train.labels) / 10
    mean = rates.mean()
    assert rates.var() > 3 * mean * (1 - mean) / 10


def test_generated_held_lists_come_after_the_training_lists():
    p = generated_protocol(seed=0, n_lists=480, size=10, n_items=50, held_lists=1000)
    assert p.train.n == 480 * 10 and p.held.n == 1000 * 10  # the training lists as with 600 and 20% held out
    assert p.fit.n == 384 * 10 and p.val.n == 96 * 10
    train_lists, held_lists = np.unique(p.train.groups), np.unique(p.held.groups)
    assert len(train_lists) == 480 and len(held_lists) == 1000 and train_lists.max() < held_lists.min()


def test_generated_validation_is_carved_from_the_training_lists():
    p = generated_protocol(seed=0, n_lists=600, size=10, n_items=50)
    # 480 training lists: the last 20% of them (96) validate, the other 384 fit; the held-out 120 are apart
    assert p.fit.n == 384 * 10 and p.val.n == 96 * 10
    fit_lists, val_lists = np.unique(p.fit.groups), np.unique(p.val.groups)
    assert fit_lists.max() < val_lists.min() and val_lists.max() < np.unique(p.held.groups).min()
    assert set(fit_lists) | set(val_lists) == set(np.unique(p.train.groups))
    # the items beside the rows, for the prior order on the validation lists: the validation rows' own
    assert len(p.fit_items) == p.fit.n and len(p.val_items) == p.val.n
    assert (np.sort(np.r_[p.fit_items, p.val_items]) == np.sort(p.train_items)).all()


def test_with_model_sets_learning_settings_only():
    p = generated_protocol(seed=0, n_lists=60, size=10, n_items=50)
    spec = with_model(p.spec, l2_embedding=1e-4, l2_dense=3e-5)
    assert spec.model.l2_embedding == 1e-4 and spec.model.l2_dense == 3e-5
    assert spec.model.embedding_dim == p.spec.model.embedding_dim == 8  # the generated spec's, kept
    assert [f.name for f in spec.fields] == [f.name for f in p.spec.fields]


def test_item_orders_and_click_threshold_by_hand():
    from bench.ltr import binary_at, item_orders

    # item 1 graded 4 and 2 in training, item 2 graded 0, item 3 never seen: the overall mean (6 / 3 = 2)
    o = item_orders(np.array([1, 1, 2]), np.array([4, 2, 0]), np.array([1, 2, 3]), seed=0)
    assert o["prior"].tolist() == [3.0, 0.0, 2.0] and o["popularity"].tolist() == [2.0, 1.0, 0.0]
    p = generated_protocol(seed=0, n_lists=60, size=10, n_items=50)
    graded = replace(p.fit, labels=np.array([0, 1, 2, 3, 4] * (p.fit.n // 5), np.float32))
    assert binary_at(graded, 3).labels[:5].tolist() == [0, 0, 0, 1, 1]


def test_train_arm_picks_the_best_validation_epoch_then_refits():
    from types import SimpleNamespace

    from bench.ltr import Setting, train_arm

    p = generated_protocol(seed=0, n_lists=200, size=10, n_items=30)
    args = SimpleNamespace(batch_size=256, patience=5, max_list_size=100)
    trainer, info = train_arm(p, "pairwise", 0, Setting(0.01, 1e-6, 1e-6, epochs=3, mlp=()), args)
    # patience 5 > 3 epochs: every epoch runs, and the kept one is the curve's best (NDCG: higher is better)
    assert info["epochs_run"] == 3 and len(info["validation_curve"]) == 3 and info["select"] == "ndcg@10"
    assert info["validation"] == max(info["validation_curve"])
    assert info["validation_curve"][info["best_epoch"] - 1] == info["validation"]
    assert info["setting"]["mlp"] == () and trainer.model.head.hidden == []  # the FM alone: no hidden layer
    assert trainer.predict(p.held).shape == (p.held.n,)

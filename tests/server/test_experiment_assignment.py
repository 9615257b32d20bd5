"""Experiment assignment (``offgraph.server.models.experiment``), without a server: the hash, the shares of
10,000 users, the layout a weight change keeps, the record's round trip and the refusals of bad arms."""

import json

import numpy as np
import pytest
import xxhash

from offgraph.server.models.experiment import (
    Arm,
    Experiment,
    Experiments,
    check_arms,
    layout,
    prior_scores,
    unit,
)

USERS = [f"u{i}" for i in range(10_000)]


def _arms(*weights: float) -> list[Arm]:
    """Arms A (version 1), B (label canary), C (prior) with these weights."""
    kinds = [("version", 1), ("label", "canary"), ("prior", None)]
    return [Arm(k, r, w) for (k, r), w in zip(kinds, weights, strict=True)]


def _assign(exp: Experiment, users=USERS) -> np.ndarray:
    return np.array([exp.assign({"user_id": u})[0].name for u in users])


def test_the_point_of_a_key_is_the_top_53_bits_of_xxhash64_of_salt_and_key():
    raw = xxhash.xxh64_intdigest(b"s1\x1fu42")
    assert unit("s1", "u42") == (raw >> 11) / 2.0**53
    assert 0.0 <= unit("s1", "u42") < 1.0
    assert unit("s2", "u42") != unit("s1", "u42")


def test_a_fresh_layout_follows_the_arms_in_order():
    a, b, c = layout(_arms(0.8, 0.1, 0.1), None)
    assert a.ranges == ((0.0, 0.8),) and b.ranges == ((0.8, pytest.approx(0.9)),) and c.ranges[0][1] == 1.0


def test_shares_of_10000_users_are_within_1_5_points_of_the_weights():
    exp = Experiment(layout(_arms(0.8, 0.1, 0.1), None), "user_id", "salt-1", 1)
    got = _assign(exp)
    shares = {name: float(np.mean(got == name)) for name in ("v1", "canary", "prior")}
    assert abs(shares["v1"] - 0.8) <= 0.015 and abs(shares["canary"] - 0.1) <= 0.015, shares
    assert abs(shares["prior"] - 0.1) <= 0.015, shares
    # each user's arm is the one whose range holds its point: [0, .8) v1, [.8, .9) canary, [.9, 1) prior
    points = np.array([unit("salt-1", u) for u in USERS])
    expected = np.where(points < 0.8, "v1", np.where(points < 0.9, "canary", "prior"))
    np.testing.assert_array_equal(got, expected)


def test_raising_one_arm_moves_users_only_from_the_arm_that_falls():
    before = Experiment(layout(_arms(0.8, 0.1, 0.1), None), "user_id", "s", 1)
    after = Experiment(layout(_arms(0.7, 0.1, 0.2), before.arms), "user_id", "s", 2)
    a, b, c = after.arms
    # the first arm gives up the top of its range, [.7, .8), to the third; the second arm stays put
    assert a.ranges == ((0.0, pytest.approx(0.7)),)
    assert b.ranges == before.arms[1].ranges
    assert [r for r in c.ranges] == [(pytest.approx(0.7), 0.8), (before.arms[2].ranges[0][0], 1.0)]
    old, new = _assign(before), _assign(after)
    moved = old != new
    assert set(zip(old[moved], new[moved], strict=True)) == {("v1", "prior")}
    assert abs(moved.mean() - 0.1) <= 0.015
    assert np.all(new[old == "canary"] == "canary") and np.all(new[old == "prior"] == "prior")
    # a naive cumulative split of 0.7/0.1/0.2 would have moved canary users: [.8, .9) became prior there
    naive = Experiment(layout(_arms(0.7, 0.1, 0.2), None), "user_id", "s", 3)
    assert np.any(_assign(naive)[old == "canary"] != "canary")


def test_dropping_and_adding_arms_keeps_the_others():
    before = Experiment(layout(_arms(0.5, 0.25, 0.25), None), "user_id", "s", 1)
    arms = [Arm("version", 1, 0.5), Arm("prior", None, 0.25), Arm("label", "stable", 0.25)]
    after = Experiment(layout(arms, before.arms), "user_id", "s", 2)
    old, new = _assign(before), _assign(after)
    assert np.all(new[old == "v1"] == "v1") and np.all(new[old == "prior"] == "prior")
    assert set(new[old == "canary"]) == {"stable"}  # the canary's range went to the new arm, whole


def test_without_the_sticky_key_the_first_arm_serves_and_numbers_hash_as_their_text():
    exp = Experiment(layout(_arms(0.2, 0.4, 0.4), None), "user_id", "s", 1)
    for request in ({}, {"user_id": None}, {"user_id": ""}, {"user_id": []}, {"age": 3}):
        assert exp.assign(request) == (exp.arms[0], False)
    assert exp.assign({"user_id": 196}) == exp.assign({"user_id": "196"})
    assert exp.assign({"user_id": 196})[1] is True


def test_prior_scores_order_the_candidates_as_sent():
    np.testing.assert_array_equal(prior_scores(4), [1.0, 0.75, 0.5, 0.25])


@pytest.mark.parametrize(
    "arms, words",
    [
        ([], "1 to 6 arms"),
        ([Arm("prior", None, 1 / 7)] * 7, "1 to 6 arms"),
        ([Arm("version", 1, 0.5), Arm("version", 1, 0.5)], "'v1' is given twice"),
        ([Arm("version", 1, 0.5), Arm("prior", None, 0.4)], "sum to 1"),
    ],
)
def test_bad_arms_are_refused_naming_the_problem(arms, words):
    with pytest.raises(ValueError, match=words):
        check_arms(arms)


def test_the_record_round_trips_and_a_put_with_the_same_salt_keeps_the_layout(tmp_path):
    (tmp_path / "ml").mkdir()
    book = Experiments(tmp_path)
    assert book.get("ml") is None
    first = book.put("ml", _arms(0.8, 0.1, 0.1), "user_id", "s")
    saved = json.loads((tmp_path / "ml" / "experiment.json").read_text())
    assert saved["salt"] == "s" and [a["weight"] for a in saved["arms"]] == [0.8, 0.1, 0.1]
    again = Experiments(tmp_path).get("ml")  # another worker, or a restarted server
    assert again is not None and [a.ranges for a in again.arms] == [a.ranges for a in first.arms]
    second = book.put("ml", _arms(0.7, 0.1, 0.2), "user_id", None)  # salt omitted: the current one
    assert second.salt == "s" and second.arms[1].ranges == first.arms[1].ranges
    assert Experiments(tmp_path).get("ml").arms[2].ranges == second.arms[2].ranges
    assert book.delete("ml") is not None and book.get("ml") is None and book.delete("ml") is None

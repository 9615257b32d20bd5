import math

import numpy as np
import pytest

from offgraph.features.ops import (
    FeatureValueError,
    log_bucket_index,
    op_bucketize,
    op_cross,
    op_id,
    op_log_bucket,
    op_match_count,
    op_tokenize,
)


def test_id_scalar_list_separator_and_missing():
    assert op_id("f", [5, "a", None, float("nan"), "", [1, None, "x"], []], {}) == [
        ["5"],
        ["a"],
        [],
        [],
        [],
        ["1", "x"],
        [],
    ]
    assert op_id("f", ["a|b||c"], {"separator": "|"}) == [["a", "b", "c"]]


def test_id_rejects_objects():
    with pytest.raises(FeatureValueError, match="field 'f', row 1"):
        op_id("f", [1, {"a": 1}], {})


def test_tokenize():
    assert op_tokenize("q", ["Red  Shoes", None, ["A b", "C"]], {"lowercase": True}) == [
        ["red", "shoes"],
        [],
        ["a", "b", "c"],
    ]
    assert op_tokenize("q", ["a,B,,c"], {"separator": ",", "lowercase": False}) == [["a", "B", "c"]]


def test_bucketize():
    b = {"boundaries": [0.001, 0.01, 0.05]}
    vals = [0.0, 0.001, 0.005, 0.01, 0.2, None, "0.03"]
    # bucket i: boundaries[i-1] <= x < boundaries[i]
    assert op_bucketize("c", vals, b) == [["0"], ["1"], ["1"], ["2"], ["3"], [], ["2"]]


def test_bucketize_rejects_text():
    with pytest.raises(FeatureValueError, match="field 'c', row 1: expected a number"):
        op_bucketize("c", [1, "abc"], {"boundaries": [1.0]})


@pytest.mark.parametrize("value", ["inf", "-Infinity", "1e999", float("inf"), -np.inf])
def test_numbers_must_be_finite(value):
    """Text can spell an infinity that JSON cannot; it is refused, not put in the last bucket."""
    with pytest.raises(FeatureValueError, match="field 'c', row 1: expected a finite number"):
        op_bucketize("c", [1, value], {"boundaries": [1.0]})
    with pytest.raises(FeatureValueError, match="expected a finite number"):
        op_log_bucket("c", [1, value], {"base": 2})
    # "nan" (like NaN) is no value, as documented
    assert op_bucketize("c", [1, "nan"], {"boundaries": [1.0]}) == [["1"], []]


def test_log_bucket():
    vals = [299, 1, 1.5, 2, 0.5, 0, -3, 1000, None]
    out = op_log_bucket("p", vals, {"base": 2.0})
    expect = [
        [str(math.floor(math.log2(299)))],
        ["0"],
        ["0"],
        ["1"],
        ["-1"],
        ["-1"],
        ["-2"],
        [str(math.floor(math.log2(1000)))],
        [],
    ]
    assert out == expect
    assert out[0] == ["8"]
    # exact powers are not lost to float error
    assert list(log_bucket_index(np.array([1000.0, 100.0, 10.0]), 10.0)) == [3, 2, 1]


def test_cross_cartesian_and_cap():
    a = [["M"], ["F"], [], ["M"]]
    b = [["x", "y"], ["z"], ["x"], []]
    assert op_cross("c", [a, b], {"separator": "_", "max_values": 64}) == [["M_x", "M_y"], ["F_z"], [], []]
    many = op_cross("c", [[["1", "2", "3"]], [["a", "b", "c"]]], {"separator": "#", "max_values": 4})
    assert many == [["1#a", "1#b", "1#c", "2#a"]]


def test_match_count():
    q = [["red", "shoes"], ["red"], [], ["a", "a"]]
    t = [["red", "shoes", "nike"], ["blue"], ["x"], ["a"]]
    assert op_match_count("m", [q, t], {}) == [["2"], ["0"], ["0"], ["1"]]
    assert op_match_count("m", [q, t], {"boundaries": [1.0, 2.0, 3.0]}) == [["2"], ["0"], ["0"], ["1"]]
    assert op_match_count("m", [[["a", "b", "c", "d"]], [["a", "b", "c", "d"]]], {"boundaries": [1.0, 2.0]}) == [["2"]]

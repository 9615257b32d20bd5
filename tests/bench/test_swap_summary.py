"""bench.lib.swap.summarize on a made-up trace whose figures are known by construction."""

from bench.lib.swap import summarize


def _trace():
    rows = []
    for i in range(300):  # 0..30 s, 10 requests a second, 10 ms each: steady traffic
        rows.append((i / 10, 0.010, 200, 1, None))
    rows[105] = (10.5, 0.050, 200, 1, None)  # one steady-phase bin (10 s) at 5x
    rows[205] = (20.5, 0.030, 200, 2, None)  # one bin after v2 appears (20 s) at 3x
    rows[250] = (25.0, 0.001, -1, -1, "ConnectionResetError()")  # a failed request: never in a bin
    return rows


def test_bins_against_the_steady_p99_and_their_steady_baseline():
    ev = {
        "steady_from": 5.0,
        "v2_appears": 15.0,
        "v2_serving": 18.0,
        "rollback_called": 22.0,
        "rollback_answered": 26.0,
        "v1_serving": 26.0,
        "end": 30.0,
    }
    s = summarize({"trace": _trace(), "pss": [(1.0, 100 << 20, 0.01), (16.0, 300 << 20, 0.01)], "events": ev})
    assert s["failed_requests"] == 1 and s["requests"] == 300
    # steady phase 5..15 s: 99 requests of 10 ms and one of 50 ms; p99 by linear interpolation
    assert abs(s["steady_p99_ms"] - (10 + 0.01 * 40)) < 1e-6
    steady = s["steady_p99_ms"]
    # the bin at 10 s holds 9 x 10 ms + 50 ms: its p99 is 10 + 0.91 * 40 ms
    assert abs(s["steady_max_bin_p99_over_steady"] - (10 + 0.91 * 40) / steady) < 1e-6
    assert abs(s["max_bin_p99_over_steady"] - (10 + 0.91 * 20) / steady) < 1e-6
    # 28.2 ms against 2 x 10.4: over; every other bin is at 10 ms
    assert s["bins_over_2x_steady"] == {"steady": [1, 10], "after_v2_appears": [1, 15]}
    assert s["pss_peak_mb"] == 300 and s["v2_appears_to_serving_s"] == 3.0


def test_faults_are_counted_per_bin_and_split_by_slow_and_other_bins():
    ev = {
        "steady_from": 5.0,
        "v2_appears": 15.0,
        "v2_serving": 18.0,
        "rollback_called": 22.0,
        "rollback_answered": 26.0,
        "v1_serving": 26.0,
        "end": 30.0,
    }
    # cumulative counters sampled every 0.5 s: one major fault a second, plus 40 at 20.5 s (the slow bin);
    # 3 page-cache refaults a second throughout
    faults = [(k / 2, k / 2 + (40 if k / 2 >= 20.5 else 0), 3 * k / 2) for k in range(61)]
    s = summarize({"trace": _trace(), "pss": [(1.0, 100 << 20, 0.01)], "faults": faults, "events": ev})
    slow = s["faults_in_bins_over_2x"]
    assert slow == {
        "bins": 1,
        "major_faults": 41.0,
        "major_faults_per_bin": 41.0,
        "page_cache_refaults": 3.0,
        "page_cache_refaults_per_bin": 3.0,
    }
    other = s["faults_in_other_bins_after_v2_appears"]
    assert other["bins"] == 14 and other["major_faults"] == 14.0 and other["page_cache_refaults_per_bin"] == 3.0
    assert next(b for b in s["bins"] if b["t"] == 20)["major_faults"] == 41.0
    # a run recorded without fault samples: nothing made up
    old = summarize({"trace": _trace(), "pss": [(1.0, 100 << 20, 0.01)], "events": ev})
    assert old["faults_in_bins_over_2x"]["major_faults"] is None and old["bins"][0]["major_faults"] is None


def test_the_window_p99_takes_every_request_from_v2_appearing_to_15_s_after_it_serves():
    rows = [(i / 10, 0.010, 200, 1 if i < 220 else 2, None) for i in range(400)]  # 0..40 s at 10 ms
    rows[250] = (25.0, 0.200, 200, 2, None)
    rows[251] = (25.1, 0.200, 200, 2, None)
    rows[300] = (30.0, 0.500, -1, -1, "TimeoutError()")  # failed, in the window: its 500 ms count
    rows[380] = (38.0, 1.000, 200, 2, None)  # after the window (22 + 15 s): not in it
    ev = {
        "steady_from": 5.0,
        "v2_appears": 20.0,
        "v2_serving": 22.0,
        "rollback_called": 37.0,
        "rollback_answered": 37.1,
        "v1_serving": 37.5,
        "end": 40.0,
    }
    s = summarize({"trace": rows, "pss": [(1.0, 100 << 20, 0.01)], "events": ev})
    # [20, 37) s: 170 requests, sorted 167 x 10 ms, 200, 200, 500: the p99 (rank 0.99 x 169 = 167.31) is 200 ms
    # (without the failed one it would be 70.8 ms, with the one at 38 s 290 ms)
    assert s["window_requests"] == 170 and abs(s["window_p99_ms"] - 200.0) < 1e-9
    assert s["steady_requests"] == 150 and s["steady_s"] == 15.0 and abs(s["steady_p99_ms"] - 10.0) < 1e-9
    assert abs(s["window_p99_over_steady"] - 20.0) < 1e-9
    assert (
        summarize({"trace": rows, "pss": [(1.0, 100 << 20, 0.01)], "events": ev}, window_s=3.0)["window_requests"] == 50
    )  # [20, 25): the slow ones at 25 s are just outside

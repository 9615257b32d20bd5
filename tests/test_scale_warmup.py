"""bench.scale_warmup.stop_reason: when the scale bench's warm-up of a server stops."""
import pytest

from bench.scale_warmup import FLOOR_KIB, stop_reason


def test_a_server_that_reads_nothing_from_disk_is_warm_after_its_first_round():
    assert stop_reason([0.0], 1.0, 180, 0.05) == "no disk reads"
    assert stop_reason([FLOOR_KIB * 0.9], 1.0, 180, 0.05) == "no disk reads"


def test_it_goes_on_while_each_round_reads_clearly_less_than_the_one_before():
    # a cold 10^9 server: 2.8 MB a request in its first round, then less as the page cache fills
    kib = [2799.0, 1699.0, 1389.0, 1173.0]
    for k in range(1, len(kib) + 1):
        assert stop_reason(kib[:k], 10.0 * k, 180, 0.05) is None
    assert stop_reason(kib + [1150.0], 50.0, 180, 0.05) == "leveled"  # 2% less than the round before
    assert stop_reason(kib + [1200.0], 50.0, 180, 0.05) == "leveled"  # more: nothing left to gain


def test_it_stops_at_the_time_limit_while_still_improving():
    assert stop_reason([2799.0, 1699.0], 181.0, 180, 0.05) == "time"
    assert stop_reason([], 0.0, 180, 0.05) is None


@pytest.mark.parametrize("run, want", [
    ({"warmup": {"seconds": 95.4, "stopped": "leveled", "rounds": [{"disk_kib_per_request": 2799.2},
                                                                     {"disk_kib_per_request": 660.0}]}},
     "95 s (2799 -> 660)"),
    ({}, "?"),  # a report written before the warm-up was recorded
])
def test_the_report_gives_the_warmup_time_and_its_first_and_last_disk_reads(run, want):
    from bench.scale import _warm
    assert _warm(run) == want

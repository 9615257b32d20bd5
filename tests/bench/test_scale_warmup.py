"""bench.lib.warmup.stop_reason: when the scale bench's warm-up of a server stops."""

import pytest

from bench.lib.warmup import FLOOR_KIB, stop_reason


def test_a_server_that_reads_nothing_from_disk_is_warm_after_its_first_round():
    assert stop_reason([0.0], 1.0, 420, 0.10) == "no disk reads"
    assert stop_reason([FLOOR_KIB * 0.9], 1.0, 420, 0.10) == "no disk reads"


def test_it_goes_on_while_the_rounds_read_clearly_less_than_three_rounds_before():
    # the first 10^9 server of a full run: 3.3 MB a request in its first round, then less as the
    # page cache filled, 8% a round on average, 3.5% in its last round
    kib = [3332.1, 1768.6, 1215.3, 975.3, 811.7, 704.6, 628.2, 565.6, 511.7, 461.3, 435.0, 403.7, 389.7]
    for k in range(1, len(kib) + 1):
        assert stop_reason(kib[:k], 10.0 * k, 420, 0.10) is None, k
    assert stop_reason(kib + [380.0, 372.0, 365.0], 160.0, 420, 0.10) == "leveled"  # 6% in 3 rounds
    assert stop_reason([3332.1, 1768.6, 1700.0], 30.0, 420, 0.10) is None  # a flat pair is not enough
    assert stop_reason([3332.1, 1768.6, 1700.0, 1750.0, 1800.0], 50.0, 420, 0.10) == "leveled"  # more: no gain


def test_it_stops_at_the_time_limit_while_still_improving():
    assert stop_reason([2799.0, 1699.0], 421.0, 420, 0.10) == "time"
    assert stop_reason([], 0.0, 420, 0.10) is None


@pytest.mark.parametrize(
    "run, want",
    [
        (
            {
                "warmup": {
                    "seconds": 95.4,
                    "stopped": "leveled",
                    "rounds": [{"disk_kib_per_request": 2799.2}, {"disk_kib_per_request": 660.0}],
                }
            },
            "95 s (2799 -> 660)",
        ),
        ({}, "?"),  # a report written before the warm-up was recorded
    ],
)
def test_the_report_gives_the_warmup_time_and_its_first_and_last_disk_reads(run, want):
    from bench.lib.scale_report import warm_text

    assert warm_text(run) == want

"""bench.scale: the disk a run needs at its peak (versions already on disk reused), and its report."""

from bench.scale import DISK_MARGIN, disk_plan
from offgraph.export.synth_config import SynthConfig


def _gb(n: int) -> int:
    return SynthConfig(rows=n).disk_bytes()


def test_the_peak_is_the_kept_versions_plus_the_biggest_alive_at_a_time():
    # 10^7 is kept; the swap's two 2x10^8 versions and the 10^9 version are deleted after use
    want = (_gb(10**7) + max(2 * _gb(2 * 10**8), _gb(10**9))) * DISK_MARGIN
    assert disk_plan([10**7, 10**9], 2 * 10**8, False, 10**8) == int(want)
    assert disk_plan([10**7, 10**9], 2 * 10**8, True, 10**8) == int(
        (_gb(10**7) + _gb(10**9) + 2 * _gb(2 * 10**8)) * DISK_MARGIN
    )


def test_a_version_already_on_disk_needs_no_new_space():
    got = disk_plan([10**7, 10**9], 2 * 10**8, False, 10**8, present=frozenset({10**9}))
    assert got == int((_gb(10**7) + 2 * _gb(2 * 10**8)) * DISK_MARGIN)


def test_the_report_shows_disk_reads_per_request_and_marks_older_runs_unknown():
    from bench.lib.scale_report import from_disk

    assert from_disk({"c1_disk_kib_per_request": 12.3, "c8_disk_kib_per_request": 45.6}) == "12 / 46"
    assert from_disk({"c1": {}, "c8": {}}) == "?"  # a report written before the bench read /proc/PID/io

"""bench.lib.disk: O_DIRECT cold reads, and the page cache left as it was."""

import os

import numpy as np
import pytest
from page_cache_files import cold_file, resident_bytes

from bench.lib.disk import cold_reads, describe, settle


def test_cold_reads_measure_without_touching_the_page_cache(tmp_path):
    path = cold_file(tmp_path / "x.sst", 8)
    got = cold_reads([path], seconds=0.3)
    if got is None:
        pytest.skip(f"{tmp_path}'s filesystem does not support O_DIRECT reads")
    assert got["reads"] > 10
    assert 0 < got["p50_ms"] <= got["p99_ms"] <= got["p999_ms"] <= got["max_ms"]
    assert resident_bytes(path) < (1 << 20)  # O_DIRECT: nothing read into the cache
    assert "cold 16-KiB reads" in describe(got) and describe(None) == "disk probe: n/a"


def test_small_or_no_files_give_none(tmp_path):
    tiny = tmp_path / "t.sst"
    tiny.write_bytes(np.zeros(1000, np.uint8).tobytes())
    assert cold_reads([tiny], seconds=0.1) is None
    assert cold_reads([], seconds=0.1) is None
    assert os.path.exists(tiny)


class _Disk:
    """Scripted probe results (p99.9 in ms, in order) and a fake clock that each probe and pause advances."""

    def __init__(self, p999s):
        self.p999s, self.now, self.calls = list(p999s), 0.0, 0

    def probe(self, files, seconds):
        self.calls += 1
        self.now += seconds
        return {"p999_ms": self.p999s.pop(0)} if self.p999s else None

    def sleep(self, s):
        self.now += s

    def clock(self):
        return self.now


def test_settle_waits_until_the_tail_is_under_the_limit():
    d = _Disk([112, 60, 43, 12, 5])
    got = settle([], 20, 900, probe_s=5, pause_s=25, probe=d.probe, sleep=d.sleep, clock=d.clock)
    assert got["settled"] is True and d.calls == 4 and [p["p999_ms"] for p in got["probes"]] == [112, 60, 43, 12]
    assert got["waited_s"] == 4 * 5 + 3 * 25


def test_settle_gives_up_at_its_time_limit_and_says_so():
    d = _Disk([100] * 50)
    got = settle([], 20, 120, probe_s=5, pause_s=25, probe=d.probe, sleep=d.sleep, clock=d.clock)
    assert got["settled"] is False and got["waited_s"] <= 120 and d.calls == 4  # 5+30+30+30 s; a 5th would end at 125
    assert settle([], 20, 120, probe=_Disk([]).probe)["settled"] is None  # nothing to probe: no wait

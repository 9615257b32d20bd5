"""bench.disk_probe: O_DIRECT cold reads, and the page cache left as it was."""

import os

import numpy as np
import pytest

from bench.disk_probe import cold_reads, describe
from test_prefetch import cold_file, resident_bytes


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

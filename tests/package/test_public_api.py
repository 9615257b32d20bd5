"""The library's front door: ``import offgraph`` loads nothing heavy, and ``offgraph.load(path).score(...)``
scores as the scorer of the version it resolves to does."""

from __future__ import annotations

import subprocess
import sys

import numpy as np


def test_importing_offgraph_loads_no_heavy_module():
    code = (
        "import sys, offgraph\n"
        "heavy = sorted(m for m in ('tensorflow', 'numpy', 'pyarrow', 'rocksdict', 'fastapi') if m in sys.modules)\n"
        "print(offgraph.__version__, heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    version, heavy = r.stdout.split(" ", 1)
    assert version and version != "0+unknown"  # the installed distribution's version
    assert heavy.strip() == "[]"


def test_load_scores_as_the_newest_versions_scorer(tiny_model, requests_):
    import offgraph
    from offgraph.scoring.scorer import Scorer

    models, _ = tiny_model
    request, candidates = requests_[0]
    with offgraph.load(models / "ml") as by_model, Scorer(models / "ml" / "1") as by_version:
        assert by_model.version_dir == models / "ml" / "1"  # the newest complete version
        got = by_model.score(request, candidates)
        assert got.dtype == np.float32 and got.shape == (len(candidates),)
        np.testing.assert_array_equal(got, by_version.score(request, candidates))

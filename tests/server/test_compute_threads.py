"""NumPy's BLAS threads of a serving process (offgraph.server.process.compute_threads): set at run time through
threadpoolctl (whatever OpenBLAS read from the environment when it loaded), and read back by the scorer's choice of
the NumPy dense head for every candidate count (offgraph.scoring.numpy_head). Each case runs in a fresh interpreter:
the limit holds for the rest of a process."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PROBE = """
import json, sys
import numpy as np
from threadpoolctl import threadpool_info
from offgraph.scoring.numpy_head import NUMPY_HEAD_MAX_ROWS, SINGLE_THREAD_MAX_ROWS, default_max_rows
from offgraph.server.process.compute_threads import configure_blas_threads
want = None if sys.argv[1] == "none" else int(sys.argv[1])
got = configure_blas_threads(want)
seen = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(json.dumps({"got": got, "seen": seen, "rows": default_max_rows(),
                  "numpy": NUMPY_HEAD_MAX_ROWS, "single": SINGLE_THREAD_MAX_ROWS}))
"""


def _probe(arg: str, env_threads: str) -> dict:
    env = {"OPENBLAS_NUM_THREADS": env_threads, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PROBE, arg], env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_blas_thread_is_set_at_run_time_and_the_numpy_head_then_serves_every_count():
    r = _probe("1", "2")  # OpenBLAS loaded with 2 threads; the server's default, 1, is set afterwards
    assert r["got"] == 1 and r["seen"] == [1]
    assert r["rows"] == r["single"] > r["numpy"]


def test_leaving_the_threads_keeps_what_openblas_loaded_with():
    r = _probe("none", "2")
    assert r["got"] == 2 and r["seen"] == [2] and r["rows"] == r["numpy"]
    r = _probe("none", "1")
    assert r["got"] == 1 and r["rows"] == r["single"]
    r = _probe("2", "1")  # more than one asked for: the head keeps to its small counts
    assert r["got"] == 2 and r["rows"] == r["numpy"]

"""``--cpus`` (serve, update): CPU lists are parsed, checked against what the process may use, and applied."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _in_child(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python (pinning must not touch the test process)."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_cpu_list_pins_the_process_and_its_threads():
    cpu = min(os.sched_getaffinity(0))
    r = _in_child(
        f"import os, threading; from offgraph.runtime import pin_cpus; pin_cpus('{cpu}'); "
        "out = []; t = threading.Thread(target=lambda: out.append(os.sched_getaffinity(0))); t.start(); "
        "t.join(); print(sorted(os.sched_getaffinity(0)), sorted(out[0]))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"[{cpu}]", f"[{cpu}]"]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("x", "expected a list like"),
        ("1-", "expected a list like"),
        ("4096", "are not available"),
        ("", "expected a list like"),
        ("3-1", "expected a list like"),
    ],
)
def test_bad_cpu_lists_are_clear_errors(spec, words):
    r = _in_child(f"from offgraph.runtime import pin_cpus; pin_cpus({spec!r})")
    assert r.returncode != 0 and words in r.stderr, r.stderr[-500:]


def test_serve_refuses_cpus_it_cannot_use(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "offgraph.cli", "serve", "--models", str(tmp_path), "--cpus", "4096"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "offgraph serve: error: --cpus '4096'" in r.stderr, r.stderr[-500:]

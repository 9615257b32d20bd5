"""tests/tiers.py: which tests `make test-fast` (pytest -m "not slow") leaves out, on a sample test suite
collected by a real pytest in a child process."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = """
import pytest
from tiers import pytest_collection_modifyitems  # noqa: F401

@pytest.fixture
def small_run():
    return None
"""

SAMPLE = """
import subprocess
import sys

import pytest


def _child():
    return subprocess.run([sys.executable, "-c", "pass"])


def _two_calls_deep():
    return _child()


@pytest.fixture
def trained():
    from offgraph.model.train import train_run
    return train_run


@pytest.fixture
def uses_trained(trained):
    return trained


def test_plain():
    assert sum([1, 2]) == 3


def test_mentions_subprocess_only_in_a_comment():
    # subprocess, train_run, Popen: words, not calls
    assert "Popen" != "train_run"


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"])


def test_through_a_helper():
    _two_calls_deep()


def test_fixture_trains(uses_trained):
    pass


def test_conftest_training_fixture(small_run):
    pass


@pytest.mark.slow
def test_marked():
    pass


@pytest.mark.parametrize("x", [1, 2])
def test_parametrized_plain(x):
    assert x


def test_in_a_lambda():
    f = lambda: subprocess.Popen  # noqa: E731
    assert f
"""


def _collected(root: Path, marker_expr: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker_expr,
            "test_sample.py",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode in (0, 5), r.stdout[-2000:] + r.stderr[-2000:]
    return {ln.split("::", 1)[1] for ln in r.stdout.splitlines() if "::" in ln}


def test_slow_tests_are_found_without_markers(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    fast = {
        "test_plain",
        "test_mentions_subprocess_only_in_a_comment",
        "test_parametrized_plain[1]",
        "test_parametrized_plain[2]",
    }
    slow = {
        "test_starts_a_process",
        "test_through_a_helper",
        "test_fixture_trains",
        "test_conftest_training_fixture",
        "test_marked",
        "test_in_a_lambda",
    }
    assert _collected(tmp_path, "not slow") == fast
    assert _collected(tmp_path, "slow") == slow

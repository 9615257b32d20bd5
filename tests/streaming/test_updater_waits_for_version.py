"""`offgraph update` started before its model has a complete version (in a Kubernetes pod the server beside
it is still copying the version down from object storage): it waits, saying so once in its log and on
/metrics, and starts applying once a version is complete; SIGTERM while it waits exits 0; ``--once`` still
refuses a model without a version. Real processes, a real exported model, a real spool."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from polling import wait_for

from offgraph.streaming.deltas import publish_delta
from offgraph.streaming.stop_watchdog import STOP_GRACE_S
from offgraph.testing.harness import free_port, wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
WAITING = "offgraph_update_waiting_for_version"


def _update(models: Path, spool: Path, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """``offgraph update`` of MODELS/ml as a process; its output lines gathered as they come."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-m", "offgraph.cli", "update", "--models", str(models), "--model", "ml"]
    proc = subprocess.Popen(
        [*cmd, "--source", f"spool:{spool}", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        ln.split("{")[0]: float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("offgraph_update_") and "{" in ln
    }


def _summary(lines: list[str]) -> dict:
    return next(json.loads(ln)["update"] for ln in lines if ln.startswith('{"update"'))


def test_the_updater_waits_for_a_complete_version_then_applies(tiny_model, tmp_path):
    models, spool = tmp_path / "models", tmp_path / "spool"  # MODELS not even created yet
    port = free_port()
    proc, lines = _update(models, spool, "--metrics-port", str(port))
    try:
        wait_ready(f"http://127.0.0.1:{port}", 60, proc, path="/metrics")
        wait_for(lambda: _metrics(port).get(WAITING) == 1, 30, "the waiting gauge at 1")
        wait_for(lambda: any("no complete version yet" in ln for ln in lines), 10, "the waiting log line")
        # a half-copied version (no manifest yet) is not one: still waiting, still running
        vdir = models / "ml" / "1"
        shutil.copytree(tiny_model[0] / "ml" / "1", vdir, ignore=shutil.ignore_patterns("manifest.json"))
        publish_delta(
            spool,
            model="ml",
            model_version=1,
            table_ids=[0],
            rows=[3],
            vectors=np.full((1, _dim(tiny_model[0])), 0.25, np.float32),
            first_order=[0.5],
            seqs=[1],
            event_time_ms=int(time.time() * 1000),
        )
        t_end = time.monotonic() + 2.0  # several of its 1-s looks at MODELS
        while time.monotonic() < t_end:
            assert proc.poll() is None, "\n".join(lines[-20:])
            assert _metrics(port)[WAITING] == 1
            time.sleep(0.2)
        assert sum("no complete version yet" in ln for ln in lines) == 1, "one log line, not one per look"

        shutil.copy(tiny_model[0] / "ml" / "1" / "manifest.json", vdir / "manifest.json")  # now complete
        wait_for(lambda: _metrics(port).get("offgraph_update_rows_applied_total", 0) >= 1, 30, "the delta applied")
        m = _metrics(port)
        assert m[WAITING] == 0 and m["offgraph_update_live_version"] == 1, m
        proc.terminate()
        assert proc.wait(STOP_GRACE_S + 5) == 0, "\n".join(lines[-20:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    summary = _summary(lines)
    assert summary["version"] == 1 and summary["rows_applied"] == 1 and summary["files_dead_lettered"] == 0, summary


def _dim(models: Path) -> int:
    return int(json.loads((models / "ml" / "1" / "manifest.json").read_text())["embedding_dim"])


def test_sigterm_while_waiting_for_a_version_exits_0(tmp_path):
    models, spool = tmp_path / "models", tmp_path / "spool"
    port = free_port()
    proc, lines = _update(models, spool, "--metrics-port", str(port))
    try:
        wait_ready(f"http://127.0.0.1:{port}", 60, proc, path="/metrics")
        wait_for(lambda: _metrics(port).get(WAITING) == 1, 30, "the waiting gauge at 1")
        t0 = time.monotonic()
        proc.terminate()
        rc = proc.wait(STOP_GRACE_S + 5)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert rc == 0 and took < STOP_GRACE_S, (rc, took, lines[-20:])
    assert _summary(lines)["version"] is None


def test_once_still_refuses_a_model_without_a_version(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "offgraph.cli", "update", "--models", str(tmp_path), "--model", "ml"]
        + ["--source", f"spool:{tmp_path / 'spool'}", "--once"],
        cwd=REPO,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no complete version to update" in r.stderr, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr

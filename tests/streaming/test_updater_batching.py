"""The updater's loop: a lone delta is applied at once (inotify, not the poll interval), a flood in
batches cut by rows or by the gathering deadline, and its backlog is visible (real store, real
spool, a real `offgraph update` process for /metrics)."""

import os
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest
from streaming_helpers import (
    REPO,
    export_tiny,
    install_version,
    last_write_wins,
    make_deltas,
    open_version_store,
    publish,
    train_tiny,
    update_cmd,
    updater,
)

from offgraph.testing.harness import free_port, wait_ready


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return export_tiny(train_tiny(root), root / "models" / "tiny" / "1", "fp32")


def _until(cond, timeout: float) -> float:
    """Seconds until ``cond()`` held (pytest.fail after ``timeout``)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"not within {timeout}s")
        time.sleep(0.005)
    return time.monotonic() - t0


def test_a_lone_delta_is_applied_at_once_while_idle_and_stop_is_prompt(tiny_export, tmp_path):
    models, spool = tmp_path / "models", tmp_path / "spool"
    install_version(tiny_export, models, 1)
    spool.mkdir()
    up = updater(models, spool)
    up = type(up)(models, "tiny", up.source, poll_interval_s=30.0)  # a fallback poll far beyond the test
    assert up.source.wakeup == "inotify"
    th = threading.Thread(target=up.run, daemon=True)
    th.start()
    rng = np.random.default_rng(1)
    for k in range(3):  # each lands while the updater sleeps in its (30 s) wait
        _until(lambda: up.metrics.files_applied == k and up.source.pending() == 0, 10)
        time.sleep(0.2)
        publish(spool, 1, make_deltas(rng, 5, seq0=10 * k + 1))
        assert _until(lambda: up.metrics.files_applied == k + 1, 10) < 5.0
    t0 = time.monotonic()
    up.stop()  # ends the wait at once
    th.join(10)
    assert not th.is_alive() and time.monotonic() - t0 < 5.0


@pytest.mark.parametrize(
    "limits, batches",
    [({"max_batch_rows": 3000}, 4), ({"max_batch_delay_s": 0.0}, 10), ({}, 1)],
    ids=["by-rows", "by-delay", "all-at-once"],
)
def test_a_flood_is_applied_in_batches_cut_by_rows_or_delay(tiny_export, tmp_path, limits, batches):
    models, spool = tmp_path / "models", tmp_path / "spool"
    vdir = install_version(tiny_export, models, 1)
    rng = np.random.default_rng(2)
    deltas = [make_deltas(rng, 1000, seq0=1 + 1000 * i) for i in range(10)]
    for d in deltas:
        publish(spool, 1, d)
    up = updater(models, spool, **limits)
    summary = up.run(once=True)
    assert summary["files_applied"] == 10 and summary["batches"] == batches
    assert summary["backlog_max"]["files"] == 10 and summary["files_waiting"] == 0
    t, r, s, v, w = last_write_wins(deltas)
    with open_version_store(vdir) as st:
        assert st.row_seqs(t, r).tolist() == s.tolist()
        np.testing.assert_array_equal(st.read(t, r)[0], v)


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return {
        ln.split("{")[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("offgraph_update_") and "{" in ln
    }


def test_the_backlog_is_on_metrics_in_files_rows_and_age(tiny_export, tmp_path):
    """Files for version 2 wait (it is not complete yet): they are the backlog, in files, rows
    and the age of the oldest; once version 2 is complete they are applied and it drains."""
    models, spool = tmp_path / "models", tmp_path / "spool"
    install_version(tiny_export, models, 1)
    rng = np.random.default_rng(3)
    paths = [publish(spool, 2, make_deltas(rng, 100 + i, seq0=1 + 1000 * i)) for i in range(5)]
    old = time.time() - 40
    os.utime(paths[0], (old, old))
    port = free_port()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen(
        update_cmd(models, spool, "--metrics-port", str(port), "--log-every", "0.2"),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}", 60, proc, path="/metrics")
        _until(lambda: _metrics(port).get("offgraph_update_backlog_rows") == 510, 30)
        m = _metrics(port)
        assert m["offgraph_update_files_waiting"] == 5
        assert 40 <= m["offgraph_update_oldest_unapplied_seconds"] < 120
        assert m["offgraph_update_rows_applied_per_second"] == 0
        # the log says it too, and warns: the oldest file waited longer than a few log intervals
        _until(lambda: any("backlog 5 files, 510 rows" in ln for ln in lines), 30)
        _until(lambda: any("stream outruns the updater" in ln for ln in lines), 30)
        install_version(tiny_export, models, 2)
        _until(lambda: _metrics(port).get("offgraph_update_files_waiting") == 0, 30)
        _until(lambda: _metrics(port).get("offgraph_update_backlog_rows") == 0, 30)
        assert _metrics(port)["offgraph_update_rows_applied_total"] > 0
    finally:
        proc.terminate()
        proc.wait(30)
        reader.join(10)

"""``offgraph serve --workers 2``: a real supervisor with two uvicorn worker processes on one port.

Requests go on fresh connections, which the kernel spreads over both workers
(SO_REUSEPORT), so "every response says version v" means every worker serves v.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from server_helpers import (
    TOKEN,
    copy_models,
    copy_version,
    free_port,
    serve_process,
    stop_server,
    wait_for,
    wait_ready,
    worker_processes,
)
from tf_noise import TF_NOISE

import offgraph

REPO = Path(__file__).resolve().parents[2]


def _worker_pids(url: str) -> set[str]:
    """Workers that published their model metrics (one pid label each)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return set(re.findall(r'offgraph_row_cache_hit_ratio\{model="ml",pid="(\d+)"\}', text))


def _fresh(url: str, body: dict, n: int) -> list[httpx.Response]:
    """``n`` score requests, each on a new connection."""
    return [httpx.post(url + "/v1/models/ml:score", json=body, timeout=30) for _ in range(n)]


def _serve(models: Path, port: int, log: Path, *extra: str) -> subprocess.Popen:
    flags = ["--workers", "2", "--cache-mb", "16", "--poll-seconds", "0.3", "--log-level", "warning", *extra]
    return serve_process(models, log, *flags, port=port, env={"OFFGRAPH_ADMIN_TOKEN": TOKEN})[0]


def test_two_workers_share_the_port_admin_decisions_and_metrics(tiny_model, requests_, tmp_path):
    from offgraph.scoring.scorer import load

    models = copy_models(tiny_model[0], tmp_path / "models")
    copy_version(models / "ml" / "1", models / "ml" / "2")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = _serve(models, port, log)
    admin = offgraph.Client(url, admin_token=TOKEN)
    sent = 0
    try:
        wait_ready(url, 120, proc)
        wait_for(lambda: len(_worker_pids(url)) == 2, 60, "both workers publishing metrics")
        workers = set(worker_processes(proc.pid))
        assert len(workers) == 2, workers
        # the supervisor only supervises: TensorFlow is loaded in the workers alone
        maps = [Path(f"/proc/{p}/maps").read_text() for p in (proc.pid, *workers)]
        assert "tensorflow" not in maps[0] and all("tensorflow" in m for m in maps[1:])

        # a second server on the same port is an error, not a silently shared port
        other = _serve(models, port, tmp_path / "other.log")
        other.wait(timeout=60)
        out = (tmp_path / "other.log").read_text()
        assert other.returncode == 2 and f"cannot serve on 127.0.0.1:{port}" in out, out[-2000:]

        req, cands = requests_[0]
        body = {"request": req, "candidates": cands}
        with load(models / "ml" / "2") as lib:
            want = lib.score(req, cands)
        rs = _fresh(url, body, 30)
        sent += 30
        assert {r.status_code for r in rs} == {200} and {r.json()["version"] for r in rs} == {2}
        for r in rs:
            np.testing.assert_array_equal(np.asarray(r.json()["scores"], np.float32), want)

        # an admin decision taken by one worker: the answer comes once both follow it
        assert admin.load("ml", 1).policy == "pinned"
        rs = _fresh(url, body, 30)
        sent += 30
        assert {r.status_code for r in rs} == {200} and {r.json()["version"] for r in rs} == {1}

        # a worker killed -9 is restarted and follows the pinned version before it serves
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGKILL)

        # readiness is the whole server's: the survivor answers 503 until the restarted worker has loaded
        # (polled: the probe may come before the kernel has finished the victim off)
        def not_ready() -> bool:
            try:
                r = httpx.get(url + "/readyz", timeout=10)
            except httpx.TransportError:  # a connection the dying worker had accepted
                return False
            return r.status_code == 503 and "not yet" in r.json()["detail"]

        wait_for(not_ready, 10, "/readyz 503 while a worker is down")
        wait_for(lambda: len(set(worker_processes(proc.pid)) - workers) == 1, 30, "a restarted worker")
        wait_ready(url, 120, proc)
        assert {httpx.get(url + "/readyz", timeout=10).status_code for _ in range(10)} == {200}
        wait_for(
            lambda: str(victim) not in _worker_pids(url) and len(_worker_pids(url)) == 2,
            90,
            "the restarted worker publishing metrics",
        )
        rs = _fresh(url, body, 30)
        sent += 30
        assert {r.status_code for r in rs} == {200} and {r.json()["version"] for r in rs} == {1}

        assert admin.unload("ml").state == "unloaded"
        rs = _fresh(url, body, 20)
        assert {r.status_code for r in rs} == {404}
        assert admin.load("ml").policy == "latest"  # follow the newest again
        rs = _fresh(url, body, 20)
        sent += 20
        assert {r.status_code for r in rs} == {200} and {r.json()["version"] for r in rs} == {2}

        # a label set through one worker: both serve its version beside the default one
        assert admin.set_label("ml", "stable", 1).served_versions == [2, 1]
        rs = _fresh(url, {**body, "label": "stable"}, 20) + _fresh(url, body, 10)
        sent += 30
        assert {r.status_code for r in rs} == {200}
        assert [r.json()["version"] for r in rs] == [1] * 20 + [2] * 10

        # metrics are summed over the workers, the killed one's samples included
        text = httpx.get(url + "/metrics", timeout=10).text
        count = re.search(r'offgraph_request_latency_seconds_count\{model="ml"\} ([0-9.e+]+)', text)
        assert count and float(count.group(1)) == sent, (count and count.group(0), sent)
        assert re.search(
            r'offgraph_http_errors_total\{code="404",model="ml",route="/v1/models/\{name\}:score"\} 20\.0', text
        ), text[-3000:]
        assert 'offgraph_model_loaded_version{model="ml"} 2.0' in text
        assert 'offgraph_model_label_version{label="stable",model="ml"} 1.0' in text
        # each live worker's process figures (the killed one's gone), CPU seconds summed over all of them
        live = set(re.findall(r'^process_resident_memory_bytes\{pid="(\d+)"\} [0-9.e+]+$', text, re.M))
        assert live == {str(p) for p in worker_processes(proc.pid)}, (live, text[-3000:])
        assert re.search(r"^process_cpu_seconds_total [0-9.e+]+$", text, re.M) and "python_info{" in text
    finally:
        admin.close()
        stop_server(proc, 60)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert not TF_NOISE.search(out), out[-3000:]  # the workers' TensorFlow start-up lines are hidden too
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") for p in workers), "a worker outlived the supervisor"


def test_several_workers_need_a_port_number(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "offgraph.cli", "serve", "--models", str(tmp_path), "--workers", "2", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--port 0" in r.stderr and "give a port number" in r.stderr, r.stderr[-500:]

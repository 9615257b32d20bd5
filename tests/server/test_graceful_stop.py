"""SIGTERM drains, then stops: /readyz turns 503 at once while score requests are still answered for
``--drain-seconds``, then the process exits 0 within the drain + ``--stop-timeout`` + 2 s
(offgraph.server.process.graceful_stop). One process, and ``--workers 2`` (the supervisor forwards the
signal: every worker's /readyz turns 503, and a second signal skips the rest of the drain)."""

from __future__ import annotations

import re
import signal
import time

import httpx
import pytest
from server_helpers import copy_models, score, serve_process, stop_server, wait_for, wait_ready

DRAIN_S, STOP_S = 3.0, 4.0
READYZ_FLIP_S = 0.5  # the brief's "at once"


def _readyz_503(url: str) -> bool:
    """On a fresh connection (with several workers, the kernel picks one per connection)."""
    r = httpx.get(url + "/readyz", timeout=5)
    return r.status_code == 503 and "stopping" in r.json()["detail"]


def _start(tiny_model, tmp_path, *flags: str):
    models = copy_models(tiny_model[0], tmp_path / "models")
    log = tmp_path / "serve.log"
    proc, url = serve_process(models, log, "--cache-mb", "8", *flags)
    try:
        wait_ready(url, 120, proc, log=str(log))
    except BaseException:
        stop_server(proc, 10)
        raise
    return proc, url, log


@pytest.mark.timeout(240)
def test_sigterm_drains_answers_then_exits_0(tiny_model, requests_, tmp_path):
    proc, url, log = _start(tiny_model, tmp_path, "--drain-seconds", str(DRAIN_S), "--stop-timeout", str(STOP_S))
    req, cands = requests_[0]
    body = {"request": req, "candidates": cands}
    try:
        with httpx.Client(base_url=url, timeout=30) as c:
            assert score(c, body).status_code == 200
            assert "offgraph_server_draining 0.0" in c.get("/metrics").text
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            wait_for(lambda: _readyz_503(url), READYZ_FLIP_S, "/readyz 503 after SIGTERM")
            flipped = time.monotonic() - t0
            statuses = []
            while time.monotonic() < t0 + DRAIN_S - 0.5:  # the drain: scores still answered, keep-alive or not
                statuses.append(score(c, body).status_code)
                statuses.append(httpx.post(url + "/v1/models/ml:score", json=body, timeout=30).status_code)
            assert statuses and set(statuses) == {200}, statuses
            assert "offgraph_server_draining 1.0" in c.get("/metrics").text
        rc = proc.wait(timeout=DRAIN_S + STOP_S + 2 - (time.monotonic() - t0))
        took = time.monotonic() - t0
    finally:
        stop_server(proc, 10)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    assert took >= DRAIN_S - 0.2, f"exited {took:.1f} s after SIGTERM, before its {DRAIN_S} s drain ended"
    for line in (
        "SIGTERM: draining for 3 s",
        "drain over: no new connections",
        "stopped ",
        "Application shutdown complete",
    ):
        assert line in out, f"{line!r} not logged:\n{out[-3000:]}"
    print(
        f"/readyz 503 {flipped * 1000:.0f} ms after SIGTERM; {len(statuses)} scores during the drain; exit 0 after {took:.1f} s"
    )


@pytest.mark.timeout(240)
def test_workers_drain_together_then_exit_0(tiny_model, requests_, tmp_path):
    proc, url, log = _start(
        tiny_model, tmp_path, "--workers", "2", "--drain-seconds", str(DRAIN_S), "--stop-timeout", str(STOP_S)
    )
    req, cands = requests_[0]
    body = {"request": req, "candidates": cands}
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _readyz_503(url), READYZ_FLIP_S, "/readyz 503 after SIGTERM")
        # every worker drains: fresh connections (the kernel spreads them over both workers) all see 503
        # and all score; both workers' figures are still published
        for _ in range(8):
            assert _readyz_503(url)
            r = httpx.post(url + "/v1/models/ml:score", json=body, timeout=30)
            assert r.status_code == 200, r.text
        text = httpx.get(url + "/metrics", timeout=10).text
        assert "offgraph_server_draining 1.0" in text, text[:2000]
        pids = set(re.findall(r'offgraph_row_cache_hit_ratio\{model="ml",pid="(\d+)"\}', text))
        assert len(pids) == 2, pids
        assert time.monotonic() - t0 < DRAIN_S, "the checks outlasted the drain: raise DRAIN_S"
        rc = proc.wait(timeout=DRAIN_S + STOP_S + 2 - (time.monotonic() - t0))
        took = time.monotonic() - t0
    finally:
        stop_server(proc, 10)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    assert took >= DRAIN_S - 0.2, f"exited {took:.1f} s after SIGTERM, before its {DRAIN_S} s drain ended"
    assert out.count("SIGTERM: draining for 3 s") == 2, out[-3000:]  # one line per worker
    assert out.count("drain over: no new connections") == 2, out[-3000:]
    assert "SIGTERM: the 2 workers drain for 3 s" in out and "all 2 workers stopped" in out, out[-3000:]
    print(f"--workers 2: exit 0 after {took:.1f} s")


@pytest.mark.timeout(240)
def test_a_second_signal_skips_the_rest_of_the_drain(tiny_model, tmp_path):
    long_drain = 60.0
    proc, url, log = _start(tiny_model, tmp_path, "--drain-seconds", str(long_drain), "--stop-timeout", str(STOP_S))
    try:
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _readyz_503(url), READYZ_FLIP_S, "/readyz 503 after SIGTERM")
        t1 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=STOP_S + 2)
        took = time.monotonic() - t1
    finally:
        stop_server(proc, 10)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    assert "SIGINT during the drain: stopping now" in out, out[-3000:]
    print(f"second signal: exit 0 after {took:.1f} s")

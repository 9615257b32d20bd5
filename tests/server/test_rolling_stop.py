"""A rolling update's stop behind a real load balancer: HAProxy (Debian's) round robin over two
``offgraph serve`` processes of one model, health-checked on /readyz every 200 ms; a client at concurrency 8
scores through it while one server gets SIGTERM. Not one request may fail: the stopping server's /readyz
turns 503 at once, HAProxy takes it out, the server answers what still reaches it during its drain and
exits 0, and the other server answers the rest (issue 50, item 5).

HAProxy runs twice: configured as a deployment would (retries, redispatch, retry-on), and with no retries
at all, where the drain alone keeps every request answered (with ``--drain-seconds 0`` that run fails:
the requests HAProxy sends before its next check finds the server gone are refused)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import parts
import pytest
from server_helpers import copy_models, serve_process, stop_server, wait_for, wait_ready

from offgraph.testing.haproxy import HAProxy

CONCURRENCY = 8
DRAIN_S, STOP_S = 3.0, 5.0
BEFORE, AFTER = 100, 100  # requests each server answers before the SIGTERM; requests after the stopped one exits


class Client:
    """CONCURRENCY threads scoring through ``url`` until stopped; every answer's (time, status or error)."""

    def __init__(self, url: str, requests_):
        self.url, self.requests_ = url, requests_
        self.answers: list[tuple[float, int | str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CONCURRENCY)]

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:  # no retries: httpx makes none by default
            i = k
            while not self._stop.is_set():
                req, cands = self.requests_[i % len(self.requests_)]
                try:
                    r = c.post("/v1/models/ml:score", json={"request": req, "candidates": cands[:20]})
                    got: int | str = r.status_code if r.status_code != 200 or r.json()["scores"] else "no scores"
                except httpx.HTTPError as e:
                    got = repr(e)
                self.answers.append((time.monotonic(), got))
                i += CONCURRENCY

    def __enter__(self) -> Client:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("retries", [True, False], ids=["lb-retries", "no-lb-retries"])
def test_sigterm_behind_haproxy_fails_no_request(tiny_model, requests_, tmp_path, retries):
    parts.need("haproxy")
    models = copy_models(tiny_model[0], tmp_path / "models")
    flags = ("--cache-mb", "8", "--drain-seconds", str(DRAIN_S), "--stop-timeout", str(STOP_S))
    servers = [serve_process(models, tmp_path / f"serve-{i}.log", *flags) for i in range(2)]
    (stopping, stop_url), (other, other_url) = servers
    try:
        for proc, url in servers:
            wait_ready(url, 120, proc)
        with (
            HAProxy([stop_url, other_url], tmp_path / "haproxy.log", retries=retries) as lb,
            Client(lb.url, requests_) as client,
        ):
            # traffic through both, on kept-alive connections
            wait_for(lambda: all(s["2xx"] >= BEFORE for s in lb.servers().values()), 30, "both servers answering")
            before = lb.servers()
            t_sig = time.monotonic()
            stopping.send_signal(signal.SIGTERM)
            wait_for(lambda: lb.servers()["s0"]["status"].startswith("DOWN"), 2, "HAProxy taking s0 out")
            t_down = time.monotonic()
            rc = stopping.wait(DRAIN_S + STOP_S + 2)
            t_exit = time.monotonic()
            late = lambda: sum(1 for t, _ in client.answers if t > t_exit)  # noqa: E731
            wait_for(lambda: late() >= AFTER, 20, f"{AFTER} requests after the exit")
            after = lb.servers()
        answers = client.answers
    finally:
        for proc, _ in servers:
            stop_server(proc, 20)
    log0 = (tmp_path / "serve-0.log").read_text()
    failed = [(round(t - t_sig, 2), a) for t, a in answers if a != 200]
    assert failed == [], f"{len(failed)} of {len(answers)} requests failed: {failed[:20]}"
    assert rc == 0, log0[-3000:]
    assert "drain over" in log0 and "stopped " in log0, log0[-3000:]
    late = sum(1 for t, _ in answers if t > t_exit)
    # the other server answered everything after the stop: its 2xx grew by at least the late requests, s0's by
    # no more than what was in flight or routed before its first failed check
    assert after["s1"]["2xx"] - before["s1"]["2xx"] >= late, (before, after)
    assert after["s0"]["status"].startswith("DOWN"), after
    print(
        f"{len(answers)} requests at c{CONCURRENCY}, 0 failed; s0 out of HAProxy {t_down - t_sig:.2f} s after "
        f"SIGTERM, exited 0 after {t_exit - t_sig:.1f} s; {late} requests after its exit, all by s1 "
        f"(s0 answered {after['s0']['2xx'] - before['s0']['2xx']} after the SIGTERM)"
    )

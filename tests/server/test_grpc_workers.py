"""``offgraph serve --workers 2 --grpc-port P``: both worker processes serve the gRPC port (each binds it with
SO_REUSEPORT), from start to the drain.

Which worker answers a call is the worker that accepted its channel's connection: the test reads it from the
kernel (the server end of each connection, in ``/proc/net/tcp``, is a socket only the accepting worker holds), so
"both workers answered" is seen, not assumed. Each channel has its own connection (a local subchannel pool: gRPC
otherwise shares one connection between channels to the same address)."""

from __future__ import annotations

import os
import signal
import threading

import grpc
import httpx
import numpy as np
import pytest
from grpc_helpers import NOT_SERVING, SERVING, health, predict, predict_request, rest_scores
from server_helpers import copy_models, free_port, serve_process, stop_server, wait_for, wait_ready, worker_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ESTABLISHED = "01"  # /proc/net/tcp's st column


def _server_ends(port: int) -> set[int]:
    """Socket inodes of the server ends of the established connections to ``port`` (IPv4 and IPv6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == ESTABLISHED:
                out.add(int(f[9]))
    return out


def _connections_by_worker(workers: list[int], port: int) -> dict[int, int]:
    """How many connections to ``port`` each worker holds (its fds that are those sockets)."""
    ends = _server_ends(port)
    held = {}
    for pid in workers:
        n = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in ends:
                n += 1
        held[pid] = n
    return held


def _channel(gport: int) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{gport}", options=[("grpc.use_local_subchannel_pool", 1)])


def _scored_requests(url: str) -> float:
    """Score requests answered, summed over the workers (``offgraph_candidates_per_request``'s count)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith('offgraph_candidates_per_request_count{model="ml"}'):
            return float(line.split()[-1])
    return 0.0


def test_both_workers_serve_grpc_then_drain(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    gport, log = free_port(), tmp_path / "serve.log"
    flags = ("--workers", "2", "--grpc-port", str(gport), "--drain-seconds", "3", "--poll-seconds", "0.2")
    proc, url = serve_process(models, log, *flags)
    channels: list[grpc.Channel] = []
    try:
        wait_ready(url, 120, proc, log=str(log))
        workers = wait_for(lambda: (w := worker_processes(proc.pid)) and len(w) == 2 and w, 30, "two workers")
        cases = [(req, cands) for req, cands in requests_[:6]]
        want = [np.asarray(rest_scores(url, req, cands)) for req, cands in cases]

        # channels until both workers hold one (the kernel spreads new connections over the workers by their
        # addresses: 32 channels all on one worker would be a 1 in 2^31 chance)
        held: dict[int, int] = {}
        for _ in range(32):
            ch = _channel(gport)
            channels.append(ch)
            grpc.channel_ready_future(ch).result(timeout=10)
            held = _connections_by_worker(workers, gport)
            if sum(held.values()) == len(channels) and all(held.values()):
                break
        print(f"connections per worker: {held}")
        assert all(held.values()) and sum(held.values()) == len(channels), held
        assert all(health(ch) == SERVING and health(ch, "ml") == SERVING for ch in channels)

        # many Predict calls over every channel at once: each answered, as :score answers
        before = _scored_requests(url)
        errors: list[BaseException] = []
        calls = 0
        lock = threading.Lock()

        def client(ch: grpc.Channel, offset: int) -> None:
            nonlocal calls
            try:
                for i in range(12):
                    k = (offset + i) % len(cases)
                    _, got = predict(ch, predict_request(*cases[k]))
                    np.testing.assert_allclose(got, want[k], atol=1e-6, rtol=0)
                    with lock:
                        calls += 1
            except BaseException as e:  # noqa: BLE001 (reported by the main thread)
                errors.append(e)

        threads = [threading.Thread(target=client, args=(ch, i)) for i, ch in enumerate(channels)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        assert calls == 12 * len(channels)
        # the connections are still each worker's own (none was reconnected elsewhere): both answered
        assert _connections_by_worker(workers, gport) == held
        # every call scored once (the workers' counts, summed on publication: polled)
        wait_for(lambda: _scored_requests(url) - before == calls, 10, f"{calls} scored requests in /metrics")

        # SIGTERM: both workers drain (health NOT_SERVING on every connection, calls still answered), then exit 0
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: all(health(ch) == NOT_SERVING for ch in channels), 2.5, "NOT_SERVING from both workers")
        assert all(health(ch, "ml") == NOT_SERVING for ch in channels)
        for ch in channels:
            _, got = predict(ch, predict_request(*cases[0]))
            np.testing.assert_allclose(got, want[0], atol=1e-6, rtol=0)
        assert proc.poll() is None, "the drain (--drain-seconds 3) ended before the calls"
        assert proc.wait(60) == 0
    finally:
        for ch in channels:
            ch.close()
        stop_server(proc)

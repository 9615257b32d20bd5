"""A minimal keep-alive HTTP/1.1 client on asyncio (one connection per concurrent stream, bodies serialized
beforehand) and one measured cell of requests of any protocol (``measure_calls``; HTTP: ``run_cell``): latency
percentiles, throughput, server CPU per request."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from bench.lib.proc import cpu_seconds


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.r, self.w, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        r, w = await asyncio.open_connection(host, port)
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(r, w, host)

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        self.w.write(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), self.host.encode(), len(body), extra)
            + body
        )
        head = await self.r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = None
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length is None:
            raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
        return status, await self.r.readexactly(length)

    def close(self) -> None:
        self.w.close()


async def run_cell(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    warmup: int,
    check_n: int,
    pid: int,
) -> dict:
    """One measured cell of ``POST path`` (one keep-alive connection per concurrent stream): ``measure_calls``."""
    conns = [await Conn.open(host, port) for _ in range(concurrency)]

    async def call(conn: Conn, body: bytes) -> tuple[bool, Any, bytes]:
        status, payload = await conn.post(path, body)
        return status == 200, status, payload

    def count(payload: bytes) -> int:
        return len(json.loads(payload)["scores"])

    try:
        return await measure_calls(conns, call, count, path, bodies, max_requests, max_seconds, warmup, check_n, pid)
    finally:
        for c in conns:
            c.close()


async def measure_calls(
    conns: Sequence[Any],
    call: Callable[[Any, bytes], Awaitable[tuple[bool, Any, bytes]]],
    count: Callable[[bytes], int],
    what: str,
    bodies: list[bytes],
    max_requests: int,
    max_seconds: float,
    warmup: int,
    check_n: int,
    pid: int,
) -> dict:
    """One measured cell of any protocol: ``call(conn, body)`` -> (ok, status, payload) on one stream per connection
    of ``conns``, after ``warmup`` calls (the last one's ``count(payload)`` must be ``check_n`` scores); at most
    ``max_requests`` calls or ``max_seconds``. Latency percentiles, req/s, the server's (``pid``'s process tree)
    CPU per request."""
    concurrency = len(conns)
    payload = b""
    for i in range(warmup):  # warm: connections, item caches, row caches, TF
        ok, status, payload = await call(conns[i % concurrency], bodies[i % len(bodies)])
        if not ok:
            raise RuntimeError(f"warm-up request to {what} failed: {status} {payload[:300]!r}")
    got = count(payload)
    if got != check_n:
        raise RuntimeError(f"{what}: {got} scores for {check_n} candidates")
    lat: list[float] = []
    errors: dict[Any, int] = {}
    issued = 0
    deadline = time.perf_counter() + max_seconds

    async def stream(conn: Any, k: int):
        nonlocal issued
        j = k
        while issued < max_requests and time.perf_counter() < deadline:
            issued += 1
            body = bodies[j % len(bodies)]
            j += concurrency
            t0 = time.perf_counter()
            ok, status, _ = await call(conn, body)
            lat.append(time.perf_counter() - t0)
            if not ok:
                errors[status] = errors.get(status, 0) + 1

    cpu0, own0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    await asyncio.gather(*(stream(c, k) for k, c in enumerate(conns)))
    wall, cpu, own = time.perf_counter() - t0, cpu_seconds(pid) - cpu0, time.process_time() - own0
    a = np.asarray(lat) * 1e3
    return {
        "requests": len(lat),
        "seconds": wall,
        "rps": len(lat) / wall,
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "max_ms": float(a.max()),
        "errors": errors,
        "server_cpu_ms_per_request": cpu / len(lat) * 1e3,
        "server_cpu_utilization": cpu / wall,
        "client_cpu_ms_per_request": own / len(lat) * 1e3,
        "loadavg_1m": os.getloadavg()[0],
    }


async def fetch_scores(host: str, port: int, path: str, body: bytes) -> np.ndarray:
    c = await Conn.open(host, port)
    try:
        status, payload = await c.post(path, body)
    finally:
        c.close()
    if status != 200:
        raise RuntimeError(f"{path}: {status} {payload[:300]!r}")
    return np.asarray(json.loads(payload)["scores"], np.float32)


def metric_value(port: int, name: str) -> float:
    """The first sample of ``/metrics`` counter or gauge ``name`` on 127.0.0.1:``port`` (0.0: absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0

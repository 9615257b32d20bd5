"""Run-and-wait helpers for a scoring server on loopback, shared by the tests, the benchmarks
and the demos (which cannot import tests/): a free port, and waiting until a URL answers 200."""

from __future__ import annotations

import socket
import subprocess
import time


class NotReady(RuntimeError):
    """The server did not answer 200 in time, or its process exited first; the message says which."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(
    url: str, timeout: float, proc: subprocess.Popen | None = None, *, path: str = "/readyz", log: str | None = None
) -> None:
    """Until ``GET url+path`` answers 200 (``/readyz``: every model loaded and warmed up).
    Raises :class:`NotReady` after ``timeout`` seconds with the last answer, or at once when
    ``proc`` has exited (``log``: a file whose tail goes into the message)."""
    import httpx

    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise NotReady(f"server exited with {proc.returncode} before {url}{path} answered 200" + _log_tail(log))
        try:
            r = httpx.get(url + path, timeout=2)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:500]}"
        except httpx.TransportError as e:
            last = repr(e)
        time.sleep(0.1)
    raise NotReady(f"{url}{path} did not answer 200 within {timeout:g} s: {last}" + _log_tail(log))


def _log_tail(log: str | None) -> str:
    if log is None:
        return ""
    try:
        with open(log, errors="replace") as f:
            return f"; log {log}:\n" + f.read()[-3000:]
    except OSError:
        return f"; log {log} unreadable"

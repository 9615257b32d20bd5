"""Run-and-wait helpers for a scoring server on loopback, shared by the tests, the benchmarks
and the demos (which cannot import tests/): a free port, waiting until a URL answers 200, and the
one way to start a server process (:class:`ServerProcess`, the command of :func:`serve_command`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


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


def serve_command(
    models: Path | str, port: int, *flags: str, cli_flags: Sequence[str] = (), module: str = "offgraph.cli"
) -> list[str]:
    """``python -m MODULE [cli_flags] serve --models MODELS --port PORT *flags`` with this interpreter
    (``module``: ``offgraph_cli`` runs an old checkout's CLI, started in that checkout)."""
    return [sys.executable, "-m", module, *cli_flags, "serve", "--models", str(models), "--port", str(port), *flags]


def server_env(env: Mapping[str, str | None] | None = None, pythonpath: Path | str | None = None) -> dict[str, str]:
    """This process's environment with TensorFlow's C++ logs quiet, then ``env`` (None: removed) and
    ``pythonpath`` (first on the path of the server and the processes it starts: another checkout's code)."""
    environ = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for k, v in (env or {}).items():
        if v is None:
            environ.pop(k, None)
        else:
            environ[k] = v
    if pythonpath is not None:
        environ["PYTHONPATH"] = str(pythonpath)
    return environ


class ServerProcess:
    """A server (``offgraph serve``, ``offgraph update``, a baseline: any command) in a subprocess on a
    loopback ``port``, stdout and stderr in the file ``log``.

    ``cwd``: where the command runs (``python -m offgraph.cli`` imports the code found there first, so
    another checkout's directory runs its code); ``env``/``pythonpath``: see :func:`server_env`;
    ``append``: the log continues what is there (a restart); ``new_session``: in its own process group
    (``os.killpg`` reaches every worker). :meth:`wait_ready` until it answers, :meth:`stop` with SIGTERM.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        port: int,
        log: Path | str,
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str | None] | None = None,
        pythonpath: Path | str | None = None,
        append: bool = False,
        new_session: bool = False,
        name: str = "server",
    ):
        self.name, self.port, self.log_path = name, port, Path(log)
        self.url = f"http://127.0.0.1:{port}"
        with open(log, "ab" if append else "wb") as logf:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                list(cmd),
                cwd=cwd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=server_env(env, pythonpath),
                start_new_session=new_session,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float, path: str = "/readyz") -> None:
        """Until ``GET url+path`` answers 200; :class:`NotReady` (with the log's tail) if it exits first or times out."""
        wait_ready(self.url, timeout, self.proc, path=path, log=str(self.log_path))

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM (killed if it has not exited after ``timeout`` s); its exit status. Nothing if it has exited."""
        return stop_process(self.proc, timeout)


def stop_process(proc: subprocess.Popen | None, timeout: float = 20) -> int | None:
    """SIGTERM ``proc`` unless it has exited (killed if it does not stop within ``timeout`` s); its exit status."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode

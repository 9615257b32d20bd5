"""``offgraph serve --workers N``: N server processes on one port, supervised.

One Python process scores on about one core (the GIL), so a server uses a machine's
cores by running several. Each worker is a full ``create_app`` server with its own
scorers and caches (``--memory-mb`` is each worker's; ``--cache-mb`` is split between them); each binds the
port with ``SO_REUSEPORT``, so the kernel spreads connections over the workers.
Before the workers start, the port is bound once WITHOUT ``SO_REUSEPORT``: a port in
use by anything (another ``offgraph serve`` included) is an error, never a silently
shared port. Admin decisions reach every worker through a control directory
(``offgraph.server.models.control``) and metrics are summed over the workers (Prometheus multiprocess
mode); both live in a private temporary directory removed at exit.

The supervisor restarts a worker that dies (logged; a worker that keeps dying within
seconds of its start stops the server) and forwards SIGTERM / SIGINT to every worker, each of which
drains and stops (``offgraph.server.process.graceful_stop``); it exits 0 once they have.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from offgraph.server.config import HttpLimits, ListenConfig, ServerConfig

VERBOSE_ENV = "OFFGRAPH_VERBOSE"  # set by `offgraph -v`; read by the spawned workers

log = logging.getLogger("offgraph.server")

STOP_SLACK_S = 5.0  # a worker still alive this long after its drain and stop timeout is killed
RESTART_WINDOW_S = 30.0  # a worker that dies this soon after starting ...
MAX_QUICK_DEATHS = 3  # ... this many times in a row stops the server


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bind(sock: socket.socket, host: str, port: int) -> None:
    """Bind ``sock`` (SO_REUSEADDR: TIME_WAIT leftovers are fine); OSError naming the address if taken."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        raise OSError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


def check_port_free(host: str, port: int) -> None:
    """OSError naming the port if anything listens on it (a plain bind, no SO_REUSEPORT)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        _bind(s, host, port)


def listening_socket(host: str, port: int) -> socket.socket:
    """The single-process server's socket, bound and listening before anything slow (TensorFlow, the
    models) starts: a port in use is an error at once. OSError naming the address."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        _bind(sock, host, port)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` in the port's SO_REUSEPORT group (one per worker)."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve_on(
    app,
    sock: socket.socket,
    log_level: str,
    limits: HttpLimits = HttpLimits(),
    drain_seconds: float = 0.0,
    stop_timeout_s: float = 10.0,
) -> bool:
    """Run ``app`` under uvicorn (uvloop, httptools, the connection ``limits``) on ``sock`` until
    SIGTERM / SIGINT, then drain and stop (``offgraph.server.process.graceful_stop``); whether it started
    (its lifespan's start-up succeeded)."""
    from offgraph.server.http.http_limits import uvicorn_config
    from offgraph.server.process.graceful_stop import DrainingServer

    server = DrainingServer(uvicorn_config(app, limits, log_level, stop_timeout_s), drain_seconds)
    server.run(sockets=[sock])
    if server.drain_ends is not None:
        log.info("stopped %.1f s after the drain ended", time.monotonic() - server.drain_ends)
    return server.started


class Supervisor:
    """Runs ``worker_main(config, listen)`` in each of ``listen.workers`` spawned processes: a
    module-level function (it is pickled by name) that serves one app on the port with ``reuseport_socket``
    and ``serve_on`` (``offgraph.cli.serve.serve_worker``: the app is built above this room, not here)."""

    def __init__(
        self,
        config: ServerConfig,
        listen: ListenConfig,
        worker_main: Callable[[ServerConfig, ListenConfig], None],
    ):
        host, port, workers, log_level = listen.host, listen.port, listen.workers, listen.log_level
        if workers < 2:
            raise ValueError(f"Supervisor runs 2 or more workers, got {workers}")
        if port == 0:
            raise ValueError("--port 0 (any free port) cannot be shared by several workers: give a port number")
        self.listen, self.host, self.port, self.workers, self.log_level = listen, host, port, workers, log_level
        self.worker_main = worker_main
        self.tmp = Path(tempfile.mkdtemp(prefix="offgraph-serve-"))
        (self.tmp / "prometheus").mkdir()
        self.config = config.replace(
            workers=workers,
            control_dir=self.tmp / "control",
            cache_mb=None if config.cache_mb is None else config.cache_mb / workers,
        )
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: dict[int, multiprocessing.process.BaseProcess] = {}
        self.started: dict[int, float] = {}
        self.quick_deaths: dict[int, int] = {}
        self.stopping = False
        self.signalled: set[int] = set()  # pids of the workers the stop signal was forwarded to

    def _start(self, i: int) -> None:
        cfg = self.config.replace(worker_id=i)
        p = self.ctx.Process(
            target=self.worker_main,
            args=(cfg, self.listen),
            name=f"offgraph-worker-{i}",
            daemon=False,
        )
        p.start()
        self.procs[i], self.started[i] = p, time.monotonic()
        log.info("worker %d started (pid %d)", i, p.pid)

    def _on_signal(self, signum, frame) -> None:
        # every worker drains on the first signal and skips to its stop on the second, as one server does
        if not self.stopping:
            log.info(
                "%s: the %d workers drain for %g s, then stop",
                signal.Signals(signum).name,
                self.workers,
                self.listen.drain_seconds,
            )
        self.stopping = True
        for p in self.procs.values():
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)
                self.signalled.add(p.pid)

    def run(self) -> int:
        check_port_free(self.host, self.port)
        if self.listen.grpc_port is not None:  # each worker then binds it with SO_REUSEPORT, as the HTTP port
            if self.listen.grpc_port == 0:
                raise ValueError(
                    "--grpc-port 0 (any free port) cannot be shared by several workers: give a port number"
                )
            check_port_free(self.host, self.listen.grpc_port)
        # prometheus_client picks multiprocess mode from the environment when a worker imports it
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.tmp / "prometheus")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        log.info(
            "serving on http://%s:%d with %d workers (memory budget %.0f MiB each)",
            self.host,
            self.port,
            self.workers,
            self.config.memory_mb,
        )
        rc = 0
        try:
            for i in range(self.workers):
                if not self.stopping:
                    self._start(i)
            while not self.stopping:
                time.sleep(0.2)
                for i, p in list(self.procs.items()):
                    if p.is_alive() or self.stopping:
                        continue
                    rc = self._restart(i, p)
                    if rc:
                        self.stopping = True
                        break
        finally:
            self._stop_all()
            shutil.rmtree(self.tmp, ignore_errors=True)
        return rc

    def _restart(self, i: int, p) -> int:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(p.pid)
        quick = time.monotonic() - self.started[i] < RESTART_WINDOW_S
        self.quick_deaths[i] = self.quick_deaths.get(i, 0) + 1 if quick else 0
        if self.quick_deaths[i] >= MAX_QUICK_DEATHS:
            log.error(
                "worker %d died %d times within %gs of starting (exit code %s): stopping the server",
                i,
                self.quick_deaths[i],
                RESTART_WINDOW_S,
                p.exitcode,
            )
            return 1
        log.error("worker %d (pid %d) died with exit code %s: restarting it", i, p.pid, p.exitcode)
        self._start(i)
        return 0

    def _stop_all(self) -> None:
        for p in self.procs.values():  # those no signal reached (the supervisor stops because a worker kept dying)
            if p.is_alive() and p.pid not in self.signalled:
                p.terminate()
        deadline = time.monotonic() + self.listen.drain_seconds + self.listen.stop_timeout_s + STOP_SLACK_S
        for p in self.procs.values():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                log.error("worker pid %d did not stop in time: killing it", p.pid)
                p.kill()
                p.join(5)
        log.info("all %d workers stopped", len(self.procs))

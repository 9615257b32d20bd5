"""Helpers of the HTTP server tests (real uvicorn, real httpx client)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from polling import wait_for  # noqa: F401 (the tests' name for it)

from offgraph.testing.harness import ServerProcess, free_port, serve_command, wait_ready  # noqa: F401 (the tests' names)

TOKEN = "test-admin-token"


def copy_models(pristine: Path, dest: Path) -> Path:
    shutil.copytree(pristine, dest)
    return dest


def copy_version(src: Path, dst: Path, tamper=None, manifest_edit=None) -> None:
    """Copy a version like an exporter writes one: everything but the manifest, then the manifest by rename."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("manifest.json"))
    if tamper:
        tamper(dst)
    manifest = json.loads((src / "manifest.json").read_text())
    if manifest_edit:
        manifest_edit(manifest)
    (dst / "manifest.json.tmp").write_text(json.dumps(manifest))
    os.replace(dst / "manifest.json.tmp", dst / "manifest.json")


def score(client, body, name="ml", **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(
        f"/v1/models/{name}:score",
        content=content,
        headers={"content-type": "application/json", **kw.pop("headers", {})},
        **kw,
    )


class ScoreHammer:
    """Default score requests (cycling through ``requests_``) from ``threads`` threads until ``stop``:
    ``seen`` holds each answer's (status, version), to check that a swap or a label dropped none."""

    def __init__(self, url: str, requests_, threads: int = 1):
        self.url, self.requests_ = url, requests_
        self.seen: list[tuple[int, int | None]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=30) as c:
            i = 0
            while not self._stop.is_set():
                req, cands = self.requests_[i % len(self.requests_)]
                r = score(c, {"request": req, "candidates": cands})
                self.seen.append((r.status_code, r.json().get("version")))
                i += 1

    def start(self) -> "ScoreHammer":
        for t in self._threads:
            t.start()
        wait_for(lambda: len(self.seen) > 5, 20, "the first requests")
        return self

    def stop(self) -> list[tuple[int, int | None]]:
        self._stop.set()
        for t in self._threads:
            if t.ident is not None:  # started
                t.join(30)
        return self.seen


def worker_processes(pid: int) -> list[int]:
    """Worker processes of the supervisor ``pid`` (not multiprocessing's resource tracker)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if parent == pid and b"resource_tracker" not in cmd:
                out.append(int(entry))
    return out


def serve_process(
    models: Path,
    log: Path,
    *flags: str,
    port: int | None = None,
    env: dict[str, str | None] | None = None,
    cli_flags: tuple[str, ...] = (),
    new_session: bool = False,
    append: bool = False,
) -> tuple[subprocess.Popen, str]:
    """``offgraph [cli_flags] serve --models MODELS *flags`` in a subprocess on a free loopback port (or
    ``port``: a restart on the same one), its output in ``log`` (``append``: after what is there):
    ``(process, base url)``. ``env``: variables set for the server (None: removed from its environment);
    ``new_session``: in its own process group (so that ``os.killpg`` reaches every worker). Stop it with
    :func:`stop_server`. Started by ``offgraph.testing.harness.ServerProcess``, as the benches start theirs.
    It stops without a drain (``--drain-seconds 0``, unless ``flags`` give one): the tests of the drain
    ask for theirs, the others would each wait the default's 5 s."""
    port = free_port() if port is None else port
    server = ServerProcess(
        serve_command(models, port, "--drain-seconds", "0", *flags, cli_flags=cli_flags),
        port,
        log,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        append=append,
        new_session=new_session,
    )
    return server.proc, server.url


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> str:
    """SIGTERM a server process (killed if it does not stop in ``timeout``); returns its output."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def resolve_refs(schema, root):
    """An OpenAPI ``schema`` with every ``$ref`` into ``root``'s components replaced by what it names."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return resolve_refs(root["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], root)
        return {k: resolve_refs(v, root) for k, v in schema.items()}
    if isinstance(schema, list):
        return [resolve_refs(v, root) for v in schema]
    return schema


@contextmanager
def model_server(pristine: Path, tmp: Path, **config):
    """A ``ThreadServer`` of a copy of the MODELS dir ``pristine`` (under ``tmp``; ``.models`` on the server), with
    ``server_config(models, **config)``; stopped on exit."""
    srv = ThreadServer(server_config(copy_models(pristine, tmp / "models"), **config))
    srv.models = tmp / "models"
    try:
        yield srv
    finally:
        srv.stop()


def server_config(models: Path, **kw):
    """A ServerConfig for tests: the admin token ``TOKEN``, fast polls, small caches and warm-ups."""
    from offgraph.server import ServerConfig

    base = dict(
        models_dir=models, admin_token=TOKEN, poll_seconds=0.2, score_threads=4, cache_mb=16, warmup_candidates=32
    )
    base.update(kw)
    return ServerConfig(**base)


class ThreadServer:
    """uvicorn.Server (uvloop + httptools, like the CLI) in a thread, on a socket bound to a free port.

    Serves ``create_app(config)``, or ``app`` when given (an app built from the config with extra routes).
    Waits until /readyz answers 200, or with ``ready=False`` until /healthz does (a model may never load).
    """

    def __init__(self, config, app=None, ready: bool = True):
        import uvicorn

        from offgraph.server import create_app

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                app if app is not None else create_app(config),
                loop="uvloop",
                http="httptools",
                access_log=False,
                log_level="warning",
            )
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_ready(self.url, 60, path="/readyz" if ready else "/healthz")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def client(server):
    """An httpx client of the test module's ``server`` fixture (a ``ThreadServer``): import it as a fixture."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c

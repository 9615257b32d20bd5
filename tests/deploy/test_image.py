"""The image (Containerfile): built with buildah as `make image` builds it (deploy/image/build.sh, whose
layer cache makes a rebuild of unchanged sources take seconds), run on an exported model, its scores
equal to a host server's for the same requests; it runs as its non-root user, holds no test, lint or
bench package, its health check asks /readyz, and its server stops with 0 on SIGTERM as PID 1.

PID 1: `buildah run --isolation chroot` (what runs containers on these machines: crun refuses their
cgroups) gives the command no PID namespace of its own, so the server is started as PID 1 of a new one
(unshare, then setpriv to the image's user): the kernel then delivers a signal from outside only
through a handler the process installed, as for a container's PID 1. A control shows that holds: a
`sleep` started the same way ignores the SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import httpx
import psutil
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from parts import need
from polling import wait_for
from server_helpers import copy_models, score, serve_process, stop_server

from offgraph.testing.harness import ServerProcess, free_port, wait_ready

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
IMAGE = f"localhost/offgraph:{PYPROJECT['project']['version']}"
BUILD_TIMEOUT_S = 540  # a full build on 2 busy cores takes about 3 minutes; an unchanged one seconds
STOP_FLAGS = ("--drain-seconds", "1", "--stop-timeout", "5")
STOP_BOUND_S = 1 + 5 + 6  # drain + stop timeout + the exit itself on a loaded machine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 240)]


def _buildah(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    """The image built by deploy/image/build.sh (what `make image` runs): its config (Docker format)."""
    for part in ("buildah", "mmdebstrap", "podman"):
        need(part)
    log = tmp_path_factory.mktemp("image") / "build.log"
    t0 = time.monotonic()
    with open(log, "wb") as f:
        rc = subprocess.run(
            [str(REPO / "deploy" / "image" / "build.sh")],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "IMAGE": IMAGE},
            timeout=BUILD_TIMEOUT_S,
        ).returncode
    tail = log.read_text(errors="replace")[-3000:]
    assert rc == 0, f"deploy/image/build.sh failed ({rc}):\n{tail}"
    print(f"\nimage {IMAGE} built in {time.monotonic() - t0:.0f} s")
    out = _buildah("inspect", "--type", "image", IMAGE)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["Docker"]["config"]


@pytest.fixture
def container(image):
    """A working container of the image (removed afterwards)."""
    name = f"offgraph-image-test-{os.getpid()}"
    _buildah("rm", name)  # one a killed run left
    out = _buildah("from", "--name", name, IMAGE)
    assert out.returncode == 0, out.stderr
    yield name
    _buildah("rm", name)


def _uid_gid(image: dict) -> tuple[int, int]:
    user, _, group = image["User"].partition(":")
    return int(user), int(group or user)


def _run(container: str, *argv: str, env: dict[str, str] | None = None) -> list[str]:
    """``buildah run`` of ``argv`` in ``container``, on the host's network, as the image's user."""
    envs = [a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")]
    return ["buildah", "run", "--isolation", "chroot", "--network", "host", *envs, container, "--", *argv]


def _run_as_pid1(container: str, image: dict, argv: list[str], volumes: tuple[str, ...] = ()) -> list[str]:
    """``buildah run`` of ``argv`` as PID 1 of a PID namespace of its own, as the image's user (root
    creates the namespace, setpriv then drops to the user, with every capability)."""
    uid, gid = _uid_gid(image)
    vols = [a for v in volumes for a in ("-v", v)]
    return [
        *["buildah", "run", "--isolation", "chroot", "--network", "host", *vols],
        *["--user", "0:0", "--cap-add", "CAP_SYS_ADMIN", container, "--"],
        *["unshare", "--pid", "--fork", "--mount-proc"],
        *["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
    ]


def _pid1(proc: subprocess.Popen, exe: str) -> psutil.Process:
    """The host's view of the process ``exe`` that is PID 1 of its own namespace under ``proc``."""

    def find():
        for c in psutil.Process(proc.pid).children(recursive=True):
            try:
                status = Path(f"/proc/{c.pid}/status").read_text()
                nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
                if nspid[-1] == "1" and len(nspid) > 1 and exe in " ".join(c.cmdline()):
                    return c
            except (OSError, psutil.Error, StopIteration):
                continue
        assert proc.poll() is None, f"exited with {proc.returncode} before {exe} started"
        return None

    return wait_for(find, 60, f"{exe} as PID 1 of its own namespace", interval=0.1)


def _kill(proc: subprocess.Popen, pid1: psutil.Process | None) -> None:
    if proc.poll() is None:
        if pid1 is not None and pid1.is_running():
            pid1.kill()  # SIGKILL reaches a PID 1 from outside
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def test_runtime_user_and_packages(image, container):
    """The image's user is not root, and its venv holds the package and no test, lint or bench extra."""
    uid, _ = _uid_gid(image)
    assert uid != 0
    out = subprocess.run(
        _run(container, "python3", "-c", "import os; print(os.getuid(), os.geteuid())"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(uid), str(uid)]
    out = subprocess.run(
        _run(container, "python3", "-m", "pip", "list", "--format", "json"), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    installed = {canonicalize_name(d["name"]) for d in json.loads(out.stdout)}
    extras = PYPROJECT["project"]["optional-dependencies"]
    names = {x: {canonicalize_name(Requirement(r).name) for r in extras[x]} for x in extras}
    # what the server needs too (tritonclient: the KServe gRPC protos; its test extra adds the http client) is not a
    # test package
    forbidden = (names["test"] | names["lint"] | names["bench"]) - names["server"]
    assert {"pytest", "ruff", "mypy", "schemathesis", "import-linter"} <= forbidden  # the extras' names, read right
    assert installed & forbidden == set()
    assert {"offgraph", "tensorflow-cpu", "uvicorn"} <= installed
    # the compiled wire-key kernel is in the image's wheel (not its pure-Python twin)
    out = subprocess.run(
        _run(container, "python3", "-c", "from offgraph.server.api import wire_keys; print(wire_keys.KERNEL)"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.split()[-1] == "True", (out.stdout, out.stderr[-2000:])


def test_sigterm_reaches_pid1_only_through_a_handler(image, container):
    """The control of the PID 1 set-up: `sleep` installs no handler, so as PID 1 it ignores SIGTERM."""
    proc = subprocess.Popen(
        _run_as_pid1(container, image, ["sleep", "120"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    pid1 = None
    try:
        pid1 = _pid1(proc, "sleep")
        pid1.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(2)  # a SIGTERM that killed it would end it at once
        assert pid1.is_running()
    finally:
        _kill(proc, pid1)


def test_image_scores_like_the_host_server(image, container, tiny_model, requests_, tmp_path):
    """The image's own entrypoint and command (port and host moved to a free loopback port), on a copy of
    the exported model at /models: the same scores as a host server's; the health check passes; SIGTERM
    to its PID 1 stops it with 0 within the bound."""
    pristine, _ = tiny_model
    uid, gid = _uid_gid(image)
    inside = copy_models(pristine, tmp_path / "container-models")
    for d, _, files in os.walk(inside):
        for p in [d, *(os.path.join(d, f) for f in files)]:
            os.chown(p, uid, gid)  # the server writes in the version (RocksDB's LOG): the user's, as in production
    host_proc, host_url = serve_process(copy_models(pristine, tmp_path / "host-models"), tmp_path / "host.log")
    port = free_port()
    argv = [*image["Entrypoint"], *image["Cmd"], "--host", "127.0.0.1", "--port", str(port), *STOP_FLAGS]
    assert argv[:4] == ["offgraph", "serve", "--models", "/models"]
    server = ServerProcess(
        _run_as_pid1(container, image, argv, volumes=(f"{inside}:/models",)), port, tmp_path / "image.log"
    )
    pid1 = None
    try:
        pid1 = _pid1(server.proc, "offgraph serve")
        assert pid1.uids().real == uid != 0
        server.wait_ready(180)
        wait_ready(host_url, 180, host_proc, log=str(tmp_path / "host.log"))

        with httpx.Client(base_url=server.url, timeout=60) as ci, httpx.Client(base_url=host_url, timeout=60) as ch:
            for req, cands in requests_[:20]:
                body = {"request": req, "candidates": cands}
                a, b = score(ci, body), score(ch, body)
                assert a.status_code == b.status_code == 200, (a.text, b.text)
                assert len(a.json()["scores"]) == len(cands)
                assert a.json()["scores"] == b.json()["scores"]

        check = image["Healthcheck"]["Test"]
        assert check[0] == "CMD" and "/readyz" in check[-1]
        for p, want_ok in ((port, True), (free_port(), False)):
            out = subprocess.run(
                _run(container, *check[1:], env={"OFFGRAPH_PORT": str(p)}), capture_output=True, text=True, timeout=60
            )
            assert (out.returncode == 0) == want_ok, (p, out.returncode, out.stderr[-500:])

        t0 = time.monotonic()
        pid1.send_signal(signal.SIGTERM)
        rc = server.proc.wait(STOP_BOUND_S)
        took = time.monotonic() - t0
        assert rc == 0, server.log_path.read_text()[-2000:]
        print(f"\nthe image's server exited {rc} {took:.1f} s after SIGTERM to its PID 1")
    finally:
        _kill(server.proc, pid1)
        stop_server(host_proc)

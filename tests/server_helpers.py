"""Helpers of the HTTP server tests (real uvicorn, real httpx client)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

TOKEN = "test-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def wait_ready(url: str, timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            r = httpx.get(url + "/readyz", timeout=2)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.TransportError as e:
            last = repr(e)
        time.sleep(0.1)
    raise AssertionError(f"server at {url} not ready after {timeout}s: {last}")


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def score(client, body, name="ml", **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(f"/v1/models/{name}:score", content=content,
                       headers={"content-type": "application/json", **kw.pop("headers", {})}, **kw)


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> str:
    """SIGTERM a server process (killed if it does not stop in ``timeout``); returns its output."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out

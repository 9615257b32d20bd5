"""`pip install offgraph` is the client alone (issue 50, item 6): a fresh venv gets the wheel of this checkout
with its dependencies from the package index (pip's own configuration, as any user's), holds no TensorFlow,
RocksDB, Kafka or Redis client, refuses the server's commands in one line naming the extra, and scores
against a running server (started from the dev venv) with the same scores as the dev venv's client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

import httpx
import pytest
from package_wheel import build_wheel
from server_helpers import copy_models, serve_process, stop_server, wait_ready

import offgraph

pytestmark = pytest.mark.slow  # builds a wheel, installs it with its dependencies, starts a server

SERVER_ONLY = {"tensorflow", "tensorflow-cpu", "rocksdict", "confluent-kafka", "redis", "numpy", "fastapi", "uvicorn"}

# run by the fresh venv's interpreter: score each request, print the scores (JSON)
CLIENT_SCRIPT = """
import json, sys
import offgraph
requests_ = json.load(sys.stdin)
with offgraph.Client(sys.argv[1]) as c:
    print(json.dumps([c.score("ml", req, cands).scores for req, cands in requests_]))
"""


def _run(cmd: list[str], cwd, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180, env=env, **kw)


@pytest.mark.timeout(300)
def test_the_client_installs_alone_and_scores(tiny_model, requests_, tmp_path):
    wheel = build_wheel(tmp_path)
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    py, cli = env / "bin" / "python", env / "bin" / "offgraph"
    # the test interpreter's pip installs into the venv's interpreter, from the index its configuration names
    r = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", str(wheel)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run([sys.executable, "-m", "pip", "--python", str(py), "list", "--format", "json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(r.stdout)}
    assert {"offgraph", "httpx", "tenacity"} <= installed, installed
    assert installed & SERVER_ONLY == set(), sorted(installed)

    # a command of the server: one line naming the extra, exit 2, no traceback
    for args, prog in (
        (["serve", "--help"], "offgraph serve"),
        (["--log-format", "json", "update"], "offgraph update"),
    ):
        r = _run([str(cli), *args], tmp_path)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-3000:])
        assert (
            r.stderr == f"{prog}: error: this command needs the server's dependencies: pip install 'offgraph[server]'\n"
        )

    models = copy_models(tiny_model[0], tmp_path / "models")
    proc, url = serve_process(models, tmp_path / "serve.log", "--cache-mb", "8")
    try:
        wait_ready(url, 120, proc)
        some = [[req, cands[:10]] for req, cands in requests_[:5]]
        r = _run([str(py), "-c", CLIENT_SCRIPT, url], tmp_path, input=json.dumps(some))
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout)
        with offgraph.Client(url) as c:  # the dev venv's client, the same requests
            want = [c.score("ml", req, cands).scores for req, cands in some]
        plain = [httpx.post(url + "/v1/models/ml:score", json={"request": q, "candidates": k}).json() for q, k in some]
    finally:
        stop_server(proc, 30)
    assert got == want, (got, want)
    assert [len(s) for s in got] == [len(k) for _, k in some]
    assert got == [p["scores"] for p in plain]  # and what the server answers without any client

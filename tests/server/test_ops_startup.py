"""`offgraph serve` at start-up, as an operator meets it (a real server in a subprocess): /readyz is 503
while MODELS holds no model, with one WARNING when MODELS is a model's own directory; uvicorn's lines
in the project's format, text or JSON; nothing periodic at INFO; a port in use is one line at once,
before TensorFlow or any model loads."""

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_helpers import copy_models, serve_process, stop_server, wait_ready

REPO = Path(__file__).resolve().parents[2]
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.\[\]]+: ")
IDLE_NOISE = ("gc: froze", "event loop: a timer ran", "held the GIL")


def _readyz(url: str) -> httpx.Response:
    wait_ready(url, 120, path="/healthz")
    return httpx.get(url + "/readyz", timeout=10)


@pytest.mark.timeout(300)
def test_empty_models_is_not_ready_and_json_lines_parse(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    proc, url = serve_process(models, tmp_path / "serve.log", "--poll-seconds", "0.2")
    try:
        r = _readyz(url)
        assert r.status_code == 503, r.text
        assert r.json()["models"] == {} and "no model found" in r.json()["detail"], r.text
    finally:
        stop_server(proc)
    out = (tmp_path / "serve.log").read_text()
    # text format: every line of the server's, uvicorn's included, is the project's
    lines = [x for x in out.splitlines() if x.strip()]
    assert any(" uvicorn.error: " in x for x in lines), out
    assert all(TEXT_LINE.match(x) for x in lines), out
    assert not [x for x in lines if " INFO " in x and any(n in x for n in IDLE_NOISE)], out

    # the same server in JSON lines (a global flag: before the subcommand)
    proc, url = serve_process(models, tmp_path / "json.log", cli_flags=("--log-format", "json"))
    try:
        assert _readyz(url).status_code == 503
    finally:
        stop_server(proc)
    records = [json.loads(x) for x in (tmp_path / "json.log").read_text().splitlines() if x.strip()]
    assert {"uvicorn.error", "offgraph.server"} <= {r["logger"] for r in records}, records
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records), records


@pytest.mark.timeout(300)
def test_a_single_models_directory_is_named_in_one_warning(tiny_model, tmp_path):
    """`--models models/ml` (TF Serving's --model_base_path habit): nothing served, /readyz 503, and
    one WARNING saying to pass models/."""
    models = copy_models(tiny_model[0], tmp_path / "models")
    proc, url = serve_process(models / "ml", tmp_path / "serve.log", "--poll-seconds", "0.2")
    try:
        assert _readyz(url).status_code == 503
    finally:
        stop_server(proc)
    out = (tmp_path / "serve.log").read_text()
    hints = [x for x in out.splitlines() if "looks like one model's directory" in x]
    assert len(hints) == 1 and " WARNING " in hints[0], out
    assert f"pass its parent (--models {models})" in hints[0], hints


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers, rc", [(1, 3), (2, 2)])
def test_a_port_in_use_is_one_line_at_once(tiny_model, tmp_path, workers, rc):
    """Exit codes as before: one worker 3 (uvicorn's start-up failure), --workers 2 (a CLI error)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "offgraph.cli", "serve", "--models", str(tiny_model[0]), "--port", str(port)]
            + ["--workers", str(workers)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - t0
    said = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert r.returncode == rc, said
    assert said == [f"offgraph serve: error: cannot serve on 127.0.0.1:{port}: Address already in use"], said
    assert took < 10, took

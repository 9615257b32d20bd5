"""Fixtures of the operator's kit tests: a real exported model served by a real `offgraph serve`, a real
`offgraph update` publishing its metrics, and a real Prometheus scraping both with the kit's rules."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from deploy_helpers import REPO, RULES, Prometheus, published_series
from polling import wait_for
from server_helpers import serve_process, stop_server, wait_ready

from offgraph.testing.harness import free_port

MODEL = "synth"


@pytest.fixture(scope="session")
def exported_models(tmp_path_factory):
    """MODELS holding ``synth/1``: a small version written by the exporter's path (seeded random weights)."""
    from offgraph.export.synth import synth_version
    from offgraph.export.synth_config import SynthConfig

    models = tmp_path_factory.mktemp("deploy") / "models"
    synth_version(models / MODEL / "1", SynthConfig(rows=40_000, dim=8, shards=1, workers=1), progress=False)
    return models


@pytest.fixture(scope="session")
def served(exported_models, tmp_path_factory):
    """The base URL of `offgraph serve` on the model, ready (every model loaded)."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, url = serve_process(exported_models, log, "--memory-mb", "64", "--poll-seconds", "0.5")
    try:
        wait_ready(url, 120, proc, log=str(log))
        yield url
    finally:
        stop_server(proc, 60)


@pytest.fixture(scope="session")
def updater(exported_models, tmp_path_factory):
    """The metrics URL of `offgraph update` on the model, following an empty spool."""
    work = tmp_path_factory.mktemp("update")
    (work / "spool").mkdir()
    port = free_port()
    cmd = [sys.executable, "-m", "offgraph.cli", "update", "--models", str(exported_models), "--model", MODEL]
    cmd += ["--source", f"spool:{work / 'spool'}", "--metrics-port", str(port)]
    with open(work / "update.log", "w") as logf:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, (work / "update.log").read_text()[-3000:]
        try:
            return httpx.get(url + "/metrics", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, 60, "the updater's /metrics", interval=0.1)
        yield url
    finally:
        stop_server(proc, 30)


@pytest.fixture(scope="session")
def published(served, updater) -> set[str]:
    """Every series name the server's and the updater's /metrics declare."""
    return published_series(httpx.get(served + "/metrics", timeout=10).text) | published_series(
        httpx.get(updater + "/metrics", timeout=10).text
    )


@pytest.fixture(scope="session")
def prometheus(served, updater, tmp_path_factory):
    """A real Prometheus scraping the server (job offgraph-serve) and the updater (job offgraph-update)
    every second, with the kit's alert rules evaluated every second."""
    target = {u: u.removeprefix("http://") for u in (served, updater)}
    config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: offgraph-serve
    static_configs: [{{targets: ["{target[served]}"]}}]
  - job_name: offgraph-update
    static_configs: [{{targets: ["{target[updater]}"]}}]
"""
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), config)
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()

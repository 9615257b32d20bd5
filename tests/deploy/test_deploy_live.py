"""The operator's kit against the real thing: a real exported model served by a real `offgraph serve`, a real
`offgraph update` publishing its metrics, and a real Prometheus scraping both with the kit's rules loaded.
Every rule and dashboard query names only series they publish, the rules load and evaluate, and each
dashboard query runs."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from deploy_helpers import (
    DASHBOARD,
    PROMETHEUS_OWN,
    REPO,
    RULES,
    Prometheus,
    alerts,
    dashboard_queries,
    metric_names,
    published_series,
)
from polling import wait_for
from server_helpers import serve_process, stop_server, wait_ready

from offgraph.testing.harness import free_port

MODEL = "synth"

# Grafana's variables, as a query of the dashboard sees them with "All" selected
VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$model": ".*", "$job": ".*"}


def _resolved(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


@pytest.fixture(scope="module")
def exported_models(tmp_path_factory):
    """MODELS holding ``synth/1``: a small version written by the exporter's path (seeded random weights)."""
    from offgraph.export.synth import synth_version
    from offgraph.export.synth_config import SynthConfig

    models = tmp_path_factory.mktemp("deploy") / "models"
    synth_version(models / MODEL / "1", SynthConfig(rows=40_000, dim=8, shards=1, workers=1), progress=False)
    return models


@pytest.fixture(scope="module")
def served(exported_models, tmp_path_factory):
    """The base URL of `offgraph serve` on the model, ready (every model loaded)."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, url = serve_process(exported_models, log, "--memory-mb", "64", "--poll-seconds", "0.5")
    try:
        wait_ready(url, 120, proc, log=str(log))
        yield url
    finally:
        stop_server(proc, 60)


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def published(served, updater) -> set[str]:
    """Every series name the server's and the updater's /metrics declare."""
    return published_series(httpx.get(served + "/metrics", timeout=10).text) | published_series(
        httpx.get(updater + "/metrics", timeout=10).text
    )


@pytest.fixture(scope="module")
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


def test_rules_name_only_published_series(published):
    for alert, expr in alerts().items():
        names = metric_names(expr)
        assert names, (alert, expr)
        assert names <= published | PROMETHEUS_OWN, (alert, sorted(names - published - PROMETHEUS_OWN))


def test_prometheus_scrapes_the_server_and_loads_the_rules(prometheus):
    def targets_up() -> dict | None:
        active = prometheus.api("targets")["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in active}
        return health if health == {"offgraph-serve": "up", "offgraph-update": "up"} else None

    wait_for(targets_up, 30, "both targets scraped and up", interval=0.2)

    def series(query: str) -> list:
        return prometheus.api("query", query=query)["result"]

    loaded = wait_for(lambda: series('offgraph_model_loaded_version{job="offgraph-serve"}'), 30, "a server series")
    assert [(r["metric"]["model"], r["value"][1]) for r in loaded] == [("synth", "1")], loaded
    assert series('process_resident_memory_bytes{job="offgraph-serve"} > 0'), "no process_* series of the server"
    assert series('offgraph_update_live_version{job="offgraph-update"} == 1'), "no updater series"

    def rules_evaluated() -> list | None:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None

    rules = wait_for(rules_evaluated, 30, "every rule loaded and evaluated without error", interval=0.2)
    assert {r["name"] for r in rules} == set(alerts())
    assert {r["type"] for r in rules} == {"alerting"}
    # a healthy server and an idle updater: nothing fires
    assert [r["name"] for r in rules if r["state"] == "firing"] == []


def test_dashboard_queries_name_only_published_series(published):
    queries = dashboard_queries()
    assert len(queries) > 10
    for title, expr in queries:
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= published | PROMETHEUS_OWN, (title, sorted(names - published - PROMETHEUS_OWN))


def test_dashboard_queries_run_in_prometheus(prometheus):
    for _, expr in dashboard_queries():
        prometheus.api("query", query=_resolved(expr))  # a 400 (bad PromQL) fails, naming the query
    template_queries = [
        v["definition"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"] if "definition" in v
    ]
    assert template_queries and all(q.startswith("label_values(") for q in template_queries)


def test_prometheus_scrapes_the_per_arm_series(served, prometheus):
    # every key missing is no value: the model scores it (outside any experiment: arm "none")
    r = httpx.post(f"{served}/v1/models/{MODEL}:score", json={"request": {}, "candidates": [{}, {}]}, timeout=30)
    assert r.status_code == 200 and "arm" not in r.json(), r.text

    def arm_series() -> list:
        query = 'offgraph_arm_scores_count{job="offgraph-serve", arm="none"}'
        return prometheus.api("query", query=query)["result"]

    found = wait_for(arm_series, 30, "the per-arm series scraped", interval=0.2)
    assert [(s["metric"]["model"], s["metric"]["version"], s["value"][1]) for s in found] == [(MODEL, "1", "2")]

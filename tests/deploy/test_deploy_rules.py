"""deploy/prometheus: the alert rules pass promtool, fire as their unit tests say, name only series the
server and the updater publish, and load in a real Prometheus that scrapes a real server."""

from __future__ import annotations

import subprocess

import yaml
from deploy_helpers import PROMETHEUS_OWN, RULE_TESTS, RULES, metric_names, tool
from polling import wait_for


def _alerts() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def test_promtool_checks_the_rules():
    out = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in out.stdout, out.stdout


def test_promtool_unit_tests_of_the_alerts():
    out = subprocess.run(
        [tool("promtool"), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_the_kit_alerts_on_what_operators_watch():
    wanted = {  # what each alert watches -> a series it must read
        "OffgraphFreshnessLagHigh": "offgraph_update_lag_seconds",
        "OffgraphConsumerLagHigh": "offgraph_update_consumer_lag_seconds",
        "OffgraphStoreErrors": "offgraph_store_errors_total",
        "OffgraphDeadLetters": "offgraph_update_files_dead_lettered_total",
        "OffgraphScoreLatencyP99High": "offgraph_request_latency_seconds_bucket",
        "OffgraphHigh5xxRate": "offgraph_http_errors_total",
        "OffgraphModelNotServing": "offgraph_model_loaded_version",
    }
    alerts = _alerts()
    for alert, series in wanted.items():
        assert series in metric_names(alerts[alert]), (alert, alerts.get(alert))


def test_rules_name_only_published_series(published):
    for alert, expr in _alerts().items():
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
    assert {r["name"] for r in rules} == set(_alerts())
    assert {r["type"] for r in rules} == {"alerting"}
    # a healthy server and an idle updater: nothing fires
    assert [r["name"] for r in rules if r["state"] == "firing"] == []

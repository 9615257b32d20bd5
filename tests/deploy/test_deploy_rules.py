"""deploy/prometheus: the alert rules pass promtool, fire as their unit tests say, and watch what operators need
(against a real server, updater and Prometheus: test_deploy_live.py)."""

from __future__ import annotations

import subprocess

from deploy_helpers import RULE_TESTS, RULES, alerts, metric_names, tool


def test_promtool_checks_the_rules():
    out = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout, out.stdout


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
        "OffgraphCanaryLatencyP99High": "offgraph_arm_latency_seconds_bucket",
    }
    rules = alerts()
    for alert, series in wanted.items():
        assert series in metric_names(rules[alert]), (alert, rules.get(alert))

"""deploy/grafana: every dashboard query names only series that the server's or the updater's /metrics
publish, and is PromQL that a real Prometheus runs."""

from __future__ import annotations

import json

from deploy_helpers import DASHBOARD, PROMETHEUS_OWN, metric_names

# Grafana's variables, as a query of the dashboard sees them with "All" selected
VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$model": ".*", "$job": ".*"}


def _queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' nested panels included."""
    dash = json.loads(DASHBOARD.read_text())
    panels = [*dash["panels"], *(p for row in dash["panels"] for p in row.get("panels", []))]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def _resolved(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def test_metric_names_of_promql():
    expr = (
        'sum by (model, le) (rate(offgraph_a_bucket{model=~"$model", route="/v1/{name}:x"}[$__rate_interval]))'
        ' / on (job) group_left histogram_quantile(0.99, b_total offset 5m) and up{job="x"} > bool 1e3'
    )
    assert metric_names(expr) == {"offgraph_a_bucket", "b_total", "up"}


def test_the_dashboard_shows_what_operators_watch():
    names = set().union(*(metric_names(e) for _, e in _queries()))
    for series in (
        "offgraph_request_latency_seconds_count",  # request rate
        "offgraph_request_latency_seconds_bucket",  # p50 / p99
        "offgraph_http_errors_total",
        "offgraph_store_errors_total",
        "offgraph_update_lag_seconds",  # freshness
        "offgraph_store_freshness_seconds",
        "offgraph_update_consumer_lag_seconds",
        "offgraph_memory_used_bytes",
        "offgraph_memory_budget_bytes",
        "offgraph_row_cache_hits_total",
        "process_resident_memory_bytes",
    ):
        assert series in names, series


def test_dashboard_queries_name_only_published_series(published):
    queries = _queries()
    assert len(queries) > 10
    for title, expr in queries:
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= published | PROMETHEUS_OWN, (title, sorted(names - published - PROMETHEUS_OWN))


def test_dashboard_queries_run_in_prometheus(prometheus):
    for _, expr in _queries():
        prometheus.api("query", query=_resolved(expr))  # a 400 (bad PromQL) fails, naming the query
    template_queries = [
        v["definition"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"] if "definition" in v
    ]
    assert template_queries and all(q.startswith("label_values(") for q in template_queries)

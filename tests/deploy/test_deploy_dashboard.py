"""deploy/grafana: the dashboard shows what operators watch, and the metric names of PromQL are read right
(its queries against a real server, updater and Prometheus: test_deploy_live.py)."""

from __future__ import annotations

from deploy_helpers import dashboard_queries, metric_names


def test_metric_names_of_promql():
    expr = (
        'sum by (model, le) (rate(offgraph_a_bucket{model=~"$model", route="/v1/{name}:x"}[$__rate_interval]))'
        ' / on (job) group_left histogram_quantile(0.99, b_total offset 5m) and up{job="x"} > bool 1e3'
    )
    assert metric_names(expr) == {"offgraph_a_bucket", "b_total", "up"}


def test_the_dashboard_shows_what_operators_watch():
    names = set().union(*(metric_names(e) for _, e in dashboard_queries()))
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
        "offgraph_arm_requests_total",  # per experiment arm
        "offgraph_arm_latency_seconds_bucket",
        "offgraph_arm_errors_total",
        "offgraph_arm_scores_bucket",
    ):
        assert series in names, series

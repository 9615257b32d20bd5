"""Helpers of the operator's kit tests (deploy/): the tools they run, a real Prometheus on loopback,
and the metric names that PromQL expressions and /metrics pages hold."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import yaml
from parts import PROGRAMS, need
from polling import wait_for

from offgraph.testing.harness import free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "offgraph-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "offgraph-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "offgraph-dashboard.json"
SYSTEMD = DEPLOY / "systemd"

PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus writes itself for each scrape target, which rules and panels may use."""

# the suffixes of each metric type's samples in the exposition text
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "untyped": ("",),
}


def alerts() -> dict[str, str]:
    """Alert name -> PromQL of every rule in the rules file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel of the dashboard, rows' nested panels included."""
    dash = json.loads(DASHBOARD.read_text())
    panels = [*dash["panels"], *(p for row in dash["panels"] for p in row.get("panels", []))]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def tool(name: str) -> str:
    """The path of a command the test needs, one of a part's (tests/parts.py: `make test` installs it; a
    missing one fails, unless OFFGRAPH_TEST_WITHOUT names its part)."""
    need(next(p.name for p in PROGRAMS.values() if name in p.commands))
    path = shutil.which(name)
    assert path is not None, name
    return path


def published_series(exposition: str) -> set[str]:
    """Every series name a /metrics page declares: each ``# TYPE`` family with its type's suffixes
    (a labelled family with no sample yet is declared all the same)."""
    out = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
        out |= {base + s for s in SUFFIXES.get(kind, ("",))}
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'" + r"|`[^`]*`")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")
PROMQL_WORDS = frozenset({"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers,
    ranges and grouping clauses that are not function calls or keywords."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("{}", text)
    text = _RANGE.sub("[]", text)
    text = _CLAUSE.sub(" ", text)
    return {n for n in _IDENT.findall(text) if n.lower() not in PROMQL_WORDS}


class Prometheus:
    """A real Prometheus on a free loopback port with a data directory of its own; ``stop`` kills it by PID."""

    def __init__(self, workdir: Path, config: str):
        self.binary = tool("prometheus")
        self.dir = workdir
        (workdir / "prometheus.yml").write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30) -> None:
        with open(self.log, "w") as logf:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, timeout_s, f"Prometheus ready on {self.url}", interval=0.1)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def api(self, path: str, **params) -> dict | list:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (path, params, r.text)
        return body["data"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

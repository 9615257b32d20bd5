"""bench.serve_latency's arguments and its summary (medians over alternations, ratios, acceptance) on made-up cells."""

import numpy as np
import pytest

from bench.lib.bodies import candidate_rows
from bench.lib.latency_table import Roles, acceptance, acceptance_lines, medians, ratios, rotation, table_lines
from bench.serve_latency import parse_args, serve_module

ROLES = Roles(new="new:m", ingraph="in-graph", old="old:m", ids="new:m ids-only")


def _cell(server, n, c, p50, rps, cpu=3.0, p99=None):
    return {
        "server": server,
        "n": n,
        "concurrency": c,
        "p50_ms": p50,
        "p99_ms": p99 if p99 is not None else 2 * p50,
        "rps": rps,
        "server_cpu_ms_per_request": cpu,
        "requests": 100,
        "errors": {},
    }


def _run():
    """Three alternations; the middle value of each server's cells is the one the summary must keep."""
    cells = []
    for k, (new, old, ig) in enumerate([(4.0, 6.0, 10.0), (100.0, 5.0, 9.0), (3.0, 7.0, 11.0)]):
        for n in (50, 200, 1000, 2000):
            for c in (1, 8):
                scale = n / 50
                cells.append(_cell("new:m", n, c, new * scale, 1000 / (new * scale), cpu=0.1 * n / 50 + k))
                cells.append(_cell("old:m", n, c, old * scale, 1000 / (old * scale)))
                cells.append(_cell("in-graph", n, c, ig * scale, 1000 / (ig * scale)))
        cells.append(_cell("new:m ids-only", 1000, 1, [4.0, 4.0, 100.0][k] * 20, 10.0))
    return cells


def test_medians_over_alternations_ignore_one_outlier():
    rows = medians(_run())
    new = next(r for r in rows if r["server"] == "new:m" and r["n"] == 50 and r["concurrency"] == 1)
    assert new["alternations"] == 3 and new["requests"] == 300
    assert new["p50_ms"] == 4.0  # median of 4, 100, 3
    assert new["server_cpu_ms_per_request"] == pytest.approx(1.1)  # median of 0.1, 1.1, 2.1
    ig = next(r for r in rows if r["server"] == "in-graph" and r["n"] == 1000 and r["concurrency"] == 8)
    assert ig["p50_ms"] == 10.0 * 20


def test_ratios_new_over_ingraph_and_over_old():
    r = ratios(medians(_run()), ROLES)["N=200,c=8"]
    assert r["p50_new/ingraph"] == pytest.approx(4.0 / 10.0)
    assert r["p50_new/old"] == pytest.approx(4.0 / 6.0)
    assert r["rps_new/ingraph"] == pytest.approx(10.0 / 4.0)  # rps medians: 1000/(4s), 1000/(10s) per scale


def test_acceptance_checks_pass_and_fail_on_the_limits():
    checks = {c["check"]: c for c in acceptance(medians(_run()), ROLES)}
    # CPU: median over alternations of 0.1 * N / 50 + k: 3.0 at N=1000 (<= 5), 5.0 at N=2000 (<= 5), both pass
    assert checks["N=1000 c=1: server CPU per request (ms)"]["value"] == pytest.approx(3.0)
    assert checks["N=2000 c=8: server CPU per request (ms)"]["ok"] is True
    # N = 2000 is held to the same CPU per candidate as N = 1000: twice the limit a request
    assert checks["N=2000 c=8: server CPU per request (ms)"]["limit"] == pytest.approx(
        2 * checks["N=1000 c=8: server CPU per request (ms)"]["limit"]
    )
    assert checks["N=1000 c=8: throughput new/in-graph"]["value"] == pytest.approx(2.5)
    assert checks["N=1000 c=8: throughput new/in-graph"]["ok"] is True
    assert checks["N=1000 c=1: p50 new/in-graph"]["ok"] is True  # 0.4 <= 0.7
    assert checks["N=50 c=1: p50 new/old"]["value"] == pytest.approx(4.0 / 6.0)
    ids = checks["N=1000 c=1: p50 ids-only/every feature"]
    assert ids["value"] == pytest.approx(1.0) and ids["ok"] is True  # median 4*20 over new's 4*20
    assert all(c["ok"] for c in checks.values())


def test_acceptance_fails_when_new_is_slower_and_says_what_was_not_measured():
    cells = [c for c in _run() if c["server"] != "old:m" and c["n"] != 2000]
    for c in cells:
        if c["server"] == "new:m" and c["n"] == 50:
            c["p50_ms"] *= 3  # 12 vs in-graph's 10: over 0.8
    checks = {c["check"]: c for c in acceptance(medians(cells), ROLES)}
    assert checks["N=50 c=1: p50 new/in-graph"]["ok"] is False
    assert checks["N=50 c=1: p50 new/old"]["ok"] is None
    assert checks["N=2000 c=1: p50 new/in-graph"]["ok"] is None
    lines = acceptance_lines(list(checks.values()))
    assert "  N=50 c=1: p50 new/in-graph <= 0.8: 1.200 FAIL" in lines
    assert "  N=2000 c=8: throughput new/in-graph >= 1.5: not measured" in lines


def test_table_has_a_line_per_cell_with_every_server():
    lines = table_lines(medians(_run()), ROLES)
    assert len(lines) == 2 + 4 * 2
    line = next(x for x in lines if x.split()[:2] == ["1000", "1"])
    assert "80.00 / 120.00 / 200.00 / 80.00" in line  # p50 new / old / in-graph / ids-only
    assert line.split("|")[-2].split() == ["0.40", "0.67"]  # p50 new/in-graph, new/old


def test_rotation_puts_each_server_first_once():
    servers = ["new", "old", "in-graph"]
    assert [rotation(servers, k)[0] for k in range(3)] == servers
    assert rotation(servers, 4) == ["old", "in-graph", "new"]


def test_arguments(tmp_path):
    a = parse_args(["--run", "R", "--models", "M", "--data", "D", "--out", "O"])
    assert a.sizes == [1, 50, 200, 1000, 2000] and a.concurrency == [1, 8] and a.alternations == 3
    assert a.baseline_repo is None and a.model_names == ["sint8", "sfp32"]
    with pytest.raises(SystemExit):  # not a checkout of the code
        parse_args(["--run", "R", "--models", "M", "--data", "D", "--out", "O", "--baseline-repo", str(tmp_path)])
    with pytest.raises(SystemExit):
        parse_args(["--run", "R", "--models", "M", "--data", "D", "--out", "O", "--alternations", "0"])
    (tmp_path / "offgraph_cli.py").write_text("")  # the old layout
    a = parse_args(
        [
            "--run",
            "R",
            "--models",
            "M",
            "--data",
            "D",
            "--out",
            "O",
            "--baseline-repo",
            str(tmp_path),
            "--sizes",
            "50,1000",
        ]
    )
    assert a.baseline_repo == tmp_path.resolve() and a.sizes == [50, 1000]
    assert serve_module(a.baseline_repo) == "offgraph_cli"
    (tmp_path / "offgraph_cli.py").unlink()
    (tmp_path / "offgraph" / "cli").mkdir(parents=True)
    assert serve_module(tmp_path) == "offgraph.cli"


def test_candidates_are_distinct_movies_and_past_the_catalogue_every_movie_then_repeats():
    rng = np.random.default_rng(0)
    few = candidate_rows(rng, 10, 7)
    assert len(few) == 7 and len(set(few.tolist())) == 7
    many = candidate_rows(rng, 10, 25)
    counts = np.bincount(many, minlength=10)
    assert len(many) == 25 and counts.min() >= 2 and counts.max() == 3  # 10 + 10 + 5 distinct

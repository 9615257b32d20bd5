"""What ``bench.serve_latency`` reports from its cells: medians over alternations, ratios, acceptance lines.

A cell is one (server, N, concurrency, alternation) measurement of ``bench.serve_latency.run_cell``. The
servers of a run are named by their roles: the new code (``new``), the old code (``old``, from
``--baseline-repo``), the in-graph baseline (``ingraph``), the new code sent ids-only bodies
(``ids``) and the new code's gRPC clients on the same bodies (``grpc``: TF Serving ``Predict``, KServe ``ModelInfer``). Pure functions of the numbers, so that they are tested on synthetic cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METRICS = ("p50_ms", "p99_ms", "rps", "server_cpu_ms_per_request")

# the acceptance table: what each line checks -> its limit (the cells each applies to: ``acceptance``)
LIMITS = {
    # server CPU per request at N = 1000 (ms); N = 2000 gets the same CPU per candidate (5 us), 10 ms a request
    "server_cpu_ms_per_request_at_n1000": 5.0,
    "throughput_new_over_ingraph_at_least": 1.5,  # c = 8, N = 1000 and 2000
    "p50_new_over_ingraph_large_n": 0.7,  # c = 1, N = 1000 and 2000
    "p50_new_over_ingraph_small_n": 0.8,  # c = 1 and 8, N = 50 and 200
    "p50_new_over_old": 1.0,  # c = 1 and 8, N = 50 and 200: no slower than the old code
    "p50_ids_only_over_every_feature": 1.1,  # N = 1000, c = 1
    # each gRPC protocol against :score on the same server and bodies, N = 200 and 1000, c = 1 and 8 (issue 51)
    "server_cpu_grpc_over_score": 1.0,
    "p50_grpc_over_score": 1.0,
}
GRPC_SIZES = (200, 1000)
CPU_LIMIT_N = 1000


@dataclass(frozen=True)
class Roles:
    """Server labels of a run; ``old`` and ``ids`` are None when not measured."""

    new: str
    ingraph: str
    old: str | None = None
    ids: str | None = None
    grpc: tuple[str, ...] = ()


def rotation(servers: list, k: int) -> list:
    """The order of alternation ``k``: the servers rotated by ``k``, so each is first as often as the others."""
    if not servers:
        return []
    k %= len(servers)
    return servers[k:] + servers[:k]


def medians(cells: list[dict]) -> list[dict]:
    """One row per (server, N, concurrency): the median of each metric over its alternations."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["server"], c["n"], c["concurrency"]), []).append(c)
    out = []
    for (server, n, conc), rs in groups.items():
        row: dict = {"server": server, "n": n, "concurrency": conc, "alternations": len(rs)}
        for m in METRICS:
            row[m] = float(np.median([r[m] for r in rs]))
        row["requests"] = sum(r["requests"] for r in rs)
        row["errors"] = sum(sum(r.get("errors", {}).values()) for r in rs)
        out.append(row)
    return sorted(out, key=lambda r: (r["n"], r["concurrency"], r["server"]))


def find(rows: list[dict], server: str | None, n: int, conc: int) -> dict | None:
    if server is None:
        return None
    return next((r for r in rows if r["server"] == server and r["n"] == n and r["concurrency"] == conc), None)


def ratio(rows: list[dict], a: str | None, b: str | None, n: int, conc: int, metric: str) -> float | None:
    """``metric`` of server ``a`` over server ``b`` in cell (n, conc); None where either was not measured."""
    ra, rb = find(rows, a, n, conc), find(rows, b, n, conc)
    if ra is None or rb is None or not rb[metric]:
        return None
    return ra[metric] / rb[metric]


def ratios(rows: list[dict], roles: Roles) -> dict[str, dict[str, float | None]]:
    """Per cell: new / in-graph and new / old for p50, p99 and throughput."""
    out: dict[str, dict[str, float | None]] = {}
    for n, conc in sorted({(r["n"], r["concurrency"]) for r in rows}):
        cell: dict[str, float | None] = {}
        for other, name in ((roles.ingraph, "ingraph"), (roles.old, "old")):
            for m, short in (("p50_ms", "p50"), ("p99_ms", "p99"), ("rps", "rps")):
                cell[f"{short}_new/{name}"] = ratio(rows, roles.new, other, n, conc, m)
        out[f"N={n},c={conc}"] = cell
    return out


def _check(name: str, value: float | None, limit: float, at_most: bool) -> dict:
    ok = None if value is None else (value <= limit if at_most else value >= limit)
    return {"check": name, "value": value, "limit": limit, "at_most": at_most, "ok": ok}


def acceptance(rows: list[dict], roles: Roles) -> list[dict]:
    """The acceptance checks (``LIMITS``) on the medians; ``ok`` None where a cell was not measured."""
    out = []
    for n in (1000, 2000):
        for conc in (1, 8):
            cpu = find(rows, roles.new, n, conc)
            out.append(
                _check(
                    f"N={n} c={conc}: server CPU per request (ms)",
                    cpu["server_cpu_ms_per_request"] if cpu else None,
                    LIMITS["server_cpu_ms_per_request_at_n1000"] * n / CPU_LIMIT_N,
                    True,
                )
            )
        out.append(
            _check(
                f"N={n} c=8: throughput new/in-graph",
                ratio(rows, roles.new, roles.ingraph, n, 8, "rps"),
                LIMITS["throughput_new_over_ingraph_at_least"],
                False,
            )
        )
        out.append(
            _check(
                f"N={n} c=1: p50 new/in-graph",
                ratio(rows, roles.new, roles.ingraph, n, 1, "p50_ms"),
                LIMITS["p50_new_over_ingraph_large_n"],
                True,
            )
        )
    for n in (50, 200):
        for conc in (1, 8):
            out.append(
                _check(
                    f"N={n} c={conc}: p50 new/in-graph",
                    ratio(rows, roles.new, roles.ingraph, n, conc, "p50_ms"),
                    LIMITS["p50_new_over_ingraph_small_n"],
                    True,
                )
            )
            out.append(
                _check(
                    f"N={n} c={conc}: p50 new/old",
                    ratio(rows, roles.new, roles.old, n, conc, "p50_ms"),
                    LIMITS["p50_new_over_old"],
                    True,
                )
            )
    out.append(
        _check(
            "N=1000 c=1: p50 ids-only/every feature",
            ratio(rows, roles.ids, roles.new, 1000, 1, "p50_ms"),
            LIMITS["p50_ids_only_over_every_feature"],
            True,
        )
    )
    for g in roles.grpc:
        for n in GRPC_SIZES:
            for conc in (1, 8):
                for metric, key, what in (
                    ("server_cpu_ms_per_request", "server_cpu_grpc_over_score", "server CPU per request"),
                    ("p50_ms", "p50_grpc_over_score", "p50"),
                ):
                    out.append(
                        _check(
                            f"N={n} c={conc}: {what} {g.split(' ', 1)[-1]}/:score",
                            ratio(rows, g, roles.new, n, conc, metric),
                            LIMITS[key],
                            True,
                        )
                    )
    return out


def acceptance_lines(checks: list[dict]) -> list[str]:
    lines = []
    for c in checks:
        bound = f"{'<=' if c['at_most'] else '>='} {c['limit']:g}"
        if c["ok"] is None:
            lines.append(f"  {c['check']} {bound}: not measured")
        else:
            lines.append(f"  {c['check']} {bound}: {c['value']:.3f} {'PASS' if c['ok'] else 'FAIL'}")
    return lines


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table_lines(rows: list[dict], roles: Roles) -> list[str]:
    """One line per cell: p50, p99, req/s and server CPU of each server (new / old / in-graph / ids-only)
    and the ratios new/in-graph and new/old."""
    servers = [s for s in (roles.new, roles.old, roles.ingraph, roles.ids, *roles.grpc) if s is not None]
    head = ["N", "c", "p50 ms", "p99 ms", "req/s", "CPU ms/req", "p50 new/ig", "new/old", "req/s new/ig", "new/old"]
    body = []
    for n, conc in sorted({(r["n"], r["concurrency"]) for r in rows}):
        line = [str(n), str(conc)]
        for m, spec in (("p50_ms", ".2f"), ("p99_ms", ".2f"), ("rps", ".1f"), ("server_cpu_ms_per_request", ".2f")):
            vals = [find(rows, s, n, conc) for s in servers]
            line.append(" / ".join(_fmt(v[m] if v else None, spec) for v in vals))
        line += [
            _fmt(ratio(rows, roles.new, o, n, conc, m), ".2f")
            for m in ("p50_ms", "rps")
            for o in (roles.ingraph, roles.old)
        ]
        body.append(line)
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]

    def fmt(cols: list[str]) -> str:
        cells = [c.rjust(w) for c, w in zip(cols, widths)]
        return (
            " ".join(cells[:2])
            + " | "
            + " | ".join(cells[2:6])
            + " | "
            + " ".join(cells[6:8])
            + " | "
            + " ".join(cells[8:])
        )

    return ["medians over alternations; per column: " + " / ".join(servers), fmt(head), *(fmt(b) for b in body)]

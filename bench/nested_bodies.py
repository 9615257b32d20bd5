"""Deeply nested JSON bodies beside a valid client: refused fast, naming the limit, the valid client unaffected.

Issue 48's acceptance line: every route that takes a body answers a body nested 10, 1,000 and 100,000 deep
with a 4xx naming the limit (``body_limit.MAX_JSON_DEPTH``) in under 100 ms, and a parallel valid client's
p99 is unaffected. One ``offgraph serve`` subprocess on 127.0.0.1 serves a small MovieLens DeepFM (built here:
1 epoch on the first ``--rows`` ratings, tables 1/50 of the example's, unless ``--models`` names a MODELS dir
holding ``ml/``). First a probe: one body of each depth (10, 1,000, 100,000) on every body route (``:score``,
``:predict``, ``:load`` and a label's PUT, the last two with the admin token). Then a valid client (closed
loop, one keep-alive connection, N = ``--n`` candidates, every answer a 200) sends ``--requests`` requests
in three conditions, alternated ``--alternations`` times (A, B, C, A, B, C, ...):

* ``alone`` (A): nothing else;
* ``deep`` (B): beside a flood (another process, ``--flood-connections`` connections) of 100,000-deep
  bodies: to ``:score`` mostly, 1 in 10 to ``:predict``, 1 in 20 to ``:load`` (admin). ``--flood-rate R``
  paces the whole flood open-loop at R requests a second (request i due at start + i/R, on a schedule that
  does not drift; a connection that falls behind sends at once); 0 (the default) is closed loop, each
  connection sending as soon as its last answer came;
* ``invalid`` (C): beside the same flood of bodies of the same sizes that are invalid JSON, not deep (the
  nested value's bytes replaced by ``@``): what any refused body costs.

Reported: per condition the medians over its runs of the valid client's p50 and p99, the p99 ratios B/A and
B/C, the machine's own noise (the spread of A's p99 across A's runs, min to max, against which B/A reads), and every flood answer's status, whether it names the limit, and its client-observed latency (p50,
max). The deep answers must all be 4xx naming the limit in under 100 ms (else exit 1). Loopback only;
every loop is bounded (requests, and ``--flood-max-s`` per flood). Writes ``OUT/nested_bodies.json``,
``.md`` and ``.png``.

    python -m bench.nested_bodies --out bench/results/nested-bodies
    python -m bench.nested_bodies --flood-rate 50 --requests 2000 --alternations 5 --out bench/results/nested-bodies
    python -m bench.nested_bodies --quick --out /tmp/nested
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.lib.report import write_report
from bench.lib.server import ADMIN_TOKEN, BenchServer
from offgraph.server.http.body_limit import MAX_JSON_DEPTH

MODEL = "ml"
DEPTHS = (10, 1000, 100_000)
FLOOD_DEPTH = 100_000
LIMIT_MS = 100.0
NAMED = f"nested deeper than {MAX_JSON_DEPTH} levels"
CONDITIONS = ("alone", "deep", "invalid")
SCORE = f"/v1/models/{MODEL}:score"
PREDICT = f"/v1/models/{MODEL}:predict"
LOAD = f"/v1/models/{MODEL}:load"
LABEL = f"/v1/models/{MODEL}/labels/canary"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REQ_COLS = ["user_id", "age", "gender", "occupation", "zip_prefix"]
ITEM_COLS = ["movie_id", "genres", "title_words", "release_year"]


def _log(msg: str) -> None:
    print(f"[nested {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_model(root: Path, rows: int):
    """MODELS with ml/1 (the tiny test model's recipe: 1 epoch, tables 1/50 of the example's); (MODELS, table)."""
    import pyarrow.parquet as pq
    import yaml

    from offgraph.data.datasets import build
    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    table = pq.read_table(build("movielens-100k", root / "data")).slice(0, rows)
    models = root / "models"
    if (models / MODEL / "1" / "manifest.json").exists():
        return models, table
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    spec = parse_spec(raw, source="bench movielens")
    train_run(spec, table, TrainConfig(epochs=1, batch_size=512, split="per-key-time"), root / "run", progress=False)
    export_run(root / "run", models / MODEL / "1", shards=2, quant="fp32", progress=False)
    return models, table


def valid_bodies(table, n: int, count: int, seed: int) -> list[bytes]:
    """Full score bodies: a real user's request features x ``n`` real rows' item features."""
    cols = table.select(REQ_COLS + ITEM_COLS).to_pydict()
    rng = random.Random(seed)
    rows = len(cols["user_id"])
    out = []
    for _ in range(count):
        u = rng.randrange(rows)
        cands = [{c: cols[c][i] for c in ITEM_COLS} for i in rng.sample(range(rows), n)]
        body = {"request": {c: cols[c][u] for c in REQ_COLS}, "candidates": cands}
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def route_body(route: str, value: bytes) -> tuple[str, str, bytes, dict[str, str]]:
    """(method, path, body, headers) with ``value`` where the route reads a value."""
    if route == "score":
        return "POST", SCORE, b'{"candidates": [{"genres": ' + value + b"}]}", {}
    if route == "predict":
        return "POST", PREDICT, b'{"instances": [{"genres": ' + value + b"}]}", {}
    if route == "load":
        return "POST", LOAD, b'{"version": ' + value + b"}", ADMIN
    return "PUT", LABEL, b'{"version": ' + value + b"}", ADMIN


def flood_route(i: int) -> str:
    return "load" if i % 20 == 19 else "predict" if i % 10 == 5 else "score"


class Client:
    """One keep-alive HTTP/1.1 connection (``http.client``); reconnects after a closed connection."""

    def __init__(self, port: int):
        self.port = port
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, float]:
        t0 = time.perf_counter()
        try:
            self.c.request(method, path, body, {"Content-Type": "application/json", **headers})
            r = self.c.getresponse()
            payload = r.read()
            status = r.status
            if r.will_close:
                self.reconnect()
        except (OSError, http.client.HTTPException) as e:
            self.reconnect()
            return 0, repr(e).encode(), time.perf_counter() - t0
        return status, payload, time.perf_counter() - t0

    def reconnect(self) -> None:
        self.c.close()
        self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def close(self) -> None:
        self.c.close()


def flood(
    port: int, kind: str, connections: int, rate: float, max_requests: int, max_s: float, started, stop, out
) -> None:
    """(A process of its own.) ``connections`` loops of deep (or same-size invalid) bodies until ``stop``,
    ``max_requests`` in all or ``max_s`` seconds: closed loops if ``rate`` is 0, else request i sent at
    start + i / ``rate`` (the schedule's, not a sleep's, time: no drift); puts
    [(route, status, ms, names the limit, ms late on the schedule), ...] on ``out``."""
    value = nested(FLOOD_DEPTH) if kind == "deep" else b"@" * (2 * FLOOD_DEPTH)
    bodies = {r: route_body(r, value) for r in ("score", "predict", "load")}
    got: list[tuple[str, int, float, bool, float]] = []
    issued = 0
    lock = threading.Lock()
    t_start = time.monotonic()
    deadline = t_start + max_s

    def loop() -> None:
        nonlocal issued
        c = Client(port)
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                with lock:
                    if issued >= max_requests:
                        return
                    i = issued
                    issued += 1
                late = 0.0
                if rate > 0:
                    due = t_start + i / rate
                    wait = due - time.monotonic()
                    if wait > 0 and stop.wait(wait):
                        return
                    late = max(0.0, time.monotonic() - due)
                route = flood_route(i)
                status, payload, took = c.send(*bodies[route])
                got.append((route, status, took * 1e3, NAMED.encode() in payload, late * 1e3))
                started.set()
        finally:
            c.close()

    threads = [threading.Thread(target=loop) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    started.set()
    out.put(got)


def valid_run(port: int, bodies: list[bytes], requests: int, offset: int) -> list[float]:
    """``requests`` score requests, closed loop on one connection (after 10 not timed); ms each, all 200s."""
    c = Client(port)
    lat = []
    try:
        for k in range(10 + requests):
            status, payload, took = c.send("POST", SCORE, bodies[(offset + k) % len(bodies)], {})
            if status != 200:
                raise RuntimeError(f"valid request: HTTP {status}: {payload[:300]!r}")
            if k >= 10:
                lat.append(took * 1e3)
    finally:
        c.close()
    return lat


def run_condition(port: int, cond: str, bodies: list[bytes], args, k: int) -> dict:
    ctx = mp.get_context("spawn")
    proc = None
    if cond != "alone":
        started, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        proc = ctx.Process(
            target=flood,
            args=(
                port,
                cond,
                args.flood_connections,
                args.flood_rate,
                args.flood_max_requests,
                args.flood_max_s,
                started,
                stop,
                out,
            ),
        )
        proc.start()
        if not started.wait(60):
            raise RuntimeError("the flood did not get its first answer in 60 s")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        lat = valid_run(port, bodies, args.requests, k * args.requests)
    finally:
        wall = time.perf_counter() - t0
        flooded: list = []
        if proc is not None:
            stop.set()
            try:
                flooded = out.get(timeout=60)
            except queue.Empty:
                pass
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    a = np.asarray(lat)
    r: dict = {
        "condition": cond,
        "run": k,
        "requests": len(lat),
        "seconds": wall,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
        "loadavg_1m": load0,
        "flood": flood_stats(flooded) if proc is not None else None,
    }
    fl = r["flood"]
    if fl:
        fl["per_s"] = fl["requests"] / wall
    _log(
        f"{cond:7s} {k}: valid p50 {r['p50_ms']:6.1f}  p99 {r['p99_ms']:6.1f} ms ({len(lat)} in {wall:.1f} s)"
        + (
            f"; flood {fl['requests']} ({fl['per_s']:.0f}/s of valid time) statuses {fl['statuses']} "
            f"p50 {fl['p50_ms']:.1f} max {fl['max_ms']:.1f} ms, named {fl['named']}, late max {fl['late_max_ms']:.1f} ms"
            if fl
            else ""
        )
    )
    return r


def flood_stats(got: list[tuple[str, int, float, bool, float]]) -> dict:
    def stats(xs: list[tuple[str, int, float, bool, float]]) -> dict:
        ms = np.asarray([x[2] for x in xs]) if xs else np.zeros(1)
        statuses: dict[str, int] = {}
        for x in xs:
            statuses[str(x[1])] = statuses.get(str(x[1]), 0) + 1
        return {
            "requests": len(xs),
            "statuses": statuses,
            "named": sum(x[3] for x in xs),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()),
            "over_limit_ms": int((ms >= LIMIT_MS).sum()) if xs else 0,
        }

    out = stats(got)
    out["per_s"] = 0.0
    out["late_max_ms"] = max((x[4] for x in got), default=0.0)
    out["routes"] = {r: stats([x for x in got if x[0] == r]) for r in ("score", "predict", "load")}
    return out


def probe(port: int) -> list[dict]:
    """One body of each depth on every body route (a fresh connection each; the first answers' costs paid first)."""
    rows = []
    for rep in range(2):  # the first pass pays one-off costs (imports, the routes' first calls): reported, second
        for depth in DEPTHS:
            for route in ("score", "predict", "load", "label"):
                c = Client(port)
                status, payload, took = c.send(*route_body(route, nested(depth)))
                c.close()
                if rep:
                    rows.append(
                        {
                            "depth": depth,
                            "route": route,
                            "status": status,
                            "ms": took * 1e3,
                            "named": NAMED.encode() in payload,
                            "answer": payload[:200].decode(errors="replace"),
                        }
                    )
    return rows


def summary(runs: list[dict]) -> dict:
    out: dict = {}
    for cond in CONDITIONS:
        rs = [r for r in runs if r["condition"] == cond]
        out[cond] = {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "max_ms")}
    for other in ("alone", "invalid"):
        for q in ("p50_ms", "p99_ms"):
            out[f"deep_over_{other}_{q[:3]}"] = out["deep"][q] / out[other][q]
    # The machine's noise: how far A's p99 moves across A's own runs, to read B/A against.
    for cond in CONDITIONS:
        ps = [r["p99_ms"] for r in runs if r["condition"] == cond]
        out[cond]["p99_min_ms"], out[cond]["p99_max_ms"] = min(ps), max(ps)
    a99 = out["alone"]
    out["alone_p99_spread"] = a99["p99_max_ms"] / a99["p99_min_ms"]
    out["alone_p99_max_over_median"] = a99["p99_max_ms"] / a99["p99_ms"]
    out["alone_p99_min_over_median"] = a99["p99_min_ms"] / a99["p99_ms"]
    floods = {cond: [r["flood"] for r in runs if r["condition"] == cond] for cond in ("deep", "invalid")}
    out["flood"] = {
        cond: {
            "requests": sum(f["requests"] for f in fs),
            "named": sum(f["named"] for f in fs),
            "statuses": {
                s: sum(f["statuses"].get(s, 0) for f in fs) for s in sorted({s for f in fs for s in f["statuses"]})
            },
            "p50_ms_median": statistics.median(f["p50_ms"] for f in fs),
            "max_ms": max(f["max_ms"] for f in fs),
            "over_limit_ms": sum(f["over_limit_ms"] for f in fs),
            "per_s_median": statistics.median(f["per_s"] for f in fs),
            "late_max_ms": max(f.get("late_max_ms", 0.0) for f in fs),
            "routes": {
                route: {
                    "requests": sum(f["routes"][route]["requests"] for f in fs),
                    "named": sum(f["routes"][route]["named"] for f in fs),
                    "p50_ms_median": statistics.median(f["routes"][route]["p50_ms"] for f in fs),
                    "max_ms": max(f["routes"][route]["max_ms"] for f in fs),
                }
                for route in ("score", "predict", "load")
            },
        }
        for cond, fs in floods.items()
    }
    return out


def check(report: dict) -> list[str]:
    """The acceptance's refusals: every deep answer a 4xx naming the limit in under ``LIMIT_MS``."""
    bad = []
    for p in report["probe"]:
        if p["depth"] > MAX_JSON_DEPTH and not (400 <= p["status"] < 500 and p["named"] and p["ms"] < LIMIT_MS):
            bad.append(f"probe {p['route']} depth {p['depth']}: {p['status']} {p['ms']:.1f} ms {p['answer'][:120]}")
    d = report["summary"]["flood"]["deep"]
    not4xx = {s: n for s, n in d["statuses"].items() if not s.startswith("4")}
    if not4xx or d["named"] != d["requests"] or d["over_limit_ms"]:
        bad.append(
            f"flood: {d['requests']} deep bodies, {d['named']} naming the limit, statuses {d['statuses']}, "
            f"{d['over_limit_ms']} at {LIMIT_MS:g} ms or more (max {d['max_ms']:.1f} ms)"
        )
    return bad


def markdown(report: dict) -> str:
    a, s = report["args"], report["summary"]
    rate = a.get("flood_rate", 0.0)
    pace = f"paced open-loop at {rate:g} requests/s in all" if rate > 0 else "closed loop"
    lines = [
        f"    {report['command']}",
        "",
        f"{report['started']} - {report['finished']}, {report['machine']}. Valid client: closed loop, 1 connection, "
        f"N = {a['n']}, {a['requests']} requests a run; floods: {a['flood_connections']} connection(s) in another "
        f"process, {pace}, {FLOOD_DEPTH:,}-deep (B) or same-size invalid (C) bodies, 1 in 10 to :predict, 1 in 20 to :load "
        f"(admin). Medians of {a['alternations']} runs per condition, alternated.",
        "",
        "| condition | valid p50 ms | valid p99 ms | p99 min - max of runs | valid max ms |",
        "|---|---|---|---|---|",
    ]
    for cond, label in zip(CONDITIONS, ("A alone", "B beside deep bodies", "C beside invalid bodies")):
        m = s[cond]
        lines.append(
            f"| {label} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['p99_min_ms']:.1f} - {m['p99_max_ms']:.1f} | "
            f"{m['max_ms']:.1f} |"
        )
    lines += [
        "",
        f"p99 B/A x{s['deep_over_alone_p99']:.2f}, B/C x{s['deep_over_invalid_p99']:.2f}; "
        f"p50 B/A x{s['deep_over_alone_p50']:.2f}, B/C x{s['deep_over_invalid_p50']:.2f}",
        "",
        f"Noise: A's own p99 ranged x{s['alone_p99_min_over_median']:.2f} to x{s['alone_p99_max_over_median']:.2f} "
        f"of its median across its runs (max/min x{s['alone_p99_spread']:.2f}).",
        "",
        "| flood | route | requests | naming the limit | p50 ms (median of runs) | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for cond in ("deep", "invalid"):
        f = s["flood"][cond]
        lines.append(
            f"| {cond} | all ({f['per_s_median']:.0f}/s, at most {f['late_max_ms']:.1f} ms late; "
            f"statuses {f['statuses']}) | {f['requests']} | {f['named']} | "
            f"{f['p50_ms_median']:.1f} | {f['max_ms']:.1f} |"
        )
        for route, r in f["routes"].items():
            lines.append(
                f"| {cond} | {route} | {r['requests']} | {r['named']} | {r['p50_ms_median']:.1f} | {r['max_ms']:.1f} |"
            )
    lines += ["", "Probe (one body each, after a first pass):", "", "| depth | route | status | names the limit | ms |"]
    lines.append("|---|---|---|---|---|")
    for p in report["probe"]:
        lines.append(f"| {p['depth']:,} | {p['route']} | {p['status']} | {p['named']} | {p['ms']:.1f} |")
    lines += [
        "",
        "| run | condition | valid p50 | p99 | max | flood answers/s | loadavg 1m |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        fl = r["flood"]
        lines.append(
            f"| {r['run']} | {r['condition']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
            f"{fl['per_s'] if fl else 0:.0f} | {r['loadavg_1m']:.2f} |"
        )
    verdict = report["failures"] or ["every deep answer a 4xx naming the limit in under 100 ms"]
    lines += ["", *(f"- {v}" for v in verdict)]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for cond, mark in zip(CONDITIONS, ("o", "s", "^")):
        rs = [r for r in report["runs"] if r["condition"] == cond]
        x = np.arange(len(rs))
        (line,) = axes[0].plot(x, [r["p99_ms"] for r in rs], marker=mark, label=f"{cond}: p99")
        axes[0].plot(x, [r["p50_ms"] for r in rs], marker=mark, linestyle=":", color=line.get_color(), label="p50")
    rate = report["args"].get("flood_rate", 0.0)
    pace = f"flood {rate:g}/s" if rate > 0 else "closed-loop flood"
    axes[0].set_title(f"valid client, N = {report['args']['n']}, {pace} (ms)")
    axes[0].set_xlabel("alternation")
    routes = ("score", "predict", "load")
    s = report["summary"]["flood"]
    w = 0.2
    for j, (cond, key) in enumerate([(c, k) for c in ("deep", "invalid") for k in ("p50_ms_median", "max_ms")]):
        axes[1].bar(
            np.arange(3) + (j - 1.5) * w, [s[cond]["routes"][r][key] for r in routes], w, label=f"{cond}: {key[:3]}"
        )
    axes[1].axhline(LIMIT_MS, color="red", linestyle="--", linewidth=1, label=f"{LIMIT_MS:g} ms")
    axes[1].set_xticks(np.arange(3), routes)
    axes[1].set_title("flood answers, client-observed (ms)")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    sm = report["summary"]
    fig.suptitle(
        f"{FLOOD_DEPTH:,}-deep bodies beside a valid client: p99 B/A x{sm['deep_over_alone_p99']:.2f}, "
        f"B/C x{sm['deep_over_invalid_p99']:.2f} (A's own p99 spread x{sm['alone_p99_spread']:.2f})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", type=Path, help="MODELS holding ml/ (default: build one under --workdir)")
    ap.add_argument("--workdir", type=Path, help="where the model is built (default: a temporary dir)")
    ap.add_argument("--rows", type=int, default=8000, help="ratings to train the built model on")
    ap.add_argument("--n", type=int, default=50, help="candidates per valid request")
    ap.add_argument("--requests", type=int, default=1000, help="valid requests per run")
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--flood-connections", type=int, default=2)
    ap.add_argument(
        "--flood-rate",
        type=float,
        default=0.0,
        help="flood requests/s in all, open loop on a schedule (0: closed loop)",
    )
    ap.add_argument("--flood-max-requests", type=int, default=50_000, help="bound of one flood")
    ap.add_argument("--flood-max-s", type=float, default=120.0, help="bound of one flood, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a small run: 100 requests a run, 1 alternation")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.alternations = 100, 1
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="nested-bodies-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        if args.models:
            import pyarrow.parquet as pq

            from offgraph.data.datasets import build

            models = args.models
            table = pq.read_table(build("movielens-100k", work / "data")).slice(0, args.rows)
        else:
            models, table = build_model(work, args.rows)
        bodies = valid_bodies(table, args.n, 50, args.seed)
        _log(f"model and bodies: {time.perf_counter() - t:.0f}s")
        server = BenchServer(models, 1, work / "serve.log")
        try:
            _log(f"server ready in {server.wait_ready(300):.1f}s on port {server.port}")
            probes = probe(server.port)
            for p in probes:
                _log(
                    f"probe {p['route']:7s} depth {p['depth']:>7,}: {p['status']} in {p['ms']:.1f} ms, named {p['named']}"
                )
            runs = [
                run_condition(server.port, cond, bodies, args, k)
                for k in range(args.alternations)
                for cond in CONDITIONS
            ]
        finally:
            server.stop()
    report: dict = {
        "command": " ".join(["python -m bench.nested_bodies", *(argv if argv is not None else sys.argv[1:])]),
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "max_json_depth": MAX_JSON_DEPTH,
        "probe": probes,
        "runs": runs,
        "summary": summary(runs),
    }
    report["failures"] = check(report)
    write_report(args.out, "nested_bodies", report, markdown(report), plot)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

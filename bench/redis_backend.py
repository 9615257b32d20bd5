"""The redis store backend against RocksDB on the same machine: one synthetic version written twice (the
same seed, rows and shards), served by ``offgraph serve`` from each backend in turn.

A Redis Cluster of ``--masters`` masters with one replica each runs on loopback
(``offgraph.testing.redis_cluster``, Debian's redis-server). ``offgraph synth`` writes the version into
``W/rocksdb/scale/1`` (files) and ``W/redis/scale/1`` (rows in the cluster); the cluster's memory per row is
the masters' ``used_memory`` (INFO memory) added by the version, over its rows. Then, ``--alternations``
times, the backends' order rotated, a fresh one-worker server per backend: a warm-up, c1 (p50, p99) and c8
(throughput, p99) at N = ``--candidates`` over distinct Zipf bodies (``bench.lib.traffic``). Prints the
medians over alternations, the ratios redis / rocksdb and the acceptance line (c1 p99 <= 2x); writes
``OUT/redis_backend.json``, ``OUT/redis_backend.md`` and ``OUT/redis_backend.png``.

    python -m bench.redis_backend --rows 1e7 --workdir out/redis-bench --out bench/results/redis-backend
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.client import run_cell
from bench.lib.server import BenchServer
from bench.lib.traffic import bodies as to_bodies
from bench.lib.traffic import build_requests
from offgraph.cli.synth import count
from offgraph.testing.redis_cluster import redis_cluster

MODEL = "scale"
BACKENDS = ("rocksdb", "redis")
LIMITS = {"c1_p99_redis_over_rocksdb": 2.0}  # the acceptance table: redis c1 p99 <= 2x RocksDB's in the same run


def synth(out: Path, rows: int, shards: int, backend: str, seed: int, log: Path) -> float:
    """``offgraph synth`` of one version (a subprocess: its progress bar in ``log``); seconds it took."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "offgraph.cli", "synth", "--out", str(out), "--rows", str(rows)]
    cmd += ["--shards", str(shards), "--seed", str(seed), "--backend", backend]
    with open(log, "ab") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    return time.perf_counter() - t0


def cell(models: Path, backend: str, bodies: list[bytes], args, logs: Path, k: int) -> dict:
    """A fresh server of one backend: warm-up, then c1 and c8."""
    server = BenchServer(models, 1, logs / f"serve-{backend}-{k}.log")
    path = f"/v1/models/{MODEL}:score"
    n_warm, n_c1 = args.warmup_requests, args.c1_requests
    try:
        ready_s = server.wait_ready()
        loop = asyncio.new_event_loop()

        def measure(some: list[bytes], conc: int, most: int, seconds: float, warmup: int) -> dict:
            cell_ = run_cell(
                "127.0.0.1", server.port, path, some, conc, most, seconds, warmup, args.candidates, server.pid
            )
            return loop.run_until_complete(cell_)

        try:
            measure(bodies[:n_warm], 8, n_warm, 600, 1)  # warm-up: the row cache, TF, connections
            c1 = measure(bodies[n_warm : n_warm + n_c1], 1, n_c1, args.seconds, 1)
            c8 = measure(bodies[n_warm + n_c1 :], 8, args.c8_requests, args.seconds, 8)
        finally:
            loop.close()
        counters = server.counters()
    finally:
        server.stop()
    hits, misses = counters["row_hits"], counters["row_misses"]
    return {
        "backend": backend,
        "alternation": k,
        "ready_s": ready_s,
        "c1": c1,
        "c8": c8,
        "row_cache_hit_ratio": hits / (hits + misses) if hits + misses else None,
    }


def _med(runs: list[dict], backend: str, conc: str, key: str) -> float:
    return statistics.median(r[conc][key] for r in runs if r["backend"] == backend)


def summarize(runs: list[dict]) -> dict:
    med = {
        b: {
            "c1_p50_ms": _med(runs, b, "c1", "p50_ms"),
            "c1_p99_ms": _med(runs, b, "c1", "p99_ms"),
            "c8_rps": _med(runs, b, "c8", "rps"),
            "c8_p99_ms": _med(runs, b, "c8", "p99_ms"),
        }
        for b in BACKENDS
    }
    ratio = {k: med["redis"][k] / med["rocksdb"][k] for k in med["redis"]}
    return {
        "medians": med,
        "redis_over_rocksdb": ratio,
        "acceptance": {
            "c1_p99_ratio": ratio["c1_p99_ms"],
            "limit": LIMITS["c1_p99_redis_over_rocksdb"],
            "ok": ratio["c1_p99_ms"] <= LIMITS["c1_p99_redis_over_rocksdb"],
        },
    }


def markdown(report: dict) -> str:
    s, mem = report["summary"], report["cluster_memory"]
    lines = [
        f"# redis vs rocksdb backend: {report['rows']:,} rows, N = {report['candidates']}, "
        f"{report['masters']} masters + replicas, {report['alternations']} alternations (medians)",
        "",
        "| backend | c1 p50 ms | c1 p99 ms | c8 req/s | c8 p99 ms |",
        "|---|---|---|---|---|",
    ]
    for b in BACKENDS:
        m = s["medians"][b]
        lines.append(
            f"| {b} | {m['c1_p50_ms']:.2f} | {m['c1_p99_ms']:.2f} | {m['c8_rps']:.0f} | {m['c8_p99_ms']:.2f} |"
        )
    r = s["redis_over_rocksdb"]
    lines.append(
        f"| redis / rocksdb | {r['c1_p50_ms']:.2f}x | {r['c1_p99_ms']:.2f}x | {r['c8_rps']:.2f}x | {r['c8_p99_ms']:.2f}x |"
    )
    a = s["acceptance"]
    lines += [
        "",
        f"c1 p99 redis / rocksdb = {a['c1_p99_ratio']:.2f} (limit {a['limit']}): {'OK' if a['ok'] else 'NOT MET'}",
        f"cluster memory: {mem['bytes_per_row']:.1f} B/row on the masters (used_memory +{mem['added_bytes'] / 2**20:.0f} MiB "
        f"for {report['rows']:,} rows; replicas hold as much again)",
        f"synth: rocksdb {report['synth_s']['rocksdb']:.0f} s, redis {report['synth_s']['redis']:.0f} s",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    runs = report["runs"]
    for ax, (conc, key, title) in zip(axes, [("c1", "p99_ms", "c1 p99 (ms)"), ("c8", "rps", "c8 throughput (req/s)")]):
        for i, b in enumerate(BACKENDS):
            ys = [r[conc][key] for r in runs if r["backend"] == b]
            ax.scatter([i] * len(ys), ys, label=b)
            ax.bar(i, statistics.median(ys), alpha=0.3)
        ax.set_xticks(range(len(BACKENDS)), BACKENDS)
        ax.set_title(title)
    fig.suptitle(f"{report['rows']:,} rows, N = {report['candidates']}: each dot one alternation, bars the median")
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=count, default=count("1e7"))
    ap.add_argument("--shards", type=int, default=12, help="store shards of both versions (redis: 4 per master)")
    ap.add_argument("--masters", type=int, default=3)
    ap.add_argument("--workdir", required=True, help="the versions and the cluster's files (deleted at the end)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--alternations", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--warmup-requests", type=int, default=300)
    ap.add_argument("--c1-requests", type=int, default=300)
    ap.add_argument("--c8-requests", type=int, default=800)
    ap.add_argument("--seconds", type=float, default=30.0, help="most measured seconds per cell")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    work, out = Path(args.workdir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    n = args.warmup_requests + args.c1_requests + args.c8_requests
    bodies = to_bodies(build_requests(args.rows, n, args.candidates, "zipf", seed=args.seed))
    runs: list[dict] = []
    try:
        with redis_cluster(work / "redis", masters=args.masters) as cluster:
            before = cluster.used_memory()
            synth_s = {}
            for b in BACKENDS:
                where = cluster.url if b == "redis" else "rocksdb"
                synth_s[b] = synth(work / b / MODEL / "1", args.rows, args.shards, where, args.seed, logs / "synth.log")
                print(f"synth {b}: {synth_s[b]:.0f} s", flush=True)
            added = cluster.used_memory() - before
            for k in range(args.alternations):
                order = BACKENDS if k % 2 == 0 else BACKENDS[::-1]
                for b in order:
                    r = cell(work / b, b, bodies, args, logs, k)
                    runs.append(r)
                    print(
                        f"[{k}] {b}: c1 p50 {r['c1']['p50_ms']:.2f} p99 {r['c1']['p99_ms']:.2f} ms, "
                        f"c8 {r['c8']['rps']:.0f} req/s p99 {r['c8']['p99_ms']:.2f} ms, "
                        f"row cache hit {r['row_cache_hit_ratio'] or 0:.3f}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "rows": args.rows,
        "candidates": args.candidates,
        "shards": args.shards,
        "masters": args.masters,
        "alternations": args.alternations,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "synth_s": synth_s,
        "cluster_memory": {"added_bytes": added, "bytes_per_row": added / args.rows},
        "runs": runs,
        "summary": summarize(runs),
    }
    (out / "redis_backend.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (out / "redis_backend.md").write_text(md)
    plot(report, out / "redis_backend.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

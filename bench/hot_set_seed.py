"""A freshly started server's first requests, with its row cache seeded from the version's static hot set and without.

One synthetic version (``offgraph synth``, int8 D=16) whose hot set is counted from a synthetic training
log: ``--training-rows`` rows of one user and one item each, drawn with the bench's Zipf popularity
(``bench.lib.traffic``) from a seed of their own, so the log is not the measured traffic, only the
same kind of traffic. Then, alternated, each on a fresh server (direct reads: no page cache carries
over between servers; the disk is probed before each):

* ``seeded``: ``offgraph serve --hot-set-seconds S`` (the default), the row cache seeded before ready;
* ``cold``: ``--hot-set-seconds 0``, the row cache empty at ready (as before hot sets);

and the first ``--requests`` requests at concurrency 1 (the same bodies for both, N = ``--candidates``):
each request's latency, their p50 / p99 / mean, the row-cache hit ratio, the disk bytes read per
request; and start-to-ready. Writes ``OUT/hot_set_seed.json``, ``.md`` and ``.png``.

    python -m bench.hot_set_seed --rows 1e8 --workdir out/hot-set --out bench/results/hot-set-seed
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.lib.client import Conn
from bench.lib.report import write_report
from bench.lib.server import BenchServer, hit_ratios
from bench.lib.traffic import bodies as to_bodies
from bench.lib.traffic import build_requests, draw_columns
from offgraph.cli.synth import count
from offgraph.export.synth_spec import synth_spec
from offgraph.features.spec import parse_spec
from offgraph.modeldir.manifest_model import Manifest
from offgraph.store.device_probe import DirectIOUnsupported, describe_profile, device_profile
from offgraph.store.prefetch import store_files

MODEL = "scale"
LOG_SEED = 7_000_003  # the training log's draws: apart from every seed the measured bodies use
MODES = ("seeded", "cold")


def _log(msg: str) -> None:
    print(f"[hot-set {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_training_log(path: Path, total_rows: int, n: int, seed: int) -> None:
    """``n`` synthetic training rows (one user, one item each, Zipf) in the synthetic spec's raw columns."""
    spec = parse_spec(synth_spec(total_rows))
    req, cand = draw_columns(total_rows, n, 1, "zipf", seed)
    cols = {**req, **cand}
    arrays = {k: pa.array(v.tolist()) if v.ndim > 1 else pa.array(v) for k, v in cols.items()}
    arrays[spec.label] = pa.array(np.zeros(n, np.int64))
    pq.write_table(pa.table(arrays), path)


def synth(out: Path, rows: int, log_path: Path, training: Path, seed: int) -> Manifest:
    """The version (reused when one of the same rows and seed with a hot set is there)."""
    manifest = out / "manifest.json"
    if manifest.exists():
        m = Manifest.from_json(manifest.read_text())
        syn = (m.training or {}).get("synthetic") or {}
        if syn.get("rows") == rows and syn.get("seed") == seed and m.hot_set is not None:
            _log(f"reusing {out}")
            return m
        raise SystemExit(f"{out} holds another version; remove it or choose another --workdir")
    cmd = [sys.executable, "-m", "offgraph.cli", "synth", "--out", str(out), "--rows", str(rows)]
    cmd += ["--seed", str(seed), "--hot-set-data", str(training), "--no-progress"]
    with open(log_path, "w") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"offgraph synth failed; see {log_path}")
    return Manifest.from_json(manifest.read_text())


async def first_requests(port: int, bodies: list[bytes]) -> list[float]:
    """Each body once, one after another on one connection: latencies in ms."""
    conn = await Conn.open("127.0.0.1", port)
    out = []
    try:
        for body in bodies:
            t0 = time.perf_counter()
            status, payload = await conn.post(f"/v1/models/{MODEL}:score", body)
            out.append((time.perf_counter() - t0) * 1e3)
            if status != 200:
                raise RuntimeError(f"score: HTTP {status}: {payload[:300]!r}")
    finally:
        conn.close()
    return out


def run_one(models: Path, mode: str, seconds: float, bodies: list[bytes], logs: Path, k: int, probe_s: float) -> dict:
    device = None
    if probe_s > 0:
        try:
            device = device_profile(store_files(models / MODEL / "1" / "store"), probe_s / 2)
        except DirectIOUnsupported as e:
            _log(f"disk probe: {e}")
    extra = ["--hot-set-seconds", str(seconds if mode == "seeded" else 0)]
    server = BenchServer(models, 1, logs / f"serve-{mode}{k}.log", extra)
    try:
        ready = server.wait_ready()
        c0, d0 = server.counters(), server.disk_read_bytes()
        lat = asyncio.run(first_requests(server.port, bodies))
        d1 = server.disk_read_bytes()
        time.sleep(0.6)  # the workers publish their counters every 0.25 s
        hits = hit_ratios(c0, server.counters())
        text = Path(server.proc.log_path).read_text(errors="replace")
        seeded = [ln for ln in text.splitlines() if "seeded with" in ln]
    finally:
        server.stop()
    a = np.asarray(lat)
    r = {
        "mode": mode,
        "run": k,
        "ready_s": ready,
        "latency_ms": lat,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "disk_kib_per_request": (d1 - d0) / len(lat) / 1024,
        **hits,
        "seed_log": seeded[-1].split(": ", 1)[-1] if seeded else None,
        "device": device,
    }
    _log(
        f"{mode:6s} {k}: ready {ready:5.1f}s  first {len(lat)}: p50 {r['p50_ms']:6.1f} p99 {r['p99_ms']:6.1f} "
        f"mean {r['mean_ms']:6.1f} ms  row-cache hit {r['row_cache_hit_ratio'] or 0:.3f}  "
        f"disk {r['disk_kib_per_request']:.0f} KiB/request  {r['seed_log'] or ''}"
        + (f"\n    {describe_profile(device)}" if device else "")
    )
    return r


def summary(runs: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        out[mode] = {
            k: statistics.median(r[k] for r in rs)
            for k in ("ready_s", "p50_ms", "p99_ms", "mean_ms", "disk_kib_per_request", "row_cache_hit_ratio")
        }
    s, c = out["seeded"], out["cold"]
    out["seeded_over_cold"] = {k: s[k] / c[k] if c[k] else None for k in ("p50_ms", "p99_ms", "mean_ms")}
    return out


def markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        f"{a['requests']} first requests (c1, N = {a['candidates']}, Zipf) on a fresh server, {a['rows']:,} rows; "
        f"medians of {a['alternations']} runs per mode, alternated.",
        "",
        "| mode | ready s | p50 ms | p99 ms | mean ms | row-cache hit | disk KiB/request |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        m = report["summary"][mode]
        lines.append(
            f"| {mode} | {m['ready_s']:.1f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['mean_ms']:.1f} | "
            f"{m['row_cache_hit_ratio']:.3f} | {m['disk_kib_per_request']:.0f} |"
        )
    r = report["summary"]["seeded_over_cold"]
    lines += ["", f"seeded / cold: p50 {r['p50_ms']:.2f}, p99 {r['p99_ms']:.2f}, mean {r['mean_ms']:.2f}", ""]
    lines += [
        "| run | mode | ready s | p50 | p99 | hit | KiB/req | seed | disk qd1 / qd8 mean ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        d = r["device"]
        dev = f"{d['qd1']['mean_ms']:.3f} / {d['qd8']['mean_ms']:.3f}" if d else "?"
        lines.append(
            f"| {r['run']} | {r['mode']} | {r['ready_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['row_cache_hit_ratio']:.3f} | {r['disk_kib_per_request']:.0f} | {r['seed_log'] or '-'} | {dev} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, color in zip(MODES, ("tab:green", "tab:red")):
        lat = np.median([r["latency_ms"] for r in report["runs"] if r["mode"] == mode], axis=0)
        w = 20
        smooth = np.convolve(lat, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(len(smooth)) + w, smooth, color=color, label=f"{mode} (median of runs, mean of {w})")
    ax.set_xlabel("request since ready")
    ax.set_ylabel("latency, ms")
    ax.set_title(f"first requests after start, {report['args']['rows']:,} rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=count, default=10**8)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--training-rows", type=int, default=1_000_000)
    p.add_argument("--hot-set-seconds", type=float, default=4.0, help="the seeded servers' --hot-set-seconds")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--candidates", type=int, default=200)
    p.add_argument("--alternations", type=int, default=3)
    p.add_argument("--disk-probe-s", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    models = args.workdir / f"m{args.rows}"
    training = args.workdir / f"training-{args.rows}.parquet"
    if not training.exists():
        t = time.perf_counter()
        write_training_log(training, args.rows, args.training_rows, LOG_SEED)
        _log(f"training log: {args.training_rows:,} rows in {time.perf_counter() - t:.1f}s")
    t = time.perf_counter()
    m = synth(models / MODEL / "1", args.rows, logs / "synth.log", training, args.seed)
    _log(
        f"version: {m.store.total_rows:,} rows, hot set {m.hot_set.rows if m.hot_set else 0:,} ({time.perf_counter() - t:.0f}s)"
    )
    bodies = to_bodies(build_requests(args.rows, args.requests, args.candidates, "zipf", seed=args.seed + 500))
    runs = []
    for k in range(args.alternations):
        for mode in MODES if k % 2 == 0 else MODES[::-1]:
            runs.append(run_one(models, mode, args.hot_set_seconds, bodies, logs, k, args.disk_probe_s))
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "hot_set": m.hot_set.to_dict() if m.hot_set else None,
        "runs": runs,
        "summary": summary(runs),
    }
    write_report(args.out, "hot_set_seed", report, markdown(report), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a server's CPU goes under c8 Zipf traffic, by shared object: the new code (direct reads) beside the old.

For each of ``--models`` (and ``--baseline-models`` served by the ``--baseline-repo`` checkout): a fresh
``offgraph serve --workers 1``; c8 Zipf traffic (``bench.lib.traffic``, N = ``--candidates``) for
``--warm-s`` seconds, then ``--seconds`` more while ``perf record -g -p PID`` samples the server. Reported per
code: req/s, server CPU ms per request, the row-cache hit ratio, disk KiB per request, and the CPU ms per
request of each shared object (``perf report --sort dso``: the kernel, libpython, NumPy, rocksdict...) and
of the kernel's top symbols. perf's sampling costs the server some throughput; compare the two codes with
each other, not with ``bench.scale``'s figures. Writes ``OUT/scale_perf.json``, ``.md``, ``.png``.

    python -m bench.scale_perf --rows 1e8 --models out/scale-models/m100000000 \\
        --baseline-models out/scale-models/m100000000-old --baseline-repo out/scale-models/baseline-src --out O
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import time
from pathlib import Path

from bench.lib.client import run_cell
from bench.lib.report import write_report
from bench.lib.server import BenchServer, build_extensions, hit_ratios
from bench.lib.traffic import bodies as to_bodies
from bench.lib.traffic import build_requests
from offgraph.cli.synth import count

PATH = "/v1/models/scale:score"
_LINE = re.compile(r"^\s+([0-9.]+)%\s+(.+?)\s*$")


def perf_split(data: Path, sort: str, dso: str | None = None) -> dict[str, float]:
    """``{name: share of samples}`` from ``perf report --sort SORT`` (of ``dso`` only when given)."""
    cmd = ["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio", "-g", "none"]
    if dso:
        cmd += ["--dso", dso]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    shares = {}
    for line in out.splitlines():
        m = _LINE.match(line)
        if m and not line.lstrip().startswith("#"):
            shares[m[2].replace("[k] ", "")] = float(m[1]) / 100
    return shares


def measure(models: Path, code: Path | None, args, tag: str) -> dict:
    server = BenchServer(models, 1, args.out / f"serve-{tag}.log", [], code=code)
    try:
        server.wait_ready()
        loop = asyncio.new_event_loop()
        warm = to_bodies(build_requests(args.rows, 3000, args.candidates, "zipf", seed=args.seed + 4242))
        loop.run_until_complete(
            run_cell("127.0.0.1", server.port, PATH, warm, 8, 10**9, args.warm_s, 1, args.candidates, server.pid)
        )
        bodies = to_bodies(build_requests(args.rows, 4000, args.candidates, "zipf", seed=args.seed + 4343))
        c0, d0 = server.counters(), server.disk_read_bytes()
        data = args.out / f"perf-{tag}.data"
        perf = subprocess.Popen(
            ["perf", "record", "-F", "499", "-g", "-p", str(server.pid), "-o", str(data)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        r = loop.run_until_complete(
            run_cell("127.0.0.1", server.port, PATH, bodies, 8, 10**9, args.seconds, 1, args.candidates, server.pid)
        )
        perf.send_signal(2)
        perf.wait(60)
        disk = (server.disk_read_bytes() - d0) / r["requests"] / 1024
        time.sleep(0.6)  # the workers publish their counters every 0.25 s
        hits = hit_ratios(c0, server.counters())
    finally:
        server.stop()
    cpu = r["server_cpu_ms_per_request"]
    dsos = perf_split(data, "dso")
    kernel = perf_split(data, "sym", "[kernel.kallsyms]")
    data.unlink()  # tens of MB: the shares are what is kept
    return {
        "code": tag,
        "rps": r["rps"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "server_cpu_ms_per_request": cpu,
        "server_cpu_utilization": r["server_cpu_utilization"],
        "row_cache_hit_ratio": hits["row_cache_hit_ratio"],
        "disk_kib_per_request": disk,
        "cpu_ms_per_request_by_dso": {k: v * cpu for k, v in dsos.items() if v >= 0.005},
        "kernel_ms_per_request_by_symbol": {k: v * cpu for k, v in list(kernel.items())[:8]},
    }


def markdown(runs: list[dict]) -> str:
    lines = ["| code | req/s | server CPU ms/request | row-cache hit | disk KiB/request |", "|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['code']} | {r['rps']:.0f} | {r['server_cpu_ms_per_request']:.1f} | {r['row_cache_hit_ratio']:.3f} | "
            f"{r['disk_kib_per_request']:.0f} |"
        )
    names = sorted(
        {k for r in runs for k in r["cpu_ms_per_request_by_dso"]},
        key=lambda k: -runs[0]["cpu_ms_per_request_by_dso"].get(k, 0),
    )
    lines += [
        "",
        "| CPU ms a request, by shared object | " + " | ".join(r["code"] for r in runs) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    for k in names:
        lines.append(f"| `{k}` | " + " | ".join(f"{r['cpu_ms_per_request_by_dso'].get(k, 0):.2f}" for r in runs) + " |")
    lines += [
        "",
        "| kernel ms a request, top symbols | " + " | ".join(r["code"] for r in runs) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    syms = list(dict.fromkeys(k for r in runs for k in r["kernel_ms_per_request_by_symbol"]))
    for k in syms:
        lines.append(
            f"| `{k}` | " + " | ".join(f"{r['kernel_ms_per_request_by_symbol'].get(k, 0):.2f}" for r in runs) + " |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(
        {k for r in runs for k in r["cpu_ms_per_request_by_dso"]},
        key=lambda k: -max(r["cpu_ms_per_request_by_dso"].get(k, 0) for r in runs),
    )[:6]
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(runs)
    for k in names:
        v = [r["cpu_ms_per_request_by_dso"].get(k, 0) for r in runs]
        ax.bar([r["code"] for r in runs], v, bottom=bottom, label=k.split(".cpython")[0])
        bottom = [b + x for b, x in zip(bottom, v)]
    ax.set_ylabel("server CPU ms a request (c8, Zipf)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=count, required=True, help="rows of the synthetic versions")
    p.add_argument("--models", type=Path, required=True, help="MODELS holding scale/1 (offgraph synth's)")
    p.add_argument("--baseline-models", type=Path)
    p.add_argument("--baseline-repo", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--warm-s", type=float, default=120.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--candidates", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [measure(args.models.resolve(), None, args, "new")]
    if args.baseline_models:
        build_extensions(args.baseline_repo.resolve())
        runs.append(measure(args.baseline_models.resolve(), args.baseline_repo.resolve(), args, "old"))
    write_report(args.out, "scale_perf", runs, markdown(runs), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

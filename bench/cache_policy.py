"""The row cache's policy against LRU and the best possible, simulated offline on the bench's key traces.

For every size (``--sizes``) and popularity (``--popularities``), the trace is what ``bench.scale``'s
requests make the server's row cache see (``offgraph.export.cache_sim.bench_trace``: the bench's bodies through
FG and the request path's key code, for the synthetic spec: no store is needed). For every capacity
(``--capacities-mb``, plus the default row-cache share of ``offgraph.scoring.memory_budget`` for that size), it
replays the trace through the REAL ``RowCache`` (int8 D=16 records, as the bench's versions) with:

* ``tinylfu``: the default (TinyLFU admission over a set-associative LFU), and the sketch sizes of
  ``--sketch-bytes`` (bytes of sketch per cached row: the same MiB then holds fewer rows) up to
  ``--reference-max-mb``;
* ``lru``: the set-associative LRU that served before;

and computes, at the default cache's capacity in rows: perfect LFU (the static oracle of
``cache_sim.perfect_lfu_hit_ratio``), and for capacities up to ``--reference-max-mb`` exact fully
associative LRU and S3-FIFO (per-key Python loops: slow). Also the mean cost of a request's lookup and
insert in the default cache. Writes ``OUT/cache_policy.json``, ``OUT/cache_policy.png``,
``OUT/README.md`` (the command and the table).

    python -m bench.cache_policy --sizes 1e7,1e9 --out bench/results/cache-policy
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from offgraph.cli.synth import count
from offgraph.export.cache_sim import Trace, bench_trace, lru_hit_ratio, perfect_lfu_hit_ratio, replay, s3fifo_hit_ratio
from offgraph.scoring.memory_budget import DEFAULT_MEMORY_MB, index_mb, split_memory
from offgraph.store import RowCache, get_codec
from offgraph.store.row_cache import SKETCH_BYTES_PER_ROW

REPO = Path(__file__).resolve().parent.parent
CODEC = get_codec("int8", 16)  # what `offgraph synth` writes
ACCEPTANCE_GAP = 0.03  # acceptance: within 3 points of perfect LFU at the same capacity


def _log(msg: str) -> None:
    print(f"[cache-policy {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_trace(rows: int, popularity: str, n_requests: int, cache_dir: Path | None) -> Trace:
    path = cache_dir / f"trace-{rows}-{popularity}-{n_requests}.npz" if cache_dir else None
    if path is not None and path.exists():
        z = np.load(path)
        return Trace(z["keys"], z["bounds"])
    t0 = time.perf_counter()
    tr = bench_trace(rows, popularity, n_requests)
    _log(
        f"trace {rows:.0e} {popularity}: {tr.requests} requests, {len(tr.keys):,} lookups, "
        f"{len(np.unique(tr.keys)):,} distinct keys ({time.perf_counter() - t0:.0f} s)"
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, keys=tr.keys, bounds=tr.bounds)
    return tr


def timed_replay(cache: RowCache, trace: Trace) -> tuple[float, float]:
    """(hit ratio, mean CPU microseconds of a request's lookup + insert: CPU time of this thread, which
    other processes on a shared machine do not inflate as they do wall time)."""
    t0 = time.thread_time()
    h = replay(cache, trace)
    return h, (time.thread_time() - t0) / trace.requests * 1e6


def cell(trace: Trace, mb: float, args) -> dict:
    out: dict = {"capacity_mb": mb}
    default = RowCache(mb, CODEC)
    out["tinylfu"], out["tinylfu_us_per_request"] = timed_replay(default, trace)
    C = default.capacity_rows
    out["capacity_rows"] = C
    lru = RowCache(mb, CODEC, policy="lru")
    out["lru_set_assoc"], out["lru_us_per_request"] = timed_replay(lru, trace)
    out["lru_capacity_rows"] = lru.capacity_rows
    for sk in args.sketch_bytes if mb <= args.reference_max_mb else ():
        if sk != SKETCH_BYTES_PER_ROW:
            out[f"tinylfu_sketch{sk:g}"] = replay(RowCache(mb, CODEC, sketch_bytes=sk), trace)
    out["perfect_lfu"] = perfect_lfu_hit_ratio(trace, C)
    # the best possible with every byte spent on rows (no sketch, one byte of state): the sketch's cost
    bare = int(mb * (1 << 20) // (8 + CODEC.record_bytes + 1))
    out["perfect_lfu_bare_rows"], out["bare_rows"] = perfect_lfu_hit_ratio(trace, bare), bare
    if mb <= args.reference_max_mb:
        out["lru_exact"] = lru_hit_ratio(trace, C)
        out["s3fifo"] = s3fifo_hit_ratio(trace, C)
    out["gap_to_perfect_lfu"] = out["perfect_lfu"] - out["tinylfu"]
    return out


def _fmt(x) -> str:
    return "" if x is None else f"{x:.4f}"


def table(results: list[dict]) -> str:
    lines = [
        "| rows | popularity | MiB | cache rows | TinyLFU (default) | LRU set-assoc | perfect LFU | gap | "
        "exact LRU | S3-FIFO | perfect LFU, bare rows | CPU us/request (TinyLFU / LRU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for c in r["cells"]:
            mark = " (default)" if c.get("default") else ""
            lines.append(
                f"| {r['rows']:.0e} | {r['popularity']} | {c['capacity_mb']:.1f}{mark} | {c['capacity_rows']:,} | "
                f"{_fmt(c['tinylfu'])} | {_fmt(c['lru_set_assoc'])} | {_fmt(c['perfect_lfu'])} | "
                f"{100 * c['gap_to_perfect_lfu']:.2f} pt | {_fmt(c.get('lru_exact'))} | {_fmt(c.get('s3fifo'))} | "
                f"{_fmt(c['perfect_lfu_bare_rows'])} | {c['tinylfu_us_per_request']:.0f} / "
                f"{c['lru_us_per_request']:.0f} |"
            )
    return "\n".join(lines)


def sketch_table(results: list[dict], sketch_bytes: list[float]) -> str:
    others = [s for s in sketch_bytes if s != SKETCH_BYTES_PER_ROW]
    head = ["rows", "popularity", "MiB", f"sketch {SKETCH_BYTES_PER_ROW:g} B/row (default)"] + [
        f"sketch {s:g} B/row" for s in others
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        for c in r["cells"]:
            vals = [_fmt(c["tinylfu"])] + [_fmt(c.get(f"tinylfu_sketch{s:g}")) for s in others]
            lines.append(f"| {r['rows']:.0e} | {r['popularity']} | {c['capacity_mb']:.1f} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), squeeze=False)
    for ax, r in zip(axes[0], results):
        cells = sorted(r["cells"], key=lambda c: c["capacity_mb"])
        x = [c["capacity_mb"] for c in cells]
        for key, label, style in (
            ("perfect_lfu", "perfect LFU", "k--"),
            ("tinylfu", "TinyLFU (default)", "o-"),
            ("lru_set_assoc", "LRU set-assoc", "s-"),
            ("s3fifo", "S3-FIFO", "^:"),
            ("lru_exact", "exact LRU", "v:"),
        ):
            pts = [(c["capacity_mb"], c[key]) for c in cells if c.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=label, markersize=4)
        ax.set_xscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:g}" for v in x], fontsize=7)
        ax.set_xlabel("row cache MiB")
        ax.set_ylabel("hit ratio")
        ax.set_title(f"{r['rows']:.0e} rows, {r['popularity']}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "cache_policy.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1e7,1e9", help="total rows of the synthetic versions, comma separated")
    p.add_argument("--popularities", default="zipf,uniform")
    p.add_argument("--capacities-mb", default="1,4", help="besides the default row-cache share of each size")
    p.add_argument(
        "--memory-mb",
        type=float,
        default=DEFAULT_MEMORY_MB,
        help="the server's --memory-mb whose row-cache share is the default capacity",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=4502,
        help="requests of the trace (bench.scale's default warm-up + c1 + c8 bodies)",
    )
    p.add_argument("--sketch-bytes", default=f"4,{SKETCH_BYTES_PER_ROW:g},16")
    p.add_argument(
        "--reference-max-mb",
        type=float,
        default=1.0,
        help="exact LRU, S3-FIFO (slow Python loops) and the other sketch sizes for capacities up to this",
    )
    p.add_argument("--trace-cache", default="", help="a folder to keep the traces in (they take a minute each)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "cache-policy"))
    args = p.parse_args(argv)
    args.sketch_bytes = [float(s) for s in args.sketch_bytes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for size in args.sizes.split(","):
        rows = count(size)
        default_mb = split_memory(args.memory_mb, 1, index_mb=index_mb(rows, CODEC.record_bytes)).row_cache_mb
        for popularity in args.popularities.split(","):
            trace = load_trace(rows, popularity, args.requests, Path(args.trace_cache) if args.trace_cache else None)
            cells = []
            for mb in sorted({float(m) for m in args.capacities_mb.split(",")} | {default_mb}):
                c = cell(trace, mb, args)
                c["default"] = mb == default_mb
                cells.append(c)
                _log(
                    f"{rows:.0e} {popularity} {mb:6.1f} MiB ({c['capacity_rows']:,} rows): TinyLFU {c['tinylfu']:.4f}"
                    f"  LRU {c['lru_set_assoc']:.4f}  perfect LFU {c['perfect_lfu']:.4f}  gap "
                    f"{100 * c['gap_to_perfect_lfu']:.2f} pt"
                )
            results.append(
                {
                    "rows": rows,
                    "popularity": popularity,
                    "requests": trace.requests,
                    "lookups": int(len(trace.keys)),
                    "distinct_keys": int(len(np.unique(trace.keys))),
                    "default_mb": default_mb,
                    "cells": cells,
                }
            )
    worst = max(
        (c["gap_to_perfect_lfu"] for r in results if r["popularity"] == "zipf" for c in r["cells"] if c["default"]),
        default=None,
    )
    report = {
        "command": "python -m bench.cache_policy " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": platform.platform(),
        "codec": CODEC.describe(),
        "acceptance_gap": ACCEPTANCE_GAP,
        "worst_zipf_gap_at_default": worst,
        "results": results,
    }
    (out / "cache_policy.json").write_text(json.dumps(report, indent=1))
    worst_s = "n/a" if worst is None else f"{100 * worst:.2f} points"
    plot(results, out)
    tab = table(results)
    print(tab)
    (out / "README.md").write_text(
        f"# Row-cache policy on the bench's key traces\n\n```\n{report['command']}\n```\n\n"
        f"Traces: `bench.scale`'s bodies ({args.requests} requests of 200 candidates) through FG and the request "
        f"path's keys (`offgraph.export.cache_sim.bench_trace`); the real `RowCache` ({CODEC.name} D={CODEC.dim} "
        f"records) replayed as the server drives it. Perfect LFU: the static top-C keys of the whole trace, "
        f"each cached from its first request on, at the default cache's capacity in rows (its sketch's bytes "
        f'spent on rows instead: "bare rows"). The default capacity is the row cache\'s share of '
        f"`--memory-mb {args.memory_mb:g}` (`offgraph.scoring.memory_budget`). Worst Zipf gap at the default capacity: "
        f"{worst_s} (acceptance: 3 points).\n\n{tab}\n\nSketch size (bytes per cached row, hit ratio "
        f"at the same MiB):\n\n{sketch_table(results, args.sketch_bytes)}\n\n![hit ratios](cache_policy.png)\n"
    )
    _log(f"wrote {out}/cache_policy.json, .png, README.md; worst Zipf gap at the default capacity: {worst_s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

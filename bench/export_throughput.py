"""Bulk-export throughput of the embedding store, per record format.

Synthetic table: ``--rows`` rows (default 10**7), D=16, vectors and first-order
weights ~ N(0, 0.05) float32, generated chunk by chunk (``--chunk`` rows) so the table
is never whole in memory. For each format (fp32, fp16, int8) a fresh subprocess
bulk-loads it into S=8 shards (so peak RSS is per run), then reopens the store
read-only and times batched random reads. Prints a table, writes ``--out`` (JSON) and
a PNG bar chart next to it.

    python -m bench.export_throughput --rows 10000000 --out report.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

FORMATS = ("fp32", "fp16", "int8")


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _chunk(seed: int, i: int, start: int, stop: int, dim: int):
    rng = np.random.default_rng([seed, i])
    rows = np.arange(start, stop, dtype=np.int64)
    vectors = rng.standard_normal((stop - start, dim), dtype=np.float32) * np.float32(0.05)
    first_order = rng.standard_normal(stop - start, dtype=np.float32) * np.float32(0.05)
    return rows, vectors, first_order


def worker(args) -> dict:
    from offgraph.store import StoreConfig, open_store

    path = os.path.join(args.workdir, args.worker)
    cfg = StoreConfig(dim=args.dim, quant=args.worker, shards=args.shards)
    gen_s = 0.0

    def chunks():
        nonlocal gen_s
        for i, start in enumerate(range(0, args.rows, args.chunk)):
            t = time.perf_counter()
            c = _chunk(args.seed, i, start, min(args.rows, start + args.chunk), args.dim)
            gen_s += time.perf_counter() - t
            yield c

    rss_before = _rss_mb()
    with open_store(path, cfg, mode="w") as st:
        t0 = time.perf_counter()
        n = st.bulk_load(0, chunks(), total_rows=args.rows, workers=args.workers)
        load_s = time.perf_counter() - t0
    rss_peak_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_peak_writers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    rng = np.random.default_rng(args.seed + 1)
    with open_store(path, mode="r") as st:
        stats = st.stats()
        # correctness sample: regenerate the chunks holding some random rows
        sample = np.sort(rng.choice(args.rows, size=min(2000, args.rows), replace=False))
        got_v, got_w = st.read(0, sample)
        want_v = np.empty_like(got_v)
        want_w = np.empty_like(got_w)
        for i in np.unique(sample // args.chunk):
            start = int(i) * args.chunk
            _, cv, cw = _chunk(args.seed, int(i), start, min(args.rows, start + args.chunk), args.dim)
            sel = (sample // args.chunk) == i
            want_v[sel] = cv[sample[sel] - start]
            want_w[sel] = cw[sample[sel] - start]
        max_err = float(max(np.abs(got_v - want_v).max(), np.abs(got_w - want_w).max()))

        def timed(keys_list):
            out = []
            for keys in keys_list:
                t = time.perf_counter()
                st.read(0, keys)
                out.append((time.perf_counter() - t) * 1e3)
            return out

        batches = [rng.integers(0, args.rows, args.read_keys) for _ in range(args.read_batches)]
        timed(batches[:5])  # warm-up: page cache and block cache
        random_ms = timed(batches)
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        cache_mb = st.cache_usage() / 2**20
    # warm: the same keys again and again, with a cache that holds their blocks
    warm_cfg = StoreConfig(**{**cfg.to_dict(), "block_cache_mb": args.warm_cache_mb})
    with open_store(path, warm_cfg, mode="r") as st:
        same = batches[0]
        timed([same] * 3)
        warm_ms = timed([same] * args.read_batches)

    return {
        "format": args.worker,
        "config": cfg.to_dict(),
        "rows": n,
        "record_bytes": stats["record"]["record_bytes"],
        "load_s": load_s,
        "datagen_s": gen_s,
        "rows_per_s": n / load_s,
        "rows_per_s_excl_datagen": n / (load_s - gen_s),
        "rss_before_mb": rss_before,
        "peak_rss_load_mb": rss_peak_load,
        "peak_rss_sst_worker_mb": rss_peak_writers,
        "peak_rss_mb": rss_peak,
        "bytes_on_disk": stats["bytes_on_disk"],
        "sst_bytes": sum(s["sst_bytes"] for s in stats["shards"]),
        "bytes_per_row": stats["bytes_on_disk"] / n,
        "max_abs_error_sample": max_err,
        "read_keys": args.read_keys,
        "read_ms_random_p50": float(np.percentile(random_ms, 50)),
        "read_ms_random_p99": float(np.percentile(random_ms, 99)),
        "read_ms_warm_p50": float(np.percentile(warm_ms, 50)),
        "read_ms_warm_p99": float(np.percentile(warm_ms, 99)),
        "warm_cache_mb": args.warm_cache_mb,
        "block_cache_used_mb": cache_mb,
        "block_cache_mb": cfg.block_cache_mb,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=1 << 18)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--read-keys", type=int, default=7000)
    ap.add_argument("--read-batches", type=int, default=30)
    ap.add_argument("--warm-cache-mb", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="SST writer processes (default: auto)")
    ap.add_argument("--out", default="export_throughput.json")
    ap.add_argument("--png", default=None, help="chart path (default: --out with .png)")
    ap.add_argument("--workdir", default=None, help="where stores are built (temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    formats = [f for f in args.formats.split(",") if f]
    workdir = args.workdir or tempfile.mkdtemp(prefix="offgraph-export-bench-")
    os.makedirs(workdir, exist_ok=True)
    results = []
    try:
        for fmt in formats:
            cmd = [sys.executable, "-m", "bench.export_throughput", "--worker", fmt, "--workdir", workdir]
            for k in (
                "rows",
                "dim",
                "shards",
                "chunk",
                "read_keys",
                "read_batches",
                "warm_cache_mb",
                "seed",
                "workers",
            ):
                if getattr(args, k) is not None:
                    cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                raise SystemExit(f"worker {fmt} failed with exit code {proc.returncode}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(r)
            print(
                f"{fmt:5s} rec={r['record_bytes']:3d}B  {r['rows_per_s']:>10,.0f} rows/s "
                f"({r['rows_per_s_excl_datagen']:,.0f} excl. datagen)  peak RSS {r['peak_rss_load_mb']:.0f} MB "
                f"(+SST worker {r['peak_rss_sst_worker_mb']:.0f} MB)  "
                f"disk {r['bytes_on_disk'] / 2**20:8.1f} MiB ({r['bytes_per_row']:.2f} B/row)  "
                f"read {args.read_keys} keys: random p50 {r['read_ms_random_p50']:.1f} ms "
                f"p99 {r['read_ms_random_p99']:.1f} ms, warm p50 {r['read_ms_warm_p50']:.1f} ms  "
                f"max|err| {r['max_abs_error_sample']:.2e}",
                flush=True,
            )
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    by = {r["format"]: r for r in results}
    ratios = {}
    if "fp32" in by:
        for fmt in by:
            ratios[f"{fmt}/fp32_bytes_on_disk"] = by[fmt]["bytes_on_disk"] / by["fp32"]["bytes_on_disk"]
            ratios[f"{fmt}/fp32_sst_bytes"] = by[fmt]["sst_bytes"] / by["fp32"]["sst_bytes"]
        for k, v in ratios.items():
            if k.endswith("bytes_on_disk") and not k.startswith("fp32"):
                print(f"{k}: {v:.3f}")
    report = {
        "rows": args.rows,
        "dim": args.dim,
        "shards": args.shards,
        "chunk": args.chunk,
        "cpus": os.cpu_count(),
        "results": results,
        "ratios": ratios,
    }
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=2)
    print(f"wrote {args.out}")
    png = args.png or os.path.splitext(args.out)[0] + ".png"
    try:
        _chart(results, png)
        print(f"wrote {png}")
    except ImportError:
        pass
    return 0


def _chart(results: list[dict], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["format"] for r in results]
    panels = [
        ("bulk load, rows/s (M)", [r["rows_per_s"] / 1e6 for r in results]),
        ("bytes on disk per row", [r["bytes_per_row"] for r in results]),
        ("peak RSS during load (MB)", [r["peak_rss_load_mb"] for r in results]),
        ("read 7000 random keys, p50 ms", [r["read_ms_random_p50"] for r in results]),
        ("read 7000 keys warm, p50 ms", [r["read_ms_warm_p50"] for r in results]),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (title, vals) in zip(axes, panels):
        ax.bar(names, vals, color=["#4c72b0", "#55a868", "#c44e52"][: len(names)])
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

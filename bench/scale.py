"""Tables beyond RAM (issue 12): serve synthetic models of 10^6 .. 10^9 rows and swap big versions under load.

For every size (``--sizes``, total rows): write (or reuse) a synthetic int8 D=16 version with
``offgraph synth`` (a subprocess: its progress bar shows), then for ``--workers`` 1 and 2 and for Zipf
(exponent 1.1) and uniform row popularity (``bench.scale_traffic``), start a fresh ``offgraph serve``
with the default cache sizes and measure:

* start-to-ready (process start to ``/readyz`` 200);
* total PSS of the server's processes (``bench.proc_memory``) after a warm-up, and the peak under load;
* p50/p99 at concurrency 1, then throughput (and p50/p99) at concurrency 8, N = ``--candidates`` (200),
  every body distinct (no request repeats, so the uniform case cannot hit its caches by repetition);
* row-cache and block-cache hit ratios of the measured requests (``/metrics`` counters);
* disk bytes per row (the version's store).

At ``--swap-size`` (2x10^8) it also runs the swap (``bench.scale_swap``): v1 under concurrency 8, v2
(written beforehand under a hidden name) renamed into MODELS, then ``:rollback`` to v1. Versions of
``--delete-from`` rows (10^8) and more are deleted after their size is done unless ``--keep``. The disk
needed is printed (and checked) before anything is written. Writes ``OUT/scale.json``, ``OUT/scale.md``
(the tables), ``OUT/scale_memory.png``, ``OUT/scale_latency.png``, ``OUT/scale_swap.png``.

    python -m bench.scale --sizes 1e6,1e7 --swap-size 1e7 --workdir out/scale-models --out bench/results/scale
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.disk_probe import cold_reads, describe, settle
from bench.scale_server import ScaleServer, hit_ratios
from bench.scale_swap import run_swap, summarize
from bench.scale_traffic import POPULARITIES, bodies as to_bodies, build_requests
from bench.scale_warmup import kib_per_request, warm_until_steady
from bench.serve_latency import run_cell
from embstore.prefetch import store_files
from exporter.cli_synth import count
from exporter.synth_config import DISK_MARGIN, SynthConfig

REPO = Path(__file__).resolve().parent.parent
MODEL = "scale"
ACCEPTANCE = {"pss_w1_mb": 1000, "pss_w2_mb": 1600, "pss_10e7_vs_10e9": 0.15, "zipf_p99_ratio": 2.0,
              "ready_s": 15.0, "swap_bin_p99_ratio": 2.0, "swap_pss_mb": 1500, "synth_rows_per_s": 1e6}


def _log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- versions --------------------------------------------------------------------------------------------
def synth(out: Path, rows: int, seed: int, log_path: Path) -> dict:
    """``offgraph synth`` into ``out`` unless a complete version of the same rows and seed is there."""
    manifest = out / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        syn = (m.get("training") or {}).get("synthetic") or {}
        if syn.get("rows") == rows and syn.get("seed") == seed:
            _log(f"reusing {out} ({rows:,} rows)")
            return m
        raise SystemExit(f"{out} holds another version ({syn}); remove it or choose another --workdir")
    _log(f"synth {rows:,} rows -> {out}")
    cmd = [sys.executable, "-m", "offgraph_cli", "synth", "--out", str(out), "--rows", str(rows), "--seed", str(seed)]
    with open(log_path, "w") as log:
        r = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"offgraph synth failed ({r.returncode}); see {log_path}")
    print(Path(log_path).read_text().strip().splitlines()[-1], flush=True)
    os.sync()  # the kernel's writeback of GBs of fresh files must not land in a measured phase
    return json.loads(manifest.read_text())


def disk_plan(sizes: list[int], swap_size: int | None, keep: bool, delete_from: int,
              present: frozenset[int] = frozenset()) -> int:
    """Peak bytes the run writes: the kept versions plus the biggest one alive at a time. ``present``:
    sizes whose version is already on disk (reused: nothing to write)."""
    est = [0 if n in present else SynthConfig(rows=n).disk_bytes() for n in sizes]
    kept = sum(e for n, e in zip(sizes, est) if keep or n < delete_from)
    alive = max((e * (2 if n == swap_size else 1) for n, e in zip(sizes, est) if not (keep or n < delete_from)),
                default=0)
    if swap_size is not None and swap_size not in sizes:
        alive = max(alive, 2 * SynthConfig(rows=swap_size).disk_bytes())
    return int((kept + alive) * DISK_MARGIN)


# -- one server, one popularity ------------------------------------------------------------------------
def measure(models: Path, workers: int, popularity: str, rows: int, args, logs: Path) -> dict:
    n_warm, n_c1, n_c8 = args.warmup_requests, args.c1_requests, args.c8_requests
    reqs = build_requests(rows, n_warm + n_c1 + n_c8 + 2, args.candidates, popularity, seed=args.seed)
    bodies = to_bodies(reqs)
    del reqs
    disk = _probe(models / MODEL / "1", args)  # before the server starts: nothing else reads the disk
    server = ScaleServer(models, workers, logs / f"serve-{rows}-w{workers}-{popularity}.log", args.serve_args.split())
    path = f"/v1/models/{MODEL}:score"
    try:
        ready_s = server.wait_ready()
        load_s = server.version_load_s()
        pss_ready = server.pss_bytes()
        loop = asyncio.new_event_loop()
        try:
            def more(k: int, n: int) -> list[bytes]:  # fresh warm-up bodies, seeds apart from the measured ones
                return to_bodies(build_requests(rows, n, args.candidates, popularity, seed=args.seed + 1000 + k))

            warmup = loop.run_until_complete(warm_until_steady(server, path, bodies[:n_warm], more, args.candidates,
                                                               args.warmup_round_s, args.warmup_max_s,
                                                               args.warmup_level))
            time.sleep(0.6)  # the workers publish their counters every 0.25 s
            pss_warm = server.pss_bytes()
            c0, d0 = server.counters(), server.disk_read_bytes()
            c1 = loop.run_until_complete(run_cell("127.0.0.1", server.port, path, bodies[n_warm:n_warm + n_c1], 1,
                                                  n_c1, args.seconds, 1, args.candidates, server.pid))
            d1 = server.disk_read_bytes()
            samples: list[int] = []

            async def c8_with_pss():
                stop = asyncio.Event()

                async def sample():
                    while not stop.is_set():
                        samples.append(server.pss_bytes())
                        await asyncio.sleep(0.25)

                task = asyncio.create_task(sample())
                try:
                    return await run_cell("127.0.0.1", server.port, path, bodies[n_warm + n_c1:], 8, n_c8,
                                          args.seconds, 1, args.candidates, server.pid)
                finally:
                    stop.set()
                    await task

            c8 = loop.run_until_complete(c8_with_pss())
            d8 = server.disk_read_bytes()
        finally:
            loop.close()
        time.sleep(0.6)
        ratios = hit_ratios(c0, server.counters())
    finally:
        server.stop()
    row = {"rows": rows, "workers": workers, "popularity": popularity, "start_to_ready_s": ready_s,
           "version_load_s": load_s, "disk_probe": disk, "warmup": warmup,
           "pss_ready_mb": pss_ready / 2**20, "pss_after_warmup_mb": pss_warm / 2**20,
           "pss_under_load_mb": max(samples or [0]) / 2**20, "c1": c1, "c8": c8, **ratios,
           # what the page cache did not hold: read from the disk, per measured request
           "c1_disk_kib_per_request": kib_per_request(d1 - d0, c1["requests"]),
           "c8_disk_kib_per_request": kib_per_request(d8 - d1, c8["requests"])}
    _log(f"{rows:.0e} rows w{workers} {popularity:7s}: ready {ready_s:5.1f}s (version {_load(row)}s)  "
         f"warm-up {_warm(row)} ({warmup['stopped']}, {len(warmup['rounds'])} rounds, first round c8 p99 "
         f"{warmup['rounds'][0]['p99_ms']:.0f} ms)  "
         f"PSS warm {row['pss_after_warmup_mb']:6.0f} "
         f"load {row['pss_under_load_mb']:6.0f} MB  c1 p50 {c1['p50_ms']:6.1f} p99 {c1['p99_ms']:6.1f} ms  "
         f"c8 {c8['rps']:5.0f} req/s p99 {c8['p99_ms']:6.1f} ms  row-cache {ratios['row_cache_hit_ratio'] or 0:.3f} "
         f"block-cache {ratios['block_cache_hit_ratio'] or 0:.3f}; from disk c1 {row['c1_disk_kib_per_request']:.0f} "
         f"c8 {row['c8_disk_kib_per_request']:.0f} KiB/request; {describe(disk)}")
    return row


def _probe(version: Path, args) -> dict | None:
    """The disk's cold-read latency on ``version``'s store files (``bench.disk_probe``), ``--disk-probe-s``."""
    return cold_reads(store_files(version / "store"), args.disk_probe_s) if args.disk_probe_s > 0 else None


def _settle(version: Path, args) -> dict | None:
    """After writing ``version``, wait until the disk's cold reads are back to normal
    (``bench.disk_probe.settle``: p99.9 <= ``--settle-p999-ms``, at most ``--settle-max-s``)."""
    if args.settle_max_s <= 0 or args.disk_probe_s <= 0:
        return None
    got = settle(store_files(version / "store"), args.settle_p999_ms, args.settle_max_s)
    last = got["probes"][-1] if got["probes"] else None
    _log(f"disk {'settled' if got['settled'] else 'NOT settled' if got['settled'] is False else 'not probed'} "
         f"after {got['waited_s']:.0f}s ({len(got['probes'])} probes; last: {describe(last)})")
    return got


def swap_experiment(models: Path, rows: int, args, logs: Path) -> dict:
    hidden = models / MODEL / ".tmp-2"  # not a version until renamed to "2"
    if hidden.exists():
        shutil.rmtree(hidden)
    stage = models.parent / f"stage-{models.name}"  # same filesystem (renamed), outside MODELS
    shutil.rmtree(stage, ignore_errors=True)
    synth(stage / MODEL / "2", rows, args.seed + 1, logs / f"synth-{rows}-v2.log")
    settled_v2 = _settle(stage / MODEL / "2", args)
    os.rename(stage / MODEL / "2", hidden)
    shutil.rmtree(stage, ignore_errors=True)
    policy = models / MODEL / "admin-policy.json"
    policy.unlink(missing_ok=True)
    reqs = build_requests(rows, args.swap_bodies, args.candidates, "zipf", seed=args.seed + 7)
    bodies = to_bodies(reqs)
    del reqs
    disk_before = _probe(models / MODEL / "1", args)
    server = ScaleServer(models, 1, logs / f"serve-{rows}-swap.log", args.serve_args.split())
    try:
        server.wait_ready()
        _log(f"swap at {rows:,} rows: {args.swap_warm_s:g}s not measured, steady {args.swap_steady_s:g}s, then v2 "
             f"appears, then rollback")
        raw = asyncio.run(run_swap(server, MODEL, models, hidden, bodies, steady_s=args.swap_steady_s,
                                   after_s=args.swap_after_s, warm_s=args.swap_warm_s))
    finally:
        server.stop()
        policy.unlink(missing_ok=True)
        shutil.rmtree(models / MODEL / "2", ignore_errors=True)
        shutil.rmtree(hidden, ignore_errors=True)
    out = {"rows": rows, "workers": 1, **summarize(raw), "settle_after_v2_synth": settled_v2,
           "disk_probe_before": disk_before,
           "disk_probe_after": _probe(models / MODEL / "1", args)}
    _log(f"swap: {out['failed_requests']} failed of {out['requests']}; steady p99 {out['steady_p99_ms']:.1f} ms, "
         f"worst 1-s p99 after v2 appears {out['max_bin_p99_ms_after_v2_appears']:.1f} ms "
         f"(x{out['max_bin_p99_over_steady']:.2f}; worst steady-phase bin x{out['steady_max_bin_p99_over_steady']:.2f}, "
         f"bins over 2x: {_fraction(out, 'steady')} steady, {_fraction(out, 'after_v2_appears')} after); first 100 on v2 p99 {out['first_100_on_v2_p99_ms']:.1f} ms; "
         f"PSS peak {out['pss_peak_mb']:.0f} MB; v2 serving {out['v2_appears_to_serving_s']:.1f}s after it appeared, "
         f"v1 {out['rollback_to_v1_serving_s']:.1f}s after the rollback; before: {describe(disk_before)}; after: "
         f"{describe(out['disk_probe_after'])}; per bin, major faults / page-cache refaults: "
         f"{_per_bin(out['faults_in_bins_over_2x'])} in bins over 2x, "
         f"{_per_bin(out['faults_in_other_bins_after_v2_appears'])} in the others after v2 appears")
    return out


def _per_bin(sums: dict) -> str:
    return f"{sums['major_faults_per_bin']} / {sums['page_cache_refaults_per_bin']}"


# -- report -------------------------------------------------------------------------------------------------
def acceptance(report: dict) -> dict:
    runs = report["runs"]

    def pick(rows, workers, pop):
        return next((r for r in runs if r["rows"] == rows and r["workers"] == workers and r["popularity"] == pop),
                    None)

    out: dict = {}
    big = max((r["rows"] for r in runs), default=None)
    for w, key in ((1, "pss_w1_mb"), (2, "pss_w2_mb")):
        rs = [r for r in runs if r["rows"] == big and r["workers"] == w]
        if rs:
            worst = max(max(r["pss_after_warmup_mb"], r["pss_under_load_mb"]) for r in rs)
            out[f"pss_workers{w}_at_{big:.0e}_mb"] = {"value": worst, "limit": ACCEPTANCE[key],
                                                     "ok": worst <= ACCEPTANCE[key]}
    for w in (1, 2):
        a, b = pick(10**7, w, "zipf"), pick(big, w, "zipf")
        if a and b and big != 10**7:
            rel = abs(b["pss_under_load_mb"] - a["pss_under_load_mb"]) / a["pss_under_load_mb"]
            out[f"pss_under_load_w{w}_1e7_vs_{big:.0e}"] = {"value": rel, "limit": ACCEPTANCE["pss_10e7_vs_10e9"],
                                                           "ok": rel <= ACCEPTANCE["pss_10e7_vs_10e9"]}
            ratio = b["c1"]["p99_ms"] / a["c1"]["p99_ms"]
            out[f"zipf_c1_p99_w{w}_{big:.0e}_over_1e7"] = {"value": ratio, "limit": ACCEPTANCE["zipf_p99_ratio"],
                                                          "ok": ratio <= ACCEPTANCE["zipf_p99_ratio"]}
    if big is not None:
        ready = max(r["start_to_ready_s"] for r in runs if r["rows"] == big)
        out[f"start_to_ready_at_{big:.0e}_s"] = {"value": ready, "limit": ACCEPTANCE["ready_s"],
                                                 "ok": ready <= ACCEPTANCE["ready_s"]}
        syn = report["synth"].get(str(big))
        if syn and syn.get("rows_per_s"):
            lim = ACCEPTANCE["synth_rows_per_s"]
            out[f"synth_rows_per_s_at_{big:.0e}"] = {"value": syn["rows_per_s"], "limit": lim,
                                                     "ok": syn["rows_per_s"] >= lim}
    sw = report.get("swap")
    if sw:
        out["swap_failed_requests"] = {"value": sw["failed_requests"], "limit": 0, "ok": sw["failed_requests"] == 0}
        out["swap_max_bin_p99_over_steady"] = {"value": sw["max_bin_p99_over_steady"],
                                               "limit": ACCEPTANCE["swap_bin_p99_ratio"],
                                               "ok": sw["max_bin_p99_over_steady"] <= ACCEPTANCE["swap_bin_p99_ratio"]}
        out["swap_pss_peak_mb"] = {"value": sw["pss_peak_mb"], "limit": ACCEPTANCE["swap_pss_mb"],
                                   "ok": sw["pss_peak_mb"] <= ACCEPTANCE["swap_pss_mb"]}
    return out


def _disk(probe: dict | None) -> str:
    return "?" if not probe else f"{probe['p999_ms']:.0f} / {probe['max_ms']:.0f}"


def _load(run: dict) -> str:
    return "?" if run.get("version_load_s") is None else f"{run['version_load_s']:.1f}"


def _warm(run: dict) -> str:
    """Warm-up seconds (disk KiB per request in its first and last round), ``?`` in older reports."""
    w = run.get("warmup")
    if not w:
        return "?"
    first, last = w["rounds"][0]["disk_kib_per_request"], w["rounds"][-1]["disk_kib_per_request"]
    return f"{w['seconds']:.0f} s ({first:.0f} -> {last:.0f})"


def _from_disk(run: dict) -> str:
    """KiB read from the disk per request at concurrency 1 / 8 (``?`` in older reports)."""
    if "c1_disk_kib_per_request" not in run:
        return "?"
    return f"{run['c1_disk_kib_per_request']:.0f} / {run['c8_disk_kib_per_request']:.0f}"


def _fraction(sw: dict, phase: str) -> str:
    """``k of n`` 1-s bins of ``phase`` whose p99 is over twice the steady p99 (``?`` in older reports)."""
    k_n = (sw.get("bins_over_2x_steady") or {}).get(phase)
    return f"{k_n[0]} of {k_n[1]}" if k_n else "?"


def markdown(report: dict) -> str:
    """The figures as Markdown tables (``OUT/scale.md``, pasted into bench/README.md)."""
    lines = ["| rows | workers | popularity | ready s (version load s) | warm-up (disk KiB/request: first -> last round) | PSS warm MiB | PSS load MiB | c1 p50 ms | c1 p99 ms | "
             "c8 req/s | c8 p99 ms | row-cache hit | block-cache hit | read from disk KiB/request c1 / c8 | disk B/row | "
             "cold reads p99.9 / max ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(report["runs"], key=lambda r: (r["rows"], r["workers"], r["popularity"] != "zipf")):
        lines.append(f"| {r['rows']:.0e} | {r['workers']} | {r['popularity']} | {r['start_to_ready_s']:.1f} ({_load(r)}) | {_warm(r)} | "
                     f"{r['pss_after_warmup_mb']:.0f} | {r['pss_under_load_mb']:.0f} | {r['c1']['p50_ms']:.1f} | "
                     f"{r['c1']['p99_ms']:.1f} | {r['c8']['rps']:.0f} | {r['c8']['p99_ms']:.0f} | "
                     f"{r['row_cache_hit_ratio'] or 0:.3f} | {r['block_cache_hit_ratio'] or 0:.3f} | {_from_disk(r)} | "
                     f"{r['disk_bytes_per_row']:.1f} | {_disk(r.get('disk_probe'))} |")
    lines += ["", "| rows | synth rows/s (store) | synth rows/s (whole version) | bytes on disk |", "|---|---|---|---|"]
    for n, y in sorted(report["synth"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {int(n):.0e} | {y.get('store_rows_per_s', y['rows_per_s']) / 1e6:.2f} M | "
                     f"{y['rows_per_s'] / 1e6:.2f} M | {y['bytes_on_disk'] / 2**20:,.0f} MiB |")
    sw = report.get("swap")
    if sw:
        lines += ["", "| swap at | requests | failed | steady p99 ms | worst 1-s p99 after v2 appears ms | "
                  "first 100 on v2 p99 ms | first 100 on v1 again p99 ms | PSS steady / peak MiB | "
                  "v2 appears -> serving s | rollback -> v1 serving s | worst steady bin / steady p99 | "
                  "bins > 2x steady p99: steady, after v2 appears |", "|---|---|---|---|---|---|---|---|---|---|---|---|",
                  f"| {sw['rows']:.0e} | {sw['requests']} | {sw['failed_requests']} | {sw['steady_p99_ms']:.0f} | "
                  f"{sw['max_bin_p99_ms_after_v2_appears']:.0f} | {sw['first_100_on_v2_p99_ms']:.0f} | "
                  f"{sw['first_100_on_v1_again_p99_ms']:.0f} | {sw['pss_steady_mb']:.0f} / {sw['pss_peak_mb']:.0f} | "
                  f"{sw['v2_appears_to_serving_s']:.1f} | {sw['rollback_to_v1_serving_s']:.1f} | "
                  f"{sw.get('steady_max_bin_p99_over_steady', float('nan')):.2f} | "
                  f"{_fraction(sw, 'steady')}, {_fraction(sw, 'after_v2_appears')} |"]
    acc = report.get("acceptance") or {}
    if acc:
        lines += ["", "| issue 12 check | value | limit | ok |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['value']:.3g} | {v['limit']} | {'yes' if v['ok'] else '**no**'} |"
                  for k, v in acc.items()]
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for w, color in ((1, "tab:blue"), (2, "tab:orange")):
        for pop, style in (("zipf", "-"), ("uniform", "--")):
            rs = sorted((r for r in runs if r["workers"] == w and r["popularity"] == pop), key=lambda r: r["rows"])
            if rs:
                x = [r["rows"] for r in rs]
                ax.plot(x, [r["pss_under_load_mb"] for r in rs], style, color=color, marker="o",
                        label=f"workers {w}, {pop}, under load")
                ax.plot(x, [r["pss_after_warmup_mb"] for r in rs], style, color=color, marker="x", alpha=0.5,
                        label=f"workers {w}, {pop}, after warm-up")
    for lim in (ACCEPTANCE["pss_w1_mb"], ACCEPTANCE["pss_w2_mb"]):
        ax.axhline(lim, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("total rows")
    ax.set_ylabel("total PSS of the server's processes (MiB)")
    ax.set_title("offgraph serve memory vs model size (int8, D=16, default caches)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scale_memory.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for ax, pop in zip(axes, POPULARITIES):
        for w, color in ((1, "tab:blue"), (2, "tab:orange")):
            rs = sorted((r for r in runs if r["workers"] == w and r["popularity"] == pop), key=lambda r: r["rows"])
            if rs:
                x = [r["rows"] for r in rs]
                ax.plot(x, [r["c1"]["p50_ms"] for r in rs], "-o", color=color, label=f"workers {w} p50 (c=1)")
                ax.plot(x, [r["c1"]["p99_ms"] for r in rs], "--o", color=color, label=f"workers {w} p99 (c=1)")
        ax.set_xscale("log")
        ax.set_xlabel("total rows")
        ax.set_ylabel("latency (ms), N=200")
        ax.set_title(f"{pop} row popularity")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scale_latency.png", dpi=120)
    plt.close(fig)

    sw = report.get("swap")
    if sw:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        t = [b["t"] for b in sw["bins"]]
        ax.plot(t, [b["p99_ms"] for b in sw["bins"]], "-", color="tab:red", label="p99 per 1-s bin")
        ax.plot(t, [b["p50_ms"] for b in sw["bins"]], "-", color="tab:blue", label="p50 per 1-s bin")
        ax.axhline(sw["steady_p99_ms"] * ACCEPTANCE["swap_bin_p99_ratio"], color="grey", ls=":",
                   label="2x steady p99")
        for name, c in (("v2_appears", "green"), ("v2_serving", "green"), ("rollback_called", "purple"),
                        ("v1_serving", "purple")):
            ax.axvline(sw["events"][name], color=c, ls="--" if "serving" in name else "-", lw=0.8)
            ax.text(sw["events"][name], ax.get_ylim()[1] * 0.95, name, rotation=90, fontsize=7, va="top")
        ax.set_xlabel("seconds")
        ax.set_ylabel("latency (ms), N=200, concurrency 8")
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in sw["pss_samples"]], [p[1] / 2**20 for p in sw["pss_samples"]], color="black",
                 lw=0.8, alpha=0.6, label="PSS (MiB)")
        ax2.set_ylabel("total PSS (MiB)")
        ax.set_title(f"swap under load at {sw['rows']:,} rows: {sw['failed_requests']} failed requests")
        ax.legend(loc="upper left", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "scale_swap.png", dpi=120)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1e6,1e7,1e8,2e8,1e9", help="total rows, comma separated")
    p.add_argument("--workdir", default=str(REPO / "out" / "scale-models"),
                   help="where the versions are written (needs the disk printed at the start)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "scale"))
    p.add_argument("--workers", default="1,2")
    p.add_argument("--popularities", default=",".join(POPULARITIES))
    p.add_argument("--swap-size", type=count, default=2 * 10**8, help="rows of the swap experiment (0: none)")
    p.add_argument("--keep", action="store_true", help="keep every version written (default: delete those of "
                                                      "--delete-from rows and more once measured)")
    p.add_argument("--delete-from", type=count, default=10**8)
    p.add_argument("--candidates", type=int, default=200)
    p.add_argument("--warmup-requests", type=int, default=200, help="the warm-up's first round (concurrency 8)")
    p.add_argument("--warmup-max-s", type=float, default=420.0,
                   help="then rounds of fresh requests while the server reads from the disk, until its disk reads "
                        "per request level off, at most this long (bench/scale_warmup.py; 0: the first round only)")
    p.add_argument("--warmup-round-s", type=float, default=10.0)
    p.add_argument("--warmup-level", type=float, default=0.10,
                   help="leveled off: a round reads at least (1 - this) times the disk KiB per request of the round "
                        "3 rounds before")
    p.add_argument("--c1-requests", type=int, default=300)
    p.add_argument("--c8-requests", type=int, default=4000)
    p.add_argument("--seconds", type=float, default=20.0, help="most seconds of each measured phase")
    p.add_argument("--swap-warm-s", type=float, default=20.0,
                   help="traffic before the steady phase, not measured: v1's working set into the page cache")
    p.add_argument("--swap-steady-s", type=float, default=20.0)
    p.add_argument("--swap-after-s", type=float, default=15.0)
    p.add_argument("--swap-bodies", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--disk-probe-s", type=float, default=10.0,
                   help="seconds of cold O_DIRECT reads of the version's files before each measurement (and after "
                        "the swap): the disk's latency in the same run (bench/disk_probe.py; 0: off)")
    p.add_argument("--settle-p999-ms", type=float, default=20.0,
                   help="after writing a version, wait until the disk's cold reads have a p99.9 of at most this "
                        "(bench/disk_probe.py: this VM's disk reads slowly for minutes after GBs of writes)")
    p.add_argument("--settle-max-s", type=float, default=900.0, help="wait at most this long for it (0: no wait)")
    p.add_argument("--serve-args", default="", help="more flags for every `offgraph serve`, e.g. "
                                                      "'--cache-mb 128 --warmup-rows 300000' (default: none, the "
                                                      "defaults are what is measured)")
    p.add_argument("--resume", action="store_true",
                   help="keep the figures of OUT/scale.json and measure only what it lacks (a run cut short, "
                        "or sizes run one at a time)")
    args = p.parse_args(argv)
    try:
        sizes = sorted({count(s) for s in args.sizes.split(",") if s.strip()})
        workers = [int(w) for w in args.workers.split(",")]
        pops = [x for x in args.popularities.split(",") if x]
    except Exception as e:  # noqa: BLE001 - a bad flag: say which
        p.error(f"bad --sizes/--workers/--popularities: {e}")
    if set(pops) - set(POPULARITIES):
        p.error(f"--popularities: choose from {POPULARITIES}")
    for n in sizes + ([args.swap_size] if args.swap_size else []):
        try:
            SynthConfig(rows=n)
        except ValueError as e:
            p.error(str(e))
    swap_size = args.swap_size or None
    work, out, logs = Path(args.workdir), Path(args.out), Path(args.out) / "logs"
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    present = frozenset(n for n in sizes if (work / f"m{n}" / MODEL / "1" / "manifest.json").exists())
    need = disk_plan(sizes, swap_size, args.keep, args.delete_from, present)
    free = shutil.disk_usage(work).free
    _log(f"sizes {[f'{n:.0e}' for n in sizes]}, swap at {swap_size or 'none'}: needs about {need / 1e9:.1f} GB of "
         f"disk under {work} at the peak ({free / 1e9:.1f} GB free)")
    if need > free:
        raise SystemExit(f"not enough disk under {work}: need about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")

    report: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                "mem_total_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9},
                    "args": vars(args), "synth": {}, "runs": [], "swap": None}
    json_path = out / "scale.json"
    if args.resume and json_path.exists():
        old = json.loads(json_path.read_text())
        report.update({k: old[k] for k in ("synth", "runs", "swap") if old.get(k)})
        _log(f"resuming {json_path}: {len(report['runs'])} runs{', the swap' if report['swap'] else ''} kept")
    done = {(r["rows"], r["workers"], r["popularity"]) for r in report["runs"]}
    sweep = sorted(set(sizes) | ({swap_size} if swap_size else set()))
    for n in sweep:
        todo = [(w, pop) for w in workers for pop in pops if n in sizes and (n, w, pop) not in done]
        swap_todo = n == swap_size and not (report["swap"] and report["swap"]["rows"] == n)
        if not todo and not swap_todo:
            continue
        models = work / f"m{n}"
        m = synth(models / MODEL / "1", n, args.seed, logs / f"synth-{n}.log")
        rows = sum(m["store"]["row_counts"].values())
        report["synth"][str(n)] = {"rows": rows, "store_seconds": m["export_seconds"]["store"],
                                   "total_seconds": m["export_seconds"]["total"],
                                   "store_rows_per_s": rows / m["export_seconds"]["store"],
                                   # the whole version: store, dense head, manifest (bounded checksums)
                                   "rows_per_s": rows / m["export_seconds"]["total"],
                                   "bytes_on_disk": m["store"]["bytes_on_disk"],
                                   "disk_bytes_per_row": m["store"]["bytes_on_disk"] / rows,
                                   "settle": _settle(models / MODEL / "1", args)}
        for w, pop in todo:
            r = measure(models, w, pop, n, args, logs)
            r["disk_bytes_per_row"] = report["synth"][str(n)]["disk_bytes_per_row"]
            report["runs"].append(r)
            json_path.write_text(json.dumps(report, indent=1))  # partial results survive a crash (--resume)
        if swap_todo:
            report["swap"] = swap_experiment(models, n, args, logs)
        if not args.keep and n >= args.delete_from:
            _log(f"deleting {models}")
            shutil.rmtree(models, ignore_errors=True)
        json_path.write_text(json.dumps(report, indent=1))
    report["acceptance"] = acceptance(report)
    json_path.write_text(json.dumps(report, indent=1))
    plot(report, out)
    (out / "scale.md").write_text(markdown(report))
    for k, v in report["acceptance"].items():
        _log(f"{'OK  ' if v['ok'] else 'FAIL'} {k}: {v['value']:.3g} (limit {v['limit']})")
    _log(f"wrote {json_path} and the PNGs next to it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

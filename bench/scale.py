"""Tables beyond RAM: serve synthetic models of 10^6 .. 10^9 rows and swap big versions under load.

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
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.disk_probe import describe, settle
from bench.scale_server import ScaleServer, cli_module, find_key, hit_ratios
from bench.scale_swap import run_swap, summarize
from bench.scale_traffic import POPULARITIES, build_requests
from bench.scale_traffic import bodies as to_bodies
from bench.scale_warmup import kib_per_request, warm_until_steady
from bench.serve_latency import run_cell
from offgraph.cli.synth import count
from offgraph.export.synth_config import DISK_MARGIN, SynthConfig
from offgraph.modeldir.manifest_model import Manifest
from offgraph.store.config import DEFAULT_READ_THREADS  # the store's, where the server does not report its own
from offgraph.store.device_probe import DirectIOUnsupported, describe_profile, device_profile
from offgraph.store.prefetch import store_files

REPO = Path(__file__).resolve().parent.parent
MODEL = "scale"
ACCEPTANCE = {
    "pss_w1_mb": 1000,
    "pss_w2_mb": 1600,
    "pss_small_vs_big": 0.15,
    "ready_s": 15.0,
    "synth_rows_per_s": 1e6,
    # Zipf c1 p99 at the biggest size <= the p99 at 10^7 + this x the predicted read time
    "p99_pred_factor": 2.0,
    "p99_spread": 0.25,  # the repeats' c1 p99 within +-25% of their median
    "uniform_rps_share": 0.8,  # uniform c8 req/s >= this x (device reads/s at depth 8 / misses per request)
    "lfu_gap_points": 3.0,  # row-cache hit ratio at most 3 points below perfect LFU on the same trace
    "swap_p99_ratio": 1.3,
    "swap_steady_s": 20.0,
    "swap_steady_requests": 2000,
    "swap_pss_mb": 1500,
    "swap_bin_p99_ratio": 2.0,  # drawn on the swap's plot (the 1-s bins)
    "regression_ratio": 1.10,  # new / old c1 p50 and p99 at most this, c8 req/s at least its inverse
}


def _log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- versions --------------------------------------------------------------------------------------------
def synth(out: Path, rows: int, seed: int, log_path: Path, code: Path = REPO) -> Manifest:
    """``offgraph synth`` into ``out`` unless a complete version of the same rows and seed is there.
    ``code``: the checkout whose synth writes it (the old code's servers may not read a new version)."""
    manifest = out / "manifest.json"
    if manifest.exists():
        m = Manifest.from_json(manifest.read_text())
        syn = (m.training or {}).get("synthetic") or {}
        if syn.get("rows") == rows and syn.get("seed") == seed:
            _log(f"reusing {out} ({rows:,} rows)")
            return m
        raise SystemExit(f"{out} holds another version ({syn}); remove it or choose another --workdir")
    _log(f"synth {rows:,} rows -> {out}")
    cmd = [
        sys.executable,
        "-m",
        cli_module(code),
        "synth",
        "--out",
        str(out),
        "--rows",
        str(rows),
        "--seed",
        str(seed),
    ]
    with open(log_path, "w") as log:
        r = subprocess.run(cmd, cwd=code, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"offgraph synth failed ({r.returncode}); see {log_path}")
    print(Path(log_path).read_text().strip().splitlines()[-1], flush=True)
    os.sync()  # the kernel's writeback of GBs of fresh files must not land in a measured phase
    return Manifest.from_json(manifest.read_text())


def disk_plan(
    sizes: list[int], swap_size: int | None, keep: bool, delete_from: int, present: frozenset[int] = frozenset()
) -> int:
    """Peak bytes the run writes: the kept versions plus the biggest one alive at a time. ``present``:
    sizes whose version is already on disk (reused: nothing to write)."""
    est = [0 if n in present else SynthConfig(rows=n).disk_bytes() for n in sizes]
    kept = sum(e for n, e in zip(sizes, est) if keep or n < delete_from)
    alive = max(
        (e * (2 if n == swap_size else 1) for n, e in zip(sizes, est) if not (keep or n < delete_from)), default=0
    )
    if swap_size is not None and swap_size not in sizes:
        alive = max(alive, 2 * SynthConfig(rows=swap_size).disk_bytes())
    return int((kept + alive) * DISK_MARGIN)


# -- one server, one popularity ------------------------------------------------------------------------
def measure(
    models: Path,
    workers: int,
    popularity: str,
    rows: int,
    args,
    logs: Path,
    *,
    code: Path | None = None,
    serve_args: str | None = None,
    repeat: int = 0,
) -> dict:
    """One cell on a fresh server. ``code``: the checkout whose server runs (None: this one; else the
    ``--baseline-repo``, with ``serve_args``, its own flags)."""
    n_warm, n_c1, n_c8 = args.warmup_requests, args.c1_requests, args.c8_requests
    reqs = build_requests(rows, n_warm + n_c1 + n_c8 + 2, args.candidates, popularity, seed=args.seed)
    bodies = to_bodies(reqs)
    del reqs
    which = "baseline" if code else "new"
    device = _probe(models / MODEL / "1", args)  # before the server starts: nothing else reads the disk
    server = ScaleServer(
        models,
        workers,
        logs / f"serve-{rows}-w{workers}-{popularity}-{which}{repeat}.log",
        (args.serve_args if serve_args is None else serve_args).split(),
        code=code,
    )
    path = f"/v1/models/{MODEL}:score"
    try:
        ready_s = server.wait_ready()
        load_s = server.version_load_s()
        pss_ready = server.pss_bytes()
        loop = asyncio.new_event_loop()
        try:
            made: dict[int, int] = {}  # warm-up round -> bodies drawn for it (the hit-ratio trace replays them)

            def more(k: int, n: int) -> list[bytes]:  # fresh warm-up bodies, seeds apart from the measured ones
                made[k] = n
                return to_bodies(build_requests(rows, n, args.candidates, popularity, seed=args.seed + 1000 + k))

            warmup = loop.run_until_complete(
                warm_until_steady(
                    server,
                    path,
                    bodies[:n_warm],
                    more,
                    args.candidates,
                    args.warmup_round_s,
                    args.warmup_max_s,
                    args.warmup_level,
                )
            )
            time.sleep(0.6)  # the workers publish their counters every 0.25 s
            pss_warm = server.pss_bytes()
            c0, d0 = server.counters(), server.disk_read_bytes()
            c1 = loop.run_until_complete(
                run_cell(
                    "127.0.0.1",
                    server.port,
                    path,
                    bodies[n_warm : n_warm + n_c1],
                    1,
                    n_c1,
                    args.seconds,
                    1,
                    args.candidates,
                    server.pid,
                )
            )
            d1 = server.disk_read_bytes()
            time.sleep(0.6)
            cm = server.counters()
            samples: list[int] = []

            async def c8_with_pss():
                stop = asyncio.Event()

                async def sample():
                    while not stop.is_set():
                        samples.append(server.pss_bytes())
                        await asyncio.sleep(0.25)

                task = asyncio.create_task(sample())
                try:
                    return await run_cell(
                        "127.0.0.1",
                        server.port,
                        path,
                        bodies[n_warm + n_c1 :],
                        8,
                        n_c8,
                        args.seconds,
                        1,
                        args.candidates,
                        server.pid,
                    )
                finally:
                    stop.set()
                    await task

            c8 = loop.run_until_complete(c8_with_pss())
            d8 = server.disk_read_bytes()
        finally:
            loop.close()
        time.sleep(0.6)
        c9 = server.counters()
        status = server.model_status(MODEL)
        ratios = hit_ratios(c0, c9)
    finally:
        server.stop()
    capacity = find_key(status, "cache_capacity_rows") or find_key(status, "capacity_rows")
    threads = find_key(status, "read_threads")
    row = {
        "rows": rows,
        "workers": workers,
        "popularity": popularity,
        "code": which,
        "repeat": repeat,
        "start_to_ready_s": ready_s,
        "version_load_s": load_s,
        "device": device,
        "warmup": warmup,
        "pss_ready_mb": pss_ready / 2**20,
        "pss_after_warmup_mb": pss_warm / 2**20,
        "pss_under_load_mb": max(samples or [0]) / 2**20,
        "c1": c1,
        "c8": c8,
        **ratios,
        "row_cache_capacity_rows": capacity,
        "read_threads": threads or DEFAULT_READ_THREADS,
        "read_threads_reported": threads is not None,
        # what the page cache did not hold: read from the disk, per measured request
        "c1_disk_kib_per_request": kib_per_request(d1 - d0, c1["requests"]),
        "c8_disk_kib_per_request": kib_per_request(d8 - d1, c8["requests"]),
    }
    for phase, (a, b, cell) in (("c1", (c0, cm, c1)), ("c8", (cm, c9, c8))):
        row[phase].update(reads_per_request(a, b, cell["requests"]))
    row["c1"]["prediction"] = predicted_read(row["c1"]["misses_per_request"], row["read_threads"], device)
    c8_model = predicted_read(row["c8"]["misses_per_request"], row["read_threads"], device)
    row["c8"]["device_bound_rps"] = c8_model and c8_model["c8_bound_req_s"]
    if not code and popularity == "zipf" and capacity and not repeat:  # (replays the whole key trace: first run only)
        warm = [(k, made[k], rd["requests"]) for k, rd in enumerate(warmup["rounds"]) if k in made]
        sent = [range(n_warm, n_warm + c1["requests"]), range(n_warm + n_c1, n_warm + n_c1 + c8["requests"])]
        row["perfect_lfu_hit_ratio"] = perfect_lfu(rows, args, warm, sent, int(capacity))
    if not code and not repeat:
        row["plan"] = plan_for(row, find_key(status, "memory_mb"), args)
    _log(
        f"{rows:.0e} rows w{workers} {popularity:7s} {which} {repeat}: ready {ready_s:5.1f}s (version {_load(row)}s)  "
        f"warm-up {_warm(row)} ({warmup['stopped']}, {len(warmup['rounds'])} rounds, first round c8 p99 "
        f"{warmup['rounds'][0]['p99_ms']:.0f} ms)  "
        f"PSS warm {row['pss_after_warmup_mb']:6.0f} "
        f"load {row['pss_under_load_mb']:6.0f} MB  c1 p50 {c1['p50_ms']:6.1f} p99 {c1['p99_ms']:6.1f} ms  "
        f"c8 {c8['rps']:5.0f} req/s p99 {c8['p99_ms']:6.1f} ms  row-cache {ratios['row_cache_hit_ratio'] or 0:.3f} "
        f"(perfect LFU {_num(row.get('perfect_lfu_hit_ratio'), '.3f')}; plan {_plan_cell(row.get('plan'))}) "
        f"block-cache {ratios['block_cache_hit_ratio'] or 0:.3f}; misses/request c1 {_num(c1['misses_per_request'], '.1f')}, "
        f"predicted read {_num((c1['prediction'] or {}).get('read_ms_c1'), '.2f')} ms, measured "
        f"{_num(c1['read_ms_per_request'], '.2f')} ms; from disk c1 {row['c1_disk_kib_per_request']:.0f} "
        f"c8 {row['c8_disk_kib_per_request']:.0f} KiB/request; {_describe(device)}"
    )
    return row


# -- figures predicted from the disk ----------------------------------------------------------------------
PROBE_DEPTHS = (1, 8)
SHARDS = 8  # offgraph synth's


def reads_per_request(before: dict[str, float], after: dict[str, float], requests: int) -> dict:
    """Row-cache misses per request between two ``ScaleServer.counters`` (each miss reads a row from the
    store), and the store reads' measured wall time per request (``offgraph_store_read_seconds``; None
    where the server does not record it)."""
    n = max(1, requests)
    read_count = after["read_count"] - before["read_count"]
    return {
        "misses_per_request": (after["row_misses"] - before["row_misses"]) / n,
        "read_ms_per_request": (after["read_s_sum"] - before["read_s_sum"]) * 1e3 / n if read_count else None,
    }


def predicted_read(
    misses_per_request: float | None, read_threads: int, device: dict | None, shards: int = SHARDS
) -> dict | None:
    """The read time per request the disk predicts for the measured misses: ``offgraph.export.plan.read_time``
    (the one model, ``offgraph plan``'s): (misses per request / reads in flight) x the device's MEAN
    latency at that depth (its probe at depths 1 and 8, linear between), reads in flight = the
    ``multi_get`` chunks a request's misses make, at least 1 and at most the read threads. Also the c8
    bound: reads/s at depth 8 / misses per request. None without a probe."""
    if misses_per_request is None or not device:
        return None
    from offgraph.export.plan import Device, read_time

    return read_time(misses_per_request, Device.from_profile(device), int(read_threads), shards)


def perfect_lfu(rows: int, args, warm: list[tuple[int, int, int]], sent: list[range], capacity_rows: int) -> float:
    """Perfect LFU's hit ratio (``offgraph.export.cache_sim``'s static oracle) at ``capacity_rows`` on the key
    trace the server's row cache saw: the warm-up (its first ``--warmup-requests`` bodies, then for each
    later round ``(k, bodies drawn, requests sent)``, bodies cycled as ``run_cell`` sends them), then the
    measured requests (``sent``: ranges of the measured bodies' indices), counted over the measured ones
    only. The keys are those the server computes from the same draws as ``measure``'s bodies
    (``build_requests``' columns, same seeds), built as columns (``offgraph.export.plan.request_keys``, exact:
    ``tests/export/test_plan.py`` checks them against the FG's), not through FG request by request (minutes)."""
    from offgraph.export.cache_sim import perfect_lfu_hit_ratio, trace_of
    from offgraph.export.plan import request_keys
    from offgraph.export.traffic import draw_columns

    def keys(n: int, seed: int) -> list:
        req, cand = draw_columns(rows, n, args.candidates, "zipf", seed)
        return request_keys(rows, req, cand, n, exact=True)

    full = keys(args.warmup_requests + args.c1_requests + args.c8_requests + 2, args.seed)
    lists = full[: args.warmup_requests]
    for k, drawn, requests in warm:
        tr = keys(drawn, args.seed + 1000 + k)
        lists += [tr[i % drawn] for i in range(requests)]
    warm_requests = len(lists)
    lists += [full[i] for r in sent for i in r]
    return perfect_lfu_hit_ratio(trace_of(lists), capacity_rows, warm_requests=warm_requests)


def plan_for(run: dict, memory_mb: float | None, args) -> dict | None:
    """``offgraph plan``'s prediction for the cell (``offgraph.export.plan.predict``, from the cell's own device
    probe, at the cell's memory budget): its simulated hit ratio and read time, beside the measured ones.
    None without a probe or where ``--plan-max-s`` is 0."""
    if not run.get("device") or args.plan_max_s <= 0:
        return None
    from offgraph.export.plan import Device, predict
    from offgraph.scoring.memory_budget import DEFAULT_MEMORY_MB

    got = predict(
        run["rows"],
        memory_mb or DEFAULT_MEMORY_MB,
        run["popularity"],
        candidates=args.candidates,
        device=Device.from_profile(run["device"]),
        read_threads=int(run["read_threads"]),
        max_seconds=args.plan_max_s,
    )
    return {
        "hit_ratio": got["hit"]["hit_ratio"],
        "converged": got["hit"]["converged"],
        "misses_per_request": got["misses_per_request"],
        "read_ms": got["read_ms_c1"],
        "c8_bound_req_s": got["c8_bound_req_s"],
        "row_cache_rows": got["row_cache_rows"],
        "memory_mb": got["inputs"]["memory_mb"],
        "reads_per_miss": got["reads_per_miss"],
    }


def _probe(version: Path, args) -> dict | None:
    """The device's direct random-read latency on ``version``'s store files at queue depths 1 and 8
    (``offgraph.store.device_probe``), ``--disk-probe-s`` split between them; None where off or refused."""
    if args.disk_probe_s <= 0:
        return None
    try:
        return device_profile(store_files(version / "store"), args.disk_probe_s / len(PROBE_DEPTHS), PROBE_DEPTHS)
    except DirectIOUnsupported as e:
        _log(f"disk probe: {e}")
        return None


def _describe(device: dict | None) -> str:
    return describe_profile(device) if device else "disk probe: n/a"


def _num(x, fmt: str) -> str:
    return "?" if x is None else format(x, fmt)


def _settle(version: Path, args) -> dict | None:
    """After writing ``version``, wait until the disk's cold reads are back to normal
    (``bench.disk_probe.settle``: p99.9 <= ``--settle-p999-ms``, at most ``--settle-max-s``)."""
    if args.settle_max_s <= 0 or args.disk_probe_s <= 0:
        return None
    got = settle(store_files(version / "store"), args.settle_p999_ms, args.settle_max_s)
    last = got["probes"][-1] if got["probes"] else None
    _log(
        f"disk {'settled' if got['settled'] else 'NOT settled' if got['settled'] is False else 'not probed'} "
        f"after {got['waited_s']:.0f}s ({len(got['probes'])} probes; last: {describe(last)})"
    )
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
        _log(
            f"swap at {rows:,} rows: {args.swap_warm_s:g}s not measured, steady {args.swap_steady_s:g}s, then v2 "
            f"appears, then rollback"
        )
        raw = asyncio.run(
            run_swap(
                server,
                MODEL,
                models,
                hidden,
                bodies,
                steady_s=args.swap_steady_s,
                after_s=args.swap_after_s,
                warm_s=args.swap_warm_s,
                steady_requests=args.swap_steady_requests,
                steady_max_s=args.swap_steady_max_s,
            )
        )
    finally:
        server.stop()
        policy.unlink(missing_ok=True)
        shutil.rmtree(models / MODEL / "2", ignore_errors=True)
        shutil.rmtree(hidden, ignore_errors=True)
    out = {
        "rows": rows,
        "workers": 1,
        **summarize(raw),
        "settle_after_v2_synth": settled_v2,
        "disk_probe_before": disk_before,
        "disk_probe_after": _probe(models / MODEL / "1", args),
    }
    _log(
        f"swap: {out['failed_requests']} failed of {out['requests']}; steady p99 {out['steady_p99_ms']:.1f} ms "
        f"({out['steady_requests']} requests in {out['steady_s']:.0f} s), p99 of the {out['window_requests']} "
        f"requests from v2 appearing to {out['window_s']:g} s after it serves {out['window_p99_ms']:.1f} ms "
        f"(x{out['window_p99_over_steady']:.2f}), worst 1-s p99 after v2 appears {out['max_bin_p99_ms_after_v2_appears']:.1f} ms "
        f"(x{out['max_bin_p99_over_steady']:.2f}; worst steady-phase bin x{out['steady_max_bin_p99_over_steady']:.2f}, "
        f"bins over 2x: {_fraction(out, 'steady')} steady, {_fraction(out, 'after_v2_appears')} after); first 100 on v2 p99 {out['first_100_on_v2_p99_ms']:.1f} ms; "
        f"PSS peak {out['pss_peak_mb']:.0f} MB; v2 serving {out['v2_appears_to_serving_s']:.1f}s after it appeared, "
        f"v1 {out['rollback_to_v1_serving_s']:.1f}s after the rollback; before: {_describe(disk_before)}; after: "
        f"{_describe(out['disk_probe_after'])}; per bin, major faults / page-cache refaults: "
        f"{_per_bin(out['faults_in_bins_over_2x'])} in bins over 2x, "
        f"{_per_bin(out['faults_in_other_bins_after_v2_appears'])} in the others after v2 appears"
    )
    return out


def _per_bin(sums: dict) -> str:
    return f"{sums['major_faults_per_bin']} / {sums['page_cache_refaults_per_bin']}"


# -- report -------------------------------------------------------------------------------------------------
def _check(value, limit, op: str = "<=") -> dict:
    """One acceptance line: ``value op limit`` (None: not measured, not ok)."""
    ok = value is not None and value == value and (value <= limit if op == "<=" else value >= limit)
    return {"value": value, "limit": limit, "op": op, "ok": bool(ok)}


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else None


def cells(runs: list[dict], rows: int, workers: int, popularity: str, code: str = "new") -> list[dict]:
    """The runs of one cell (repeats, fresh servers), in the order they ran (older reports: all ``new``)."""
    return [
        r
        for r in runs
        if r["rows"] == rows
        and r["workers"] == workers
        and r["popularity"] == popularity
        and r.get("code", "new") == code
    ]


def regression(runs: list[dict]) -> list[dict]:
    """Per cell measured with the old code too (``--baseline-repo``): the medians of the new and the old
    runs' c1 p50/p99 and c8 throughput, and new / old."""
    out = []
    for rows, w, pop in sorted(
        {(r["rows"], r["workers"], r["popularity"]) for r in runs if r.get("code") == "baseline"}
    ):
        new, old = cells(runs, rows, w, pop), cells(runs, rows, w, pop, "baseline")
        line = {"rows": rows, "workers": w, "popularity": pop, "runs_new": len(new), "runs_old": len(old)}
        for key, get in (
            ("c1_p50_ms", lambda r: r["c1"]["p50_ms"]),
            ("c1_p99_ms", lambda r: r["c1"]["p99_ms"]),
            ("c8_rps", lambda r: r["c8"]["rps"]),
        ):
            n, o = _median(map(get, new)), _median(map(get, old))
            line[key] = {
                "new": n,
                "old": o,
                "new_over_old": n / o if n is not None and o else None,
                # the old runs' own spread: the noise the ratio sits in
                "old_spread": (max(map(get, old)) - min(map(get, old))) / o if len(old) > 1 and o else None,
            }
        out.append(line)
    return out


def acceptance(report: dict) -> dict:
    """The acceptance lines of tables beyond RAM, for the biggest size of the run (10^9 in the default
    sweep) against the 10^7 cell (else the smallest size measured), the swap and the old code."""
    runs = report["runs"]
    new_runs = [r for r in runs if r.get("code", "new") == "new"]
    out: dict = {}
    if not new_runs:
        return out
    sizes = sorted({r["rows"] for r in new_runs})
    big, ref = sizes[-1], 10**7 if 10**7 in sizes else sizes[0]
    for w, key in ((1, "pss_w1_mb"), (2, "pss_w2_mb")):
        rs = [r for r in new_runs if r["rows"] == big and r["workers"] == w]
        if rs:
            worst = max(max(r["pss_after_warmup_mb"], r["pss_under_load_mb"]) for r in rs)
            out[f"pss_workers{w}_at_{big:.0e}_mb"] = _check(worst, ACCEPTANCE[key])
    zipf = cells(runs, big, 1, "zipf")
    if zipf:
        p99 = _median(r["c1"]["p99_ms"] for r in zipf)
        pred = _median((r["c1"].get("prediction") or {}).get("read_ms_c1") for r in zipf)
        ref_p99 = _median(r["c1"]["p99_ms"] for r in cells(runs, ref, 1, "zipf"))
        if big != ref and ref_p99 is not None and pred is not None:
            # c1 p99 <= the p99 at 10^7 + 2 x the predicted read time (medians over the repeats)
            out[f"zipf_c1_p99_w1_at_{big:.0e}_ms"] = _check(p99, ref_p99 + ACCEPTANCE["p99_pred_factor"] * pred)
        if len(zipf) >= 2:
            spread = max(abs(r["c1"]["p99_ms"] - p99) / p99 for r in zipf)
            out[f"zipf_c1_p99_w1_at_{big:.0e}_spread_of_{len(zipf)}_runs"] = _check(spread, ACCEPTANCE["p99_spread"])
    for r in cells(runs, big, 1, "uniform")[:1]:
        bound = r["c8"].get("device_bound_rps")
        # c8 throughput >= 0.8 x (device reads/s at depth 8 / misses per request)
        out[f"uniform_c8_rps_at_{big:.0e}_over_device_bound"] = _check(
            r["c8"]["rps"] / bound if bound else None, ACCEPTANCE["uniform_rps_share"], ">="
        )
    for n in sizes:
        for r in cells(runs, n, 1, "zipf")[:1]:
            if r.get("perfect_lfu_hit_ratio") is not None and r.get("row_cache_hit_ratio") is not None:
                gap = 100 * (r["perfect_lfu_hit_ratio"] - r["row_cache_hit_ratio"])
                out[f"row_cache_hit_points_below_perfect_lfu_at_{n:.0e}"] = _check(gap, ACCEPTANCE["lfu_gap_points"])
    for w in (1, 2):
        a, b = cells(runs, ref, w, "zipf")[:1], cells(runs, big, w, "zipf")[:1]
        if a and b and big != ref:
            rel = abs(b[0]["pss_under_load_mb"] - a[0]["pss_under_load_mb"]) / a[0]["pss_under_load_mb"]
            out[f"pss_under_load_w{w}_{ref:.0e}_vs_{big:.0e}"] = _check(rel, ACCEPTANCE["pss_small_vs_big"])
    out[f"start_to_ready_at_{big:.0e}_s"] = _check(
        max(r["start_to_ready_s"] for r in new_runs if r["rows"] == big), ACCEPTANCE["ready_s"]
    )
    syn = report["synth"].get(str(big))
    if syn and syn.get("rows_per_s"):
        out[f"synth_rows_per_s_at_{big:.0e}"] = _check(syn["rows_per_s"], ACCEPTANCE["synth_rows_per_s"], ">=")
    sw = report.get("swap")
    if sw:
        out["swap_failed_requests"] = _check(sw["failed_requests"], 0)
        if "window_p99_over_steady" in sw:
            out["swap_window_p99_over_steady"] = _check(sw["window_p99_over_steady"], ACCEPTANCE["swap_p99_ratio"])
            out["swap_steady_s"] = _check(sw["steady_s"], ACCEPTANCE["swap_steady_s"], ">=")
            out["swap_steady_requests"] = _check(sw["steady_requests"], ACCEPTANCE["swap_steady_requests"], ">=")
        out["swap_pss_peak_mb"] = _check(sw["pss_peak_mb"], ACCEPTANCE["swap_pss_mb"])
    for line in regression(runs):
        name = f"{line['rows']:.0e}_w{line['workers']}_{line['popularity']}_new_over_old"
        lim = ACCEPTANCE["regression_ratio"]
        out[f"c1_p50_{name}"] = _check(line["c1_p50_ms"]["new_over_old"], lim)
        out[f"c1_p99_{name}"] = _check(line["c1_p99_ms"]["new_over_old"], lim)
        out[f"c8_rps_{name}"] = _check(line["c8_rps"]["new_over_old"], 1 / lim, ">=")
    return out


def _disk(run: dict) -> str:
    """The cell's direct reads at depth 1 before it: p99.9 / max ms (older reports: the cold-read probe)."""
    probe = (run.get("device") or {}).get("qd1") or run.get("disk_probe")
    return "?" if not probe else f"{probe['p999_ms']:.0f} / {probe['max_ms']:.0f}"


def _device_cell(device: dict | None) -> str:
    """Depth 1 and 8: mean / p99 ms, reads/s."""
    if not device:
        return "?"
    return " ; ".join(
        f"{k} {p['mean_ms']:.3f} / {p['p99_ms']:.2f} ms, {p['reads_per_s']:,.0f}/s" for k, p in device.items()
    )


def _plan_cell(plan: dict | None) -> str:
    if not plan:
        return "?"
    return f"{_num(plan.get('hit_ratio'), '.3f')} / {_num(plan.get('read_ms'), '.2f')} ms"


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
    """The figures as Markdown tables (``OUT/scale.md``, pasted into bench/results/)."""
    runs = sorted(
        report["runs"],
        key=lambda r: (
            r["rows"],
            r["workers"],
            r["popularity"] != "zipf",
            r.get("code", "new") != "new",
            r.get("repeat", 0),
        ),
    )
    lines = [
        "| rows | workers | popularity | code, run | ready s (version load s) | warm-up (disk KiB/request: first -> last round) | PSS warm MiB | PSS load MiB | c1 p50 ms | c1 p99 ms | "
        "c8 req/s | c8 p99 ms | row-cache hit | block-cache hit | read from disk KiB/request c1 / c8 | disk B/row | "
        "direct reads qd1 p99.9 / max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['rows']:.0e} | {r['workers']} | {r['popularity']} | {r.get('code', 'new')} {r.get('repeat', 0)} | "
            f"{r['start_to_ready_s']:.1f} ({_load(r)}) | {_warm(r)} | "
            f"{r['pss_after_warmup_mb']:.0f} | {r['pss_under_load_mb']:.0f} | {r['c1']['p50_ms']:.1f} | "
            f"{r['c1']['p99_ms']:.1f} | {r['c8']['rps']:.0f} | {r['c8']['p99_ms']:.0f} | "
            f"{r['row_cache_hit_ratio'] or 0:.3f} | {r['block_cache_hit_ratio'] or 0:.3f} | {_from_disk(r)} | "
            f"{r['disk_bytes_per_row']:.1f} | {_disk(r)} |"
        )
    lines += [
        "",
        "Predicted from the disk (the device probe just before each cell, direct 16-KiB random reads; "
        "`offgraph.export.plan.read_time`): read time per request = (row-cache misses per request / reads in "
        "flight) x the device's mean latency at that depth (depths 1 and 8 probed, linear between); reads "
        "in flight = the multi_get chunks the misses make, 1 to the read threads. `offgraph plan`: its "
        "simulated hit ratio and read time for the cell, from the same probe.",
        "",
        "| rows | workers | popularity | code, run | device qd1 ; qd8 (mean / p99 ms, reads/s) | c1 misses/request | "
        "reads in flight (mean latency there) | predicted read ms | measured read ms | c1 p50 / p99 ms | c8 misses/request | "
        "c8 req/s (device bound) | row-cache hit (perfect LFU) | plan: hit / read ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        c1, c8 = r["c1"], r["c8"]
        pr = c1.get("prediction") or {}
        lines.append(
            f"| {r['rows']:.0e} | {r['workers']} | {r['popularity']} | {r.get('code', 'new')} {r.get('repeat', 0)} | "
            f"{_device_cell(r.get('device'))} | {_num(c1.get('misses_per_request'), '.1f')} | "
            f"{_num(pr.get('reads_in_flight'), '.1f')} ({_num(pr.get('latency_at_depth_ms'), '.3f')} ms) | "
            f"{_num(pr.get('read_ms_c1'), '.2f')} | {_num(c1.get('read_ms_per_request'), '.2f')} | "
            f"{c1['p50_ms']:.1f} / {c1['p99_ms']:.1f} | {_num(c8.get('misses_per_request'), '.1f')} | "
            f"{c8['rps']:.0f} ({_num(c8.get('device_bound_rps'), '.0f')}) | "
            f"{_num(r.get('row_cache_hit_ratio'), '.3f')} ({_num(r.get('perfect_lfu_hit_ratio'), '.3f')}) | "
            f"{_plan_cell(r.get('plan'))} |"
        )
    reg = regression(report["runs"])
    if reg:
        lines += [
            "",
            "The old code (`--baseline-repo`) beside the new, alternated on fresh servers: medians, "
            "new / old, and the old runs' own spread ((max - min) / median).",
            "",
            "| rows | workers | popularity | runs new / old | c1 p50 ms new / old (x, old spread) | "
            "c1 p99 ms new / old (x, old spread) | c8 req/s new / old (x, old spread) |",
            "|---|---|---|---|---|---|---|",
        ]
        for g in reg:
            lines.append(
                f"| {g['rows']:.0e} | {g['workers']} | {g['popularity']} | {g['runs_new']} / {g['runs_old']} | "
                + " | ".join(
                    f"{_num(g[k]['new'], '.1f')} / {_num(g[k]['old'], '.1f')} "
                    f"(x{_num(g[k]['new_over_old'], '.3f')}, {_num(g[k]['old_spread'], '.0%')})"
                    for k in ("c1_p50_ms", "c1_p99_ms", "c8_rps")
                )
                + " |"
            )
    lines += ["", "| rows | synth rows/s (store) | synth rows/s (whole version) | bytes on disk |", "|---|---|---|---|"]
    for n, y in sorted(report["synth"].items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"| {int(n):.0e} | {y.get('store_rows_per_s', y['rows_per_s']) / 1e6:.2f} M | "
            f"{y['rows_per_s'] / 1e6:.2f} M | {y['bytes_on_disk'] / 2**20:,.0f} MiB |"
        )
    sw = report.get("swap")
    if sw:
        lines += [
            "",
            "| swap at | requests | failed | steady p99 ms (requests, s) | p99 from v2 appearing to 15 s "
            "after it serves ms (x steady) | worst 1-s p99 after v2 appears ms | "
            "first 100 on v2 p99 ms | first 100 on v1 again p99 ms | PSS steady / peak MiB | "
            "v2 appears -> serving s | rollback -> v1 serving s | worst steady bin / steady p99 | "
            "bins > 2x steady p99: steady, after v2 appears |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {sw['rows']:.0e} | {sw['requests']} | {sw['failed_requests']} | {sw['steady_p99_ms']:.0f} "
            f"({sw.get('steady_requests', '?')}, {_num(sw.get('steady_s'), '.0f')}) | "
            f"{_num(sw.get('window_p99_ms'), '.0f')} (x{_num(sw.get('window_p99_over_steady'), '.2f')}) | "
            f"{sw['max_bin_p99_ms_after_v2_appears']:.0f} | {sw['first_100_on_v2_p99_ms']:.0f} | "
            f"{sw['first_100_on_v1_again_p99_ms']:.0f} | {sw['pss_steady_mb']:.0f} / {sw['pss_peak_mb']:.0f} | "
            f"{sw['v2_appears_to_serving_s']:.1f} | {sw['rollback_to_v1_serving_s']:.1f} | "
            f"{sw.get('steady_max_bin_p99_over_steady', float('nan')):.2f} | "
            f"{_fraction(sw, 'steady')}, {_fraction(sw, 'after_v2_appears')} |",
        ]
    acc = report.get("acceptance") or {}
    if acc:
        lines += ["", "| acceptance: tables beyond RAM | value | limit | ok |", "|---|---|---|---|"]
        lines += [
            f"| {k} | {_num(v['value'], '.3g')} | {v.get('op', '<=')} {v['limit']:.4g} | "
            f"{'yes' if v['ok'] else '**no**'} |"
            for k, v in acc.items()
        ]
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["runs"] if r.get("code", "new") == "new" and not r.get("repeat")]  # one per cell
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for w, color in ((1, "tab:blue"), (2, "tab:orange")):
        for pop, style in (("zipf", "-"), ("uniform", "--")):
            rs = sorted((r for r in runs if r["workers"] == w and r["popularity"] == pop), key=lambda r: r["rows"])
            if rs:
                x = [r["rows"] for r in rs]
                ax.plot(
                    x,
                    [r["pss_under_load_mb"] for r in rs],
                    style,
                    color=color,
                    marker="o",
                    label=f"workers {w}, {pop}, under load",
                )
                ax.plot(
                    x,
                    [r["pss_after_warmup_mb"] for r in rs],
                    style,
                    color=color,
                    marker="x",
                    alpha=0.5,
                    label=f"workers {w}, {pop}, after warm-up",
                )
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
        ax.axhline(sw["steady_p99_ms"] * ACCEPTANCE["swap_bin_p99_ratio"], color="grey", ls=":", label="2x steady p99")
        for name, c in (
            ("v2_appears", "green"),
            ("v2_serving", "green"),
            ("rollback_called", "purple"),
            ("v1_serving", "purple"),
        ):
            ax.axvline(sw["events"][name], color=c, ls="--" if "serving" in name else "-", lw=0.8)
            ax.text(sw["events"][name], ax.get_ylim()[1] * 0.95, name, rotation=90, fontsize=7, va="top")
        ax.set_xlabel("seconds")
        ax.set_ylabel("latency (ms), N=200, concurrency 8")
        ax2 = ax.twinx()
        ax2.plot(
            [p[0] for p in sw["pss_samples"]],
            [p[1] / 2**20 for p in sw["pss_samples"]],
            color="black",
            lw=0.8,
            alpha=0.6,
            label="PSS (MiB)",
        )
        ax2.set_ylabel("total PSS (MiB)")
        ax.set_title(f"swap under load at {sw['rows']:,} rows: {sw['failed_requests']} failed requests")
        ax.legend(loc="upper left", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "scale_swap.png", dpi=120)
        plt.close(fig)


def _cell_key(run: dict) -> tuple:
    return run["rows"], run["workers"], run["popularity"], run.get("code", "new"), run.get("repeat", 0)


def plan_cells(n: int, workers: list[int], pops: list[str], args, baseline_sizes: set[int]) -> list[tuple]:
    """The cells of size ``n`` in the order they run: ``(rows, workers, popularity, code, run)``. A
    baseline cell alternates old and new code (old first), ``--baseline-runs`` each; the workers-1
    Zipf cell at ``--repeats-at`` runs ``--repeats`` times; every other cell once."""
    out = []
    for w in workers:
        for pop in pops:
            if n in baseline_sizes and pop in args.baseline_popularities.split(","):
                out += [
                    (n, w, pop, which, k) for k in range(max(1, args.baseline_runs)) for which in ("baseline", "new")
                ]
            else:
                reps = args.repeats if n == args.repeats_at and w == 1 and pop == "zipf" else 1
                out += [(n, w, pop, "new", k) for k in range(max(1, reps))]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1e7,1e8,2e8,1e9", help="total rows, comma separated")
    p.add_argument(
        "--workdir",
        default=str(REPO / "out" / "scale-models"),
        help="where the versions are written (needs the disk printed at the start)",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "scale"))
    p.add_argument("--workers", default="1", help="e.g. 1,2")
    p.add_argument("--popularities", default=",".join(POPULARITIES))
    p.add_argument("--swap-size", type=count, default=2 * 10**8, help="rows of the swap experiment (0: none)")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep every version written (default: delete those of --delete-from rows and more once measured)",
    )
    p.add_argument("--delete-from", type=count, default=10**8)
    p.add_argument("--candidates", type=int, default=200)
    p.add_argument("--warmup-requests", type=int, default=200, help="the warm-up's first round (concurrency 8)")
    p.add_argument(
        "--warmup-max-s",
        type=float,
        default=180.0,
        help="then rounds of fresh requests while the server reads from the disk, until its disk reads "
        "per request level off, at most this long (bench/scale_warmup.py; 0: the first round only)",
    )
    p.add_argument("--warmup-round-s", type=float, default=10.0)
    p.add_argument(
        "--warmup-level",
        type=float,
        default=0.10,
        help="leveled off: a round reads at least (1 - this) times the disk KiB per request of the round "
        "3 rounds before",
    )
    p.add_argument(
        "--c1-requests",
        type=int,
        default=2000,
        help="requests of the c1 phase (their p99 is the 20th slowest; of 300 it was the 3rd, a few seconds of the disk)",
    )
    p.add_argument("--c8-requests", type=int, default=4000)
    p.add_argument("--seconds", type=float, default=30.0, help="most seconds of each measured phase")
    p.add_argument(
        "--swap-warm-s",
        type=float,
        default=20.0,
        help="traffic before the steady phase, not measured: v1's working set into the page cache",
    )
    p.add_argument("--swap-steady-s", type=float, default=20.0, help="the steady phase: at least this long...")
    p.add_argument(
        "--swap-steady-requests",
        type=int,
        default=2000,
        help="...and until this many requests were sent in it (a p99 of enough requests)",
    )
    p.add_argument("--swap-steady-max-s", type=float, default=120.0, help="...but at most this long")
    p.add_argument("--swap-after-s", type=float, default=15.0)
    p.add_argument("--swap-bodies", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--disk-probe-s",
        type=float,
        default=10.0,
        help="seconds of direct random reads of the version's files before each cell (and the swap, "
        "before and after), split between queue depths 1 and 8: the disk's latency in the same run "
        "(offgraph/store/device_probe.py; 0: off)",
    )
    p.add_argument("--repeats-at", type=count, default=10**9, help="run the workers-1 Zipf cell of this size ...")
    p.add_argument("--repeats", type=int, default=3, help="... this many times, each on a fresh server")
    p.add_argument(
        "--plan-max-s",
        type=float,
        default=20.0,
        help="seconds of `offgraph plan`'s hit-ratio simulation for each cell (its first run; 0: none)",
    )
    p.add_argument(
        "--baseline-repo",
        default=None,
        help="a checkout of the old code (e.g. `git archive OLD | tar -x -C DIR`): its `offgraph serve` "
        "(started in DIR, so DIR's code runs, with this venv) measures the --baseline-sizes cells "
        "too, alternated with the new code on fresh servers",
    )
    p.add_argument("--baseline-sizes", default="1e7,1e8")
    p.add_argument(
        "--baseline-popularities",
        default="zipf",
        help="the baseline cells' popularities (the others run once, new code only)",
    )
    p.add_argument("--baseline-runs", type=int, default=2, help="runs of each code per baseline cell (old first)")
    p.add_argument(
        "--baseline-serve-args",
        default="",
        help="the flags of the old code's servers (--serve-args are the new code's: the old one may not know them)",
    )
    p.add_argument(
        "--settle-p999-ms",
        type=float,
        default=20.0,
        help="after writing a version, wait until the disk's cold reads have a p99.9 of at most this "
        "(bench/disk_probe.py: this VM's disk reads slowly for minutes after GBs of writes)",
    )
    p.add_argument("--settle-max-s", type=float, default=900.0, help="wait at most this long for it (0: no wait)")
    p.add_argument(
        "--serve-args",
        default="",
        help="more flags for every `offgraph serve`, e.g. "
        "'--cache-mb 128 --warmup-rows 300000' (default: none, the "
        "defaults are what is measured)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the figures of OUT/scale.json and measure only what it lacks (a run cut short, "
        "or sizes run one at a time)",
    )
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
    baseline = Path(args.baseline_repo).resolve() if args.baseline_repo else None
    if baseline:
        cli_module(baseline)  # a checkout with neither layout's entry point ends the run here
    baseline_sizes = {count(x) for x in args.baseline_sizes.split(",") if x.strip()} if baseline else set()
    # absolute: the old code's servers run in their own directory
    work, out = Path(args.workdir).resolve(), Path(args.out).resolve()
    logs = out / "logs"
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    present = frozenset(n for n in sizes if (work / f"m{n}" / MODEL / "1" / "manifest.json").exists())
    need = disk_plan(sizes, swap_size, args.keep, args.delete_from, present) + int(
        DISK_MARGIN
        * sum(
            SynthConfig(rows=n).disk_bytes()
            for n in baseline_sizes
            if not (work / f"m{n}-old" / MODEL / "1" / "manifest.json").exists()
        )
    )  # the old code's versions
    free = shutil.disk_usage(work).free
    _log(
        f"sizes {[f'{n:.0e}' for n in sizes]}, swap at {swap_size or 'none'}: needs about {need / 1e9:.1f} GB of "
        f"disk under {work} at the peak ({free / 1e9:.1f} GB free)"
    )
    if need > free:
        raise SystemExit(f"not enough disk under {work}: need about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")

    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "mem_total_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
        },
        "args": vars(args),
        "synth": {},
        "runs": [],
        "swap": None,
    }
    json_path = out / "scale.json"
    if args.resume and json_path.exists():
        old = json.loads(json_path.read_text())
        report.update({k: old[k] for k in ("synth", "runs", "swap") if old.get(k)})
        _log(f"resuming {json_path}: {len(report['runs'])} runs{', the swap' if report['swap'] else ''} kept")
    done = {_cell_key(r) for r in report["runs"]}
    sweep = sorted(set(sizes) | ({swap_size} if swap_size else set()))
    for n in sweep:
        todo = [c for c in plan_cells(n, workers, pops, args, baseline_sizes) if n in sizes and c[:5] not in done]
        swap_todo = n == swap_size and not (report["swap"] and report["swap"]["rows"] == n)
        if not todo and not swap_todo:
            continue
        models = work / f"m{n}"
        m = synth(models / MODEL / "1", n, args.seed, logs / f"synth-{n}.log")
        rows, secs = m.store.total_rows, m.export_seconds
        report["synth"][str(n)] = {
            "rows": rows,
            "store_seconds": secs.store,
            "total_seconds": secs.total,
            "store_rows_per_s": rows / secs.store,
            # the whole version: store, dense head, manifest (bounded checksums)
            "rows_per_s": rows / secs.total,
            "bytes_on_disk": m.store.bytes_on_disk,
            "disk_bytes_per_row": m.store.bytes_on_disk / rows,
            "settle": _settle(models / MODEL / "1", args),
        }
        old_models = work / f"m{n}-old"  # the old code's own version of the same rows and seed
        if any(c[3] == "baseline" for c in todo):
            synth(old_models / MODEL / "1", n, args.seed, logs / f"synth-{n}-old.log", code=baseline)
        for _rows, w, pop, which, k in todo:
            if which == "baseline":
                r = measure(
                    old_models, w, pop, n, args, logs, repeat=k, code=baseline, serve_args=args.baseline_serve_args
                )
            else:
                r = measure(models, w, pop, n, args, logs, repeat=k)
            r["disk_bytes_per_row"] = report["synth"][str(n)]["disk_bytes_per_row"]
            report["runs"].append(r)
            json_path.write_text(json.dumps(report, indent=1))  # partial results survive a crash (--resume)
        if swap_todo:
            report["swap"] = swap_experiment(models, n, args, logs)
        if not args.keep and n >= args.delete_from:
            _log(f"deleting {models}")
            shutil.rmtree(models, ignore_errors=True)
            shutil.rmtree(old_models, ignore_errors=True)
        json_path.write_text(json.dumps(report, indent=1))
    report["acceptance"] = acceptance(report)
    json_path.write_text(json.dumps(report, indent=1))
    plot(report, out)
    (out / "scale.md").write_text(markdown(report))
    for k, v in report["acceptance"].items():
        _log(
            f"{'OK  ' if v['ok'] else 'FAIL'} {k}: {_num(v['value'], '.3g')} (limit {v.get('op', '<=')} {v['limit']:g})"
        )
    _log(f"wrote {json_path} and the PNGs next to it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

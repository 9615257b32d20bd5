"""Tables beyond RAM: serve synthetic models of 10^6 .. 10^9 rows and swap big versions under load.

For every size (``--sizes``, total rows): write (or reuse) a synthetic int8 D=16 version with
``offgraph synth`` (a subprocess: its progress bar shows), then for ``--workers`` 1 and 2 and for Zipf
(exponent 1.1) and uniform row popularity (``bench.lib.traffic``), start a fresh ``offgraph serve``
with the default cache sizes and measure:

* start-to-ready (process start to ``/readyz`` 200);
* total PSS of the server's processes (``bench.lib.proc``) after a warm-up, and the peak under load;
* p50/p99 at concurrency 1, then throughput (and p50/p99) at concurrency 8, N = ``--candidates`` (200),
  every body distinct (no request repeats, so the uniform case cannot hit its caches by repetition);
* row-cache and block-cache hit ratios of the measured requests (``/metrics`` counters);
* disk bytes per row (the version's store).

At ``--swap-size`` (2x10^8) it also runs the swap (``bench.lib.swap``): v1 under concurrency 8, v2
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

from bench.lib.client import run_cell
from bench.lib.disk import describe, settle
from bench.lib.scale_predict import PROBE_DEPTHS, perfect_lfu, plan_for, predicted_read, reads_per_request
from bench.lib.scale_report import acceptance, fraction, load_text, markdown, num, per_bin, plan_cell, plot, warm_text
from bench.lib.server import BenchServer, build_extensions, cli_module, find_key, hit_ratios
from bench.lib.swap import run_swap, summarize
from bench.lib.traffic import POPULARITIES, build_requests
from bench.lib.traffic import bodies as to_bodies
from bench.lib.warmup import kib_per_request, warm_until_steady
from offgraph.cli.synth import count
from offgraph.export.synth_config import DISK_MARGIN, SynthConfig
from offgraph.modeldir.manifest_model import Manifest
from offgraph.store.config import DEFAULT_READ_THREADS  # the store's, where the server does not report its own
from offgraph.store.device_probe import DirectIOUnsupported, describe_profile, device_profile
from offgraph.store.prefetch import store_files

REPO = Path(__file__).resolve().parent.parent
MODEL = "scale"


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
    server = BenchServer(
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
        f"{rows:.0e} rows w{workers} {popularity:7s} {which} {repeat}: ready {ready_s:5.1f}s (version {load_text(row)}s)  "
        f"warm-up {warm_text(row)} ({warmup['stopped']}, {len(warmup['rounds'])} rounds, first round c8 p99 "
        f"{warmup['rounds'][0]['p99_ms']:.0f} ms)  "
        f"PSS warm {row['pss_after_warmup_mb']:6.0f} "
        f"load {row['pss_under_load_mb']:6.0f} MB  c1 p50 {c1['p50_ms']:6.1f} p99 {c1['p99_ms']:6.1f} ms  "
        f"c8 {c8['rps']:5.0f} req/s p99 {c8['p99_ms']:6.1f} ms  row-cache {ratios['row_cache_hit_ratio'] or 0:.3f} "
        f"(perfect LFU {num(row.get('perfect_lfu_hit_ratio'), '.3f')}; plan {plan_cell(row.get('plan'))}) "
        f"block-cache {ratios['block_cache_hit_ratio'] or 0:.3f}; misses/request c1 {num(c1['misses_per_request'], '.1f')}, "
        f"predicted read {num((c1['prediction'] or {}).get('read_ms_c1'), '.2f')} ms, measured "
        f"{num(c1['read_ms_per_request'], '.2f')} ms; from disk c1 {row['c1_disk_kib_per_request']:.0f} "
        f"c8 {row['c8_disk_kib_per_request']:.0f} KiB/request; {_describe(device)}"
    )
    return row


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


def _settle(version: Path, args) -> dict | None:
    """After writing ``version``, wait until the disk's cold reads are back to normal
    (``bench.lib.disk.settle``: p99.9 <= ``--settle-p999-ms``, at most ``--settle-max-s``)."""
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
    server = BenchServer(models, 1, logs / f"serve-{rows}-swap.log", args.serve_args.split())
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
        f"bins over 2x: {fraction(out, 'steady')} steady, {fraction(out, 'after_v2_appears')} after); first 100 on v2 p99 {out['first_100_on_v2_p99_ms']:.1f} ms; "
        f"PSS peak {out['pss_peak_mb']:.0f} MB; v2 serving {out['v2_appears_to_serving_s']:.1f}s after it appeared, "
        f"v1 {out['rollback_to_v1_serving_s']:.1f}s after the rollback; before: {_describe(disk_before)}; after: "
        f"{_describe(out['disk_probe_after'])}; per bin, major faults / page-cache refaults: "
        f"{per_bin(out['faults_in_bins_over_2x'])} in bins over 2x, "
        f"{per_bin(out['faults_in_other_bins_after_v2_appears'])} in the others after v2 appears"
    )
    return out


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
        "per request level off, at most this long (bench/lib/warmup.py; 0: the first round only)",
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
        "(bench/lib/disk.py: this VM's disk reads slowly for minutes after GBs of writes)",
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
        build_extensions(baseline)
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
            f"{'OK  ' if v['ok'] else 'FAIL'} {k}: {num(v['value'], '.3g')} (limit {v.get('op', '<=')} {v['limit']:g})"
        )
    _log(f"wrote {json_path} and the PNGs next to it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

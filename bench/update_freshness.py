"""Streaming-update freshness and throughput against a live server.

    python -m bench.update_freshness --model-src out/demo/models/movielens/1 --data out/demo/data/movielens.parquet
                                     [--trials 200] [--requests 200] [--push-deltas 3000000] [--out FILE.json]

    # a live stream of 230k deltas/s for 60 s; the updater on its own CPU, the
    # server and this client on the other (the client shares the server's CPU: next to the
    # updater, its own JSON work would be what slows down)
    python -m bench.update_freshness ... --rate 230000 --push-deltas 13800000 --serve-args "--cpus 0" \
        --update-args "--cpus 1 --idle-priority --poll-interval 0.3" --client-cpus 0
    # the same from a backlog (--rate 0): how fast the updater drains it
    python -m bench.update_freshness ... --rate 0 --push-deltas 6000000 ...

Copies an exported MovieLens version into a scratch MODELS/ml/1, then runs
`offgraph serve` and `offgraph update` as subprocesses (falls back to an in-process
``Scorer(store_mode="follow", row_cache_mb=64)`` when the server does not come up).

(a) freshness: ``--trials`` times, publish a one-row delta file changing the user_id
    row of a fixed request, then poll the server until that request's scores change;
    latency = publish start -> first changed answer (p50/p99; acceptance p99 <= 1 s).
(b) throughput: pre-written delta files (``--push-deltas`` rows) are renamed into the
    spool, all at once (``--rate 0``: a backlog, drained as fast as the updater can) or
    at ``--rate`` deltas/s (a live stream); deltas/s = rows consumed by the updater (its
    Prometheus counter) over the time from the first file to the last one applied.
    Meanwhile a client sends requests back to back; its p50/p99 are compared to the
    same client's over an equally long window just before, without the update load
    (acceptance: >= 200k rows/s and a p99 rise <= 25%).
(c) freshness under load: in both windows, ``--probe-every`` (0.02 s) after the previous
    probe's answer a one-row probe delta is published and the probe request (whose rows
    the load never touches) is scored between the client's requests, untimed, until it
    changes (``Probe``); acceptance: p99 <= 1 s over >= 200 probes, no timeouts.
(d) backpressure: the updater's backlog gauges (files, rows, oldest unapplied age) are
    sampled every 0.25 s while the load runs; the report gives their maxima and trace.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.lib.client import metric_value
from bench.lib.freshness import NAME, HttpScorer, open_bench_model, outside
from bench.lib.server import start_appending, stop_process
from bench.lib.stats import percentiles_ms
from offgraph.testing.harness import NotReady, free_port, wait_ready


class LocalScorer:
    def __init__(self, version_dir: Path):
        import offgraph

        self.scorer = offgraph.load(version_dir, store_mode="follow", row_cache_mb=64)

    def score(self, request, candidates) -> list[float]:
        return self.scorer.score(request, candidates).tolist()

    def stats(self) -> dict:
        return self.scorer.stats()


# ------------------------------------------------------------------------------ phases
def publish_row(spool: Path, version: int, tid: int, row: int, dim: int, seq: int, rng) -> None:
    """A one-row delta file with a random new vector for ``(tid, row)``."""
    from offgraph.streaming.deltas import publish_delta

    publish_delta(
        spool,
        model=NAME,
        model_version=version,
        table_ids=[tid],
        rows=[row],
        vectors=(rng.standard_normal((1, dim)) * 0.3).astype(np.float32),
        first_order=rng.standard_normal(1).astype(np.float32) * 0.1,
        seqs=[seq],
        event_time_ms=int(time.time() * 1000),
    )


def freshness(scorer, spool: Path, probe_row, request, cands, trials: int, version: int, dim: int, seq0: int) -> dict:
    tid, row = probe_row
    rng = np.random.default_rng(1)
    prev = scorer.score(request, cands)
    lat, timeouts = [], 0
    for i in range(trials):
        t0 = time.perf_counter()
        publish_row(spool, version, tid, row, dim, seq0 + i, rng)
        while True:
            s = scorer.score(request, cands)
            dt = time.perf_counter() - t0
            if s != prev or dt > 10.0:
                break
        timeouts += s == prev
        prev = s
        lat.append(dt)
    return {"table_id": tid, "row": row, "timeouts_10s": int(timeouts), **percentiles_ms(lat), "latencies_s": lat}


def write_load_files(
    stage: Path,
    total: int,
    per_file: int,
    table_rows: np.ndarray,
    version: int,
    dim: int,
    seq0: int,
    exclude: dict[int, np.ndarray],
) -> int:
    """Load delta files of uniformly drawn rows, none of them in ``exclude`` (table id -> rows: the probe
    request's rows, so that its scores change only when a probe delta lands)."""
    from offgraph.streaming.deltas import spool_file_name, write_delta_file

    rng = np.random.default_rng(2)
    p_table = table_rows / table_rows.sum()  # uniform over all rows of all tables
    stage.mkdir(parents=True, exist_ok=True)
    n, seq = 0, seq0
    while n < total:
        k = min(per_file, total - n)
        t = rng.choice(len(table_rows), k, p=p_table).astype(np.uint32)
        r = (rng.random(k) * table_rows[t]).astype(np.int64)
        keep = outside(t, r, exclude)
        t, r, k = t[keep], r[keep], int(keep.sum())
        write_delta_file(
            stage / spool_file_name(),
            model=NAME,
            model_version=version,
            table_ids=t,
            rows=r,
            vectors=(rng.standard_normal((k, dim)) * 0.05).astype(np.float32),
            first_order=(rng.standard_normal(k) * 0.01).astype(np.float32),
            seqs=np.arange(seq, seq + k),
            event_time_ms=int(time.time() * 1000),
            fsync=False,
        )
        n, seq = n + k, seq + k
    return n


class Probe:
    """Freshness measured while the client runs (the same in both windows, so that its
    requests and deltas are no difference between them): every ``every_s``, publish a
    one-row delta for the probe request's user row; then, every ``check_s`` between
    the client's timed requests, score the probe request (untimed) until its scores
    change. Latency = publish start -> first changed answer."""

    def __init__(
        self,
        scorer,
        spool: Path,
        probe_row: tuple[int, int],
        request,
        cands,
        version: int,
        dim: int,
        seq0: int,
        every_s: float = 0.5,
        check_s: float = 0.01,
    ):
        self.scorer, self.spool, self.request, self.cands = scorer, spool, request, cands
        self.tid, self.row = probe_row
        self.version, self.dim, self.seq = version, dim, seq0
        self.every_s, self.check_s = every_s, check_s
        self.rng = np.random.default_rng(3)
        self.prev = scorer.score(request, cands)
        self.pending: float | None = None
        self.next_t = time.perf_counter() + every_s
        self.last_check = 0.0
        self.lat: list[float] = []
        self.timeouts = 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.pending is None:
            if now >= self.next_t:
                self.pending = now
                publish_row(self.spool, self.version, self.tid, self.row, self.dim, self.seq, self.rng)
                self.seq += 1
            return
        if now - self.last_check < self.check_s:
            return
        self.last_check = now
        s = self.scorer.score(self.request, self.cands)
        done = time.perf_counter()
        if s != self.prev or done - self.pending > 10.0:
            if s == self.prev:
                self.timeouts += 1
            self.lat.append(done - self.pending)
            self.prev, self.pending, self.next_t = s, None, done + self.every_s

    def report(self) -> dict:
        return {
            "trials": len(self.lat),
            "timeouts_10s": self.timeouts,
            **(percentiles_ms(self.lat) if self.lat else {}),
        }


def latencies(
    scorer,
    reqs,
    stop: threading.Event | None = None,
    minimum: int = 0,
    seconds: float | None = None,
    starts: list[float] | None = None,
    probe: Probe | None = None,
) -> list[float]:
    """Score ``reqs`` in turn: once each, or until ``stop`` is set, or for ``seconds``
    (``starts``: also collect each request's start, Unix seconds; ``probe``: its
    :meth:`Probe.tick` between requests, untimed)."""
    out, i = [], 0
    t_end = None if seconds is None else time.perf_counter() + seconds
    while True:
        if stop is None and t_end is None and i >= len(reqs):
            break
        if stop is not None and stop.is_set() and i >= minimum:
            break
        if t_end is not None and time.perf_counter() >= t_end:
            break
        request, cands = reqs[i % len(reqs)]
        if starts is not None:
            starts.append(time.time())
        t0 = time.perf_counter()
        scorer.score(request, cands)
        out.append(time.perf_counter() - t0)
        i += 1
        if probe is not None:
            probe.tick()
    return out


class BacklogSampler(threading.Thread):
    """Reads the updater's backlog gauges every ``every_s`` (files, rows, oldest unapplied age)."""

    GAUGES = {
        "files": "offgraph_update_files_waiting",
        "rows": "offgraph_update_backlog_rows",
        "oldest_s": "offgraph_update_oldest_unapplied_seconds",
    }

    def __init__(self, port: int, every_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.port, self.every_s = port, every_s
        self.done = threading.Event()
        self.trace: dict[str, list[float]] = {"t": [], **{k: [] for k in self.GAUGES}}

    def run(self) -> None:
        t0 = time.perf_counter()
        while not self.done.wait(self.every_s):
            try:
                vals = {k: metric_value(self.port, name) for k, name in self.GAUGES.items()}
            except OSError:
                continue
            self.trace["t"].append(round(time.perf_counter() - t0, 3))
            for k, v in vals.items():
                self.trace[k].append(v)

    def report(self) -> dict:
        return {"max_" + k: max(self.trace[k], default=0.0) for k in self.GAUGES} | {"trace": self.trace}


def throughput(
    scorer,
    spool: Path,
    stage: Path,
    reqs,
    metrics_port: int,
    total: int,
    file_rows: int,
    rate: float,
    baseline_s: float,
    probes: tuple[Probe, Probe],
) -> dict:
    latencies(scorer, reqs)  # warm up: every request once
    window = total / rate if rate > 0 else baseline_s
    base = latencies(scorer, reqs, seconds=window, probe=probes[0])
    c0 = metric_value(metrics_port, "offgraph_update_deltas_total")
    files = sorted(stage.iterdir())
    done = threading.Event()
    under_load: list[float] = []
    starts: list[float] = []
    client = threading.Thread(
        target=lambda: under_load.extend(latencies(scorer, reqs, done, starts=starts, probe=probes[1])), daemon=True
    )
    sampler = BacklogSampler(metrics_port)
    t0 = time.perf_counter()
    client.start()
    sampler.start()
    sent = 0
    for f in files:  # renames: the producer costs nothing inside the window
        if rate > 0:  # a live stream: each file when its rows are due
            time.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
            sent += file_rows
        os.utime(f)  # as if written now, when it is published (the backlog's age is by mtime)
        os.replace(f, spool / f.name)
    t_push = time.perf_counter() - t0
    consumed = 0.0
    t_end = time.monotonic() + 600
    while time.monotonic() < t_end:
        consumed = metric_value(metrics_port, "offgraph_update_deltas_total") - c0
        if consumed >= total:
            break
        time.sleep(0.02)
    t_drain = time.perf_counter() - t0
    done.set()
    client.join()
    sampler.done.set()
    sampler.join()
    rows_written = metric_value(metrics_port, "offgraph_update_rows_applied_total")
    b, l_ = percentiles_ms(base), percentiles_ms(under_load)
    return {
        "deltas": int(consumed),
        "files": len(files),
        "offered_rate": rate or None,
        "window_seconds": window,
        "push_seconds": t_push,
        "drain_seconds": t_drain,
        "deltas_per_s": consumed / t_drain,
        "rows_written_total": rows_written,
        "latency_no_load": b,
        "latency_under_load": l_,
        "p99_rise": l_["p99_ms"] / b["p99_ms"] - 1.0,
        "p50_rise": l_["p50_ms"] / b["p50_ms"] - 1.0,
        "freshness_no_load": probes[0].report(),
        "freshness_under_load": probes[1].report(),
        "backlog": sampler.report(),
        "under_load_trace": {"start_unix": starts, "ms": [round(x * 1e3, 3) for x in under_load]},
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 3.6))
    lat = np.asarray(report["freshness"]["latencies_s"]) * 1000
    ax[0].hist(lat, bins=40)
    ax[0].axvline(report["freshness"]["p99_ms"], color="r", ls="--", label="p99")
    ax[0].set(title="delta published -> score changed", xlabel="ms", ylabel="trials")
    ax[0].legend()
    tp = report["throughput"]
    names = ["no load p50", "no load p99", "load p50", "load p99"]
    vals = [
        tp["latency_no_load"]["p50_ms"],
        tp["latency_no_load"]["p99_ms"],
        tp["latency_under_load"]["p50_ms"],
        tp["latency_under_load"]["p99_ms"],
    ]
    ax[1].bar(names, vals, color=["C0", "C0", "C1", "C1"])
    ax[1].set(title=f"score latency, {tp['deltas_per_s']:,.0f} deltas/s applied", ylabel="ms")
    tr = tp["backlog"]["trace"]
    ax[2].plot(tr["t"], tr["rows"], label="backlog rows")
    ax[2].set(title="updater backlog while the load runs", xlabel="s", ylabel="rows")
    fu = tp["freshness_under_load"]
    if fu.get("trials"):
        ax[2].set_title(f"backlog; freshness under load p50 {fu['p50_ms']:.0f} / p99 {fu['p99_ms']:.0f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# ------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model-src",
        required=True,
        help="an exported MovieLens version directory (e.g. out/demo/models/movielens/1 after make demo)",
    )
    ap.add_argument("--data", required=True, help="the MovieLens parquet (e.g. out/demo/data/movielens.parquet)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--fresh-candidates", type=int, default=20)
    ap.add_argument("--push-deltas", type=int, default=3_000_000)
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="deltas/s offered to the spool (a live stream); 0: all files at once (a backlog)",
    )
    ap.add_argument(
        "--baseline-seconds",
        type=float,
        default=15.0,
        help="length of the no-load latency window with --rate 0 (with a rate: push-deltas / rate)",
    )
    ap.add_argument("--file-rows", type=int, default=20_000)
    ap.add_argument(
        "--probe-every",
        type=float,
        default=0.02,
        help="seconds between one probe's answer and the next probe (freshness while the load runs)",
    )
    ap.add_argument(
        "--batch-files", type=int, default=None, help="the updater's --batch-files (default: the updater's own default)"
    )
    ap.add_argument("--cache-mb", type=float, default=64.0)
    ap.add_argument("--update-args", default="", help="extra `offgraph update` flags, e.g. '--nice 10'")
    ap.add_argument("--serve-args", default="", help="extra `offgraph serve` flags, e.g. '--follow-seconds 1'")
    ap.add_argument(
        "--client-cpus",
        default=None,
        metavar="LIST",
        help="pin this process (the load client) to these CPUs, e.g. '1' next to "
        "--serve-args '--cpus 0' (a client on another machine, as in production)",
    )
    ap.add_argument("--in-process", action="store_true", help="skip `offgraph serve`; use the in-process scorer")
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--out", default="update_freshness.json")
    ap.add_argument("--png", default=None, help="also plot here (default: OUT with .png)")
    args = ap.parse_args(argv)

    from offgraph.runtime import pin_cpus

    src = Path(args.model_src)
    bm = open_bench_model(src, Path(args.data), args.requests, args.candidates, args.fresh_candidates)
    dim = bm.dim
    work = Path(args.work or tempfile.mkdtemp(prefix="og-fresh-"))
    models, spool, stage = work / "models", work / "spool", work / "stage"
    vdir = models / NAME / "1"
    shutil.rmtree(work / "models", ignore_errors=True)
    shutil.copytree(src, vdir, ignore=shutil.ignore_patterns("manifest.json"))
    shutil.copy(src / "manifest.json", vdir / "manifest.json")
    spool.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    py = [sys.executable, "-m", "offgraph.cli"]
    server = updater = None
    report: dict = {
        "model_src": str(src),
        "quant": bm.quant,
        "shards": bm.shards,
        "cpus": os.cpu_count(),
        "trials": args.trials,
        "requests": args.requests,
        "candidates": args.candidates,
        "client_cpus": args.client_cpus,
        "rate": args.rate,
    }
    try:
        mport = free_port()
        updater = start_appending(
            py
            + [
                "update",
                "--models",
                str(models),
                "--model",
                NAME,
                "--source",
                f"spool:{spool}",
                "--metrics-port",
                str(mport),
                "--delete-applied",
                "--log-every",
                "2",
                *([] if args.batch_files is None else ["--batch-files", str(args.batch_files)]),
                *args.update_args.split(),
            ],
            work / "update.log",
            env,
        )
        report["update_args"] = args.update_args
        scorer, report["target"] = None, "in-process Scorer(store_mode='follow', row_cache_mb=64) (fallback)"
        if not args.in_process:
            port = free_port()
            server = start_appending(
                py
                + [
                    "serve",
                    "--models",
                    str(models),
                    "--port",
                    str(port),
                    "--cache-mb",
                    str(args.cache_mb),
                    "--log-level",
                    "warning",
                    *args.serve_args.split(),
                ],
                work / "serve.log",
                env,
            )
            report["serve_args"] = args.serve_args
            try:
                wait_ready(f"http://127.0.0.1:{port}", 240, server)
                scorer, report["target"] = HttpScorer(port), f"offgraph serve --cache-mb {args.cache_mb:g}"
            except NotReady as e:
                print(f"offgraph serve did not become ready ({e}): falling back to the in-process scorer", flush=True)
                stop_process(server)
                server = None
        if scorer is None:
            scorer = LocalScorer(vdir)
        wait_ready(f"http://127.0.0.1:{mport}", 120, updater, path="/metrics", log=str(work / "update.log"))
        pin_cpus(args.client_cpus)  # now: the server and the updater were started with all CPUs
        reqs = bm.requests
        print(f"target: {report['target']}; freshness: {args.trials} trials", flush=True)
        f_req, f_cands = bm.probe
        report["store_stats_before"] = scorer.stats()
        report["freshness"] = freshness(scorer, spool, bm.probe_row, f_req, f_cands, args.trials, 1, dim, 10**12)
        fr = report["freshness"]
        report["store_stats_after_freshness"] = scorer.stats()
        print(
            f"freshness: p50 {fr['p50_ms']:.0f} ms, p99 {fr['p99_ms']:.0f} ms, max {fr['max_ms']:.0f} ms, "
            f"{fr['timeouts_10s']} timeouts",
            flush=True,
        )
        n = write_load_files(stage, args.push_deltas, args.file_rows, bm.table_rows, 1, dim, 2 * 10**12, bm.probe_rows)
        probes = tuple(
            Probe(scorer, spool, bm.probe_row, f_req, f_cands, 1, dim, 10**12 + k * 10**6, every_s=args.probe_every)
            for k in (1, 2)
        )
        report["throughput"] = throughput(
            scorer, spool, stage, reqs, mport, n, args.file_rows, args.rate, args.baseline_seconds, probes
        )
        tp = report["throughput"]
        report["store_stats_after_load"] = scorer.stats()
        print(
            f"throughput: {tp['deltas']:,} deltas in {tp['drain_seconds']:.1f}s = {tp['deltas_per_s']:,.0f}/s; "
            f"score p50/p99 {tp['latency_no_load']['p50_ms']:.1f}/{tp['latency_no_load']['p99_ms']:.1f} ms "
            f"without load, {tp['latency_under_load']['p50_ms']:.1f}/{tp['latency_under_load']['p99_ms']:.1f} "
            f"ms under load ({tp['latency_under_load']['n']} requests): p99 {tp['p99_rise']:+.0%}",
            flush=True,
        )
        fu = tp["freshness_under_load"]
        if fu.get("trials"):
            print(
                f"freshness under load: p50 {fu['p50_ms']:.0f} ms, p99 {fu['p99_ms']:.0f} ms, max "
                f"{fu['max_ms']:.0f} ms over {fu['trials']} probes, {fu['timeouts_10s']} timeouts",
                flush=True,
            )
        bl = tp["backlog"]
        print(
            f"backlog at most {bl['max_files']:.0f} files, {bl['max_rows']:,.0f} rows, oldest waited "
            f"{bl['max_oldest_s']:.2f} s",
            flush=True,
        )
        live = args.rate > 0
        report["acceptance"] = {  # the acceptance lines this run measures
            "no_load_freshness_p99_le_50ms": fr["p99_ms"] <= 50.0,
            "p99_rise_le_25pct": tp["p99_rise"] <= 0.25,
            **(
                {
                    "under_load_freshness_p99_le_1s": fu.get("p99_ms", math.inf) <= 1000.0,
                    "under_load_probes_ge_200": fu.get("trials", 0) >= 200,
                    "under_load_no_timeouts": fu.get("timeouts_10s", 1) == 0,
                }
                if live
                else {"backlog_deltas_per_s_ge_400k": tp["deltas_per_s"] >= 400_000}
            ),
        }
        print("acceptance:", report["acceptance"], flush=True)
    finally:
        stop_process(updater)
        stop_process(server)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    try:
        plot(report, Path(args.png or str(Path(args.out).with_suffix(".png"))))
    except Exception as e:  # the PNG is a convenience
        print(f"no plot: {e}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""HTTP serving latency: ``offgraph serve`` (embeddings out of the graph) vs an in-graph baseline.

Both servers run as subprocesses on free loopback ports, with the same uvicorn settings
(uvloop, httptools), the same number of worker processes (``--workers``, default one per
core, sharing the port with SO_REUSEPORT), the same TF threads and scoring-pool size:

* offgraph: ``offgraph serve`` over the exported versions (default models ``sint8`` and ``sfp32``,
  linked into a private MODELS directory);
* in-graph: ``bench.ingraph_baseline``: the run's full Keras model as ONE SavedModel on padded ids
  + masks, fed by the same FG, behind the same kind of FastAPI endpoint.

Requests are real MovieLens requests: rows grouped by ``request_id``, the request = the group's
user features, N candidates = N distinct real movies' item features. For every N and
concurrency, the servers are measured in turn (interleaved, so that a change in the machine's
load hits both) with a keep-alive raw asyncio HTTP/1.1 client (one connection per concurrent
stream, bodies serialized beforehand), a bounded number of requests and seconds per cell.
Prints a table, checks the acceptance floors, writes ``DIR/serve_latency.json`` and
``DIR/serve_latency.png``.

    python -m bench.serve_latency --run RUN --models MODELS --data movielens.parquet --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from offgraph.testing.harness import free_port, wait_ready

REPO = Path(__file__).resolve().parent.parent
REQUEST_INPUTS = ["user_id", "age", "gender", "occupation", "zip_prefix"]
ITEM_INPUTS = ["movie_id", "genres", "title_words", "release_year"]
FLOORS = {"p50_ms": 6.0, "p99_ms": 12.0, "ratio": 1.3, "rps": 250.0}  # N=200: c=1 p50/p99/ratio, c=8 rps


# -- requests ---------------------------------------------------------------------------------------
def build_bodies(data: Path, sizes: list[int], per_size: int, seed: int) -> dict[int, list[bytes]]:
    """Serialized score bodies per N: real requests (grouped by request_id) x N real movies."""
    import pyarrow.parquet as pq

    cols = pq.read_table(data, columns=REQUEST_INPUTS + ITEM_INPUTS + ["request_id"]).to_pydict()
    first: dict[str, int] = {}
    items: dict[int, dict] = {}
    for i, (rid, mid) in enumerate(zip(cols["request_id"], cols["movie_id"])):
        first.setdefault(rid, i)
        if mid not in items:
            items[mid] = {c: cols[c][i] for c in ITEM_INPUTS}
    movies = list(items.values())
    if max(sizes) > len(movies):
        raise ValueError(f"N={max(sizes)} is more than the {len(movies)} distinct movies in {data}")
    rng = np.random.default_rng(seed)
    groups = list(first.values())
    out = {}
    for n in sizes:
        bodies = []
        for g in rng.choice(len(groups), per_size, replace=False):
            req = {c: cols[c][groups[g]] for c in REQUEST_INPUTS}
            cands = [movies[j] for j in rng.choice(len(movies), n, replace=False)]
            bodies.append(json.dumps({"request": req, "candidates": cands}, separators=(",", ":")).encode())
        out[n] = bodies
    return out


# -- a minimal keep-alive HTTP/1.1 client ----------------------------------------------------------------
class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.r, self.w, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        r, w = await asyncio.open_connection(host, port)
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(r, w, host)

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        self.w.write(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), self.host.encode(), len(body), extra)
            + body
        )
        head = await self.r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = None
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length is None:
            raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
        return status, await self.r.readexactly(length)

    def close(self) -> None:
        self.w.close()


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live descendants (a server's workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
            except OSError:  # gone meanwhile
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        todo += children.get(p, [])
    return total / os.sysconf("SC_CLK_TCK")


async def run_cell(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    warmup: int,
    check_n: int,
    pid: int,
) -> dict:
    conns = [await Conn.open(host, port) for _ in range(concurrency)]
    try:
        for i in range(warmup):  # warm: connections, item caches, row caches, TF
            status, payload = await conns[i % concurrency].post(path, bodies[i % len(bodies)])
            if status != 200:
                raise RuntimeError(f"warm-up request to {path} failed: {status} {payload[:300]!r}")
        scores = json.loads(payload)["scores"]
        if len(scores) != check_n:
            raise RuntimeError(f"{path}: {len(scores)} scores for {check_n} candidates")
        lat: list[float] = []
        errors: dict[int, int] = {}
        issued = 0
        deadline = time.perf_counter() + max_seconds

        async def stream(conn: Conn, k: int):
            nonlocal issued
            j = k
            while issued < max_requests and time.perf_counter() < deadline:
                issued += 1
                body = bodies[j % len(bodies)]
                j += concurrency
                t0 = time.perf_counter()
                status, _ = await conn.post(path, body)
                lat.append(time.perf_counter() - t0)
                if status != 200:
                    errors[status] = errors.get(status, 0) + 1

        cpu0, own0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(stream(c, k) for k, c in enumerate(conns)))
        wall, cpu, own = time.perf_counter() - t0, cpu_seconds(pid) - cpu0, time.process_time() - own0
    finally:
        for c in conns:
            c.close()
    a = np.asarray(lat) * 1e3
    return {
        "requests": len(lat),
        "seconds": wall,
        "rps": len(lat) / wall,
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "max_ms": float(a.max()),
        "errors": errors,
        "server_cpu_ms_per_request": cpu / len(lat) * 1e3,
        "server_cpu_utilization": cpu / wall,
        "client_cpu_ms_per_request": own / len(lat) * 1e3,
        "loadavg_1m": os.getloadavg()[0],
    }


async def fetch_scores(host: str, port: int, path: str, body: bytes) -> np.ndarray:
    c = await Conn.open(host, port)
    try:
        status, payload = await c.post(path, body)
    finally:
        c.close()
    if status != 200:
        raise RuntimeError(f"{path}: {status} {payload[:300]!r}")
    return np.asarray(json.loads(payload)["scores"], np.float32)


# -- servers ---------------------------------------------------------------------------------------------
class Proc:
    def __init__(self, name: str, cmd: list[str], port: int, log_path: Path, cwd: Path = REPO):
        """``cwd``: where ``cmd`` runs; ``python -m offgraph.cli`` imports the code found there first (the
        editable install's finder comes after the path), so another checkout's directory runs its code."""
        self.name, self.port = name, port
        self.log_path = log_path
        self._log = open(log_path, "w")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("OFFGRAPH_ADMIN_TOKEN", None)
        self.p = subprocess.Popen(cmd, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float) -> None:
        wait_ready(f"http://127.0.0.1:{self.port}", timeout, self.p, log=str(self.log_path))

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._log.close()


# -- in-process breakdown of the library scorer ------------------------------------------------------------
def library_breakdown(model_dir: Path, body: bytes, repeats: int, row_cache_mb: float, intra: int, inter: int) -> dict:
    """Phases of Scorer.score in this process for one request (median ms): where the time goes."""
    from offgraph.server.tf_threads import configure_tf_threads

    configure_tf_threads(intra, inter)  # as the servers
    from offgraph.scoring import batch as scorer_impl
    from offgraph.scoring.calibration import calibrate
    from offgraph.scoring.scorer import load

    req = json.loads(body)
    request, cands = req["request"], req["candidates"]
    s = load(model_dir, row_cache_mb=row_cache_mb)
    try:
        phases: dict[str, list[float]] = {
            k: [] for k in ("fg", "keys", "store_read", "pool", "dense_tf", "calibrate", "total")
        }
        for i in range(repeats + 10):
            t = [time.perf_counter()]
            batch = s.features(request, cands)
            t.append(time.perf_counter())
            keys = scorer_impl.batch_keys(batch)
            t.append(time.perf_counter())
            vec, w, *_ = scorer_impl.read_through_cache(s.row_cache, s.store, keys.unique_tables, keys.unique_rows)
            t.append(time.perf_counter())
            emb, fo = scorer_impl.pool_batch(batch, keys, vec, w, s.poolings, s.dim)
            t.append(time.perf_counter())
            p = s.dense(emb, fo)
            t.append(time.perf_counter())
            calibrate(p, s.calibration)
            t.append(time.perf_counter())
            if i >= 10:
                for k, (a, b) in zip(list(phases)[:-1], zip(t, t[1:])):
                    phases[k].append(b - a)
                phases["total"].append(t[-1] - t[0])
        out = {k: float(np.median(v) * 1e3) for k, v in phases.items()}
        out["unique_rows"] = int(len(keys.unique_rows))
        return out
    finally:
        s.close()


# -- report -----------------------------------------------------------------------------------------------------
def plot(results: list[dict], sizes: list[int], concurrencies: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = sorted({r["server"] for r in results})
    fig, axes = plt.subplots(1, len(concurrencies) + 1, figsize=(5.5 * (len(concurrencies) + 1), 4.5))
    for ax, c in zip(axes, concurrencies):
        for s in servers:
            rows = [
                next(r for r in results if r["server"] == s and r["n"] == n and r["concurrency"] == c) for n in sizes
            ]
            (line,) = ax.plot(sizes, [r["p50_ms"] for r in rows], marker="o", label=f"{s} p50")
            ax.plot(
                sizes, [r["p99_ms"] for r in rows], marker="x", linestyle="--", color=line.get_color(), label=f"{s} p99"
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("candidates per request (N)")
        ax.set_ylabel("latency over HTTP (ms)")
        ax.set_title(f"concurrency {c}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    width = 0.8 / len(servers)
    for k, s in enumerate(servers):
        rows = [
            next(r for r in results if r["server"] == s and r["n"] == n and r["concurrency"] == max(concurrencies))
            for n in sizes
        ]
        ax.bar(np.arange(len(sizes)) + k * width, [r["rps"] for r in rows], width, label=s)
    ax.set_xticks(np.arange(len(sizes)) + width * (len(servers) - 1) / 2, [str(n) for n in sizes])
    ax.set_xlabel("candidates per request (N)")
    ax.set_ylabel("requests/s")
    ax.set_title(f"throughput, concurrency {max(concurrencies)}")
    ax.legend(fontsize=7)
    fig.suptitle("offgraph serve (embeddings out of graph) vs in-graph SavedModel, same FG + FastAPI")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="trained run directory (the in-graph baseline's model)")
    ap.add_argument("--models", required=True, help="MODELS directory holding the exported versions")
    ap.add_argument("--model-names", default="sint8,sfp32", help="models of MODELS to serve and measure")
    ap.add_argument("--data", required=True, help="MovieLens parquet (offgraph data movielens-100k)")
    ap.add_argument("--out", required=True, help="output directory (JSON, PNG, server logs)")
    ap.add_argument("--sizes", default="1,50,200,1000")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=400, help="most measured requests per cell")
    ap.add_argument("--seconds", type=float, default=5.0, help="most measured seconds per cell")
    ap.add_argument("--warmup", type=int, default=40, help="warm-up requests per cell")
    ap.add_argument("--bodies", type=int, default=64, help="distinct requests per N")
    ap.add_argument("--score-threads", type=int, default=None, help="servers' scoring threads (default: theirs)")
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="server processes of each server (--workers of offgraph serve and of the baseline; default: one per core)",
    )
    ap.add_argument("--intra-threads", type=int, default=1)
    ap.add_argument("--inter-threads", type=int, default=1)
    ap.add_argument("--cache-mb", type=float, default=256.0)
    ap.add_argument(
        "--follow-seconds", type=float, default=None, help="offgraph serve --follow-seconds (default: the server's)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-breakdown", action="store_true", help="skip the in-process phase breakdown")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in args.sizes.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")]
    names = [x for x in args.model_names.split(",") if x]
    models_src = Path(args.models).resolve()
    for n in names:
        if not (models_src / n).is_dir():
            raise SystemExit(f"--models {models_src}: no model '{n}' (use --model-names)")

    print(f"building requests from {args.data} ...", flush=True)
    bodies = build_bodies(Path(args.data), sizes, args.bodies, args.seed)

    work = Path(tempfile.mkdtemp(prefix="serve-latency-"))
    (work / "models").mkdir()
    for n in names:
        os.symlink(models_src / n, work / "models" / n)
    threads = [
        "--intra-threads",
        str(args.intra_threads),
        "--inter-threads",
        str(args.inter_threads),
        "--workers",
        str(args.workers),
    ]
    if args.score_threads:
        threads += ["--score-threads", str(args.score_threads)]
    og_port, ig_port = free_port(), free_port()
    offgraph = Proc(
        "offgraph",
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "serve",
            "--models",
            str(work / "models"),
            "--port",
            str(og_port),
            "--cache-mb",
            str(args.cache_mb),
            "--log-level",
            "warning",
            *threads,
            *(["--follow-seconds", str(args.follow_seconds)] if args.follow_seconds else []),
        ],
        og_port,
        out / "offgraph_server.log",
    )
    ingraph = Proc(
        "in-graph",
        [
            sys.executable,
            "-m",
            "bench.ingraph_baseline",
            "--run",
            args.run,
            "--export-dir",
            str(out / "ingraph_savedmodel"),
            "--port",
            str(ig_port),
            *threads,
        ],
        ig_port,
        out / "ingraph_server.log",
    )
    targets = [(f"offgraph:{n}", og_port, f"/v1/models/{n}:score", offgraph.p.pid) for n in names]
    targets.append(("in-graph", ig_port, "/v1/models/ingraph:score", ingraph.p.pid))
    results: list[dict] = []
    try:
        offgraph.wait_ready(180)
        ingraph.wait_ready(180)
        print(f"servers ready: offgraph :{og_port} ({', '.join(names)}), in-graph :{ig_port}", flush=True)

        async def measure():
            parity = {}
            probe = bodies[200 if 200 in bodies else sizes[0]][0]
            ref = await fetch_scores("127.0.0.1", ig_port, "/v1/models/ingraph:score", probe)
            for label, port, path, _ in targets[:-1]:
                parity[label] = float(np.abs(await fetch_scores("127.0.0.1", port, path, probe) - ref).max())
            for n in sizes:
                for c in concs:
                    for label, port, path, pid in targets:
                        r = await run_cell(
                            "127.0.0.1", port, path, bodies[n], c, args.requests, args.seconds, args.warmup, n, pid
                        )
                        r.update(server=label, n=n, concurrency=c)
                        results.append(r)
                        print(
                            f"  {label:16s} N={n:<5d} c={c}: p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                            f"{r['rps']:7.1f} req/s  server CPU {r['server_cpu_ms_per_request']:5.2f} ms/req  "
                            f"(load {r['loadavg_1m']:.1f}, {r['requests']} requests"
                            + (f", ERRORS {r['errors']}" if r["errors"] else "")
                            + ")",
                            flush=True,
                        )
            return parity

        import uvloop

        parity = uvloop.run(measure())
    finally:
        offgraph.stop()
        ingraph.stop()
        shutil.rmtree(work, ignore_errors=True)

    def cell(server, n, c):
        return next((r for r in results if r["server"] == server and r["n"] == n and r["concurrency"] == c), None)

    ratios = {}
    for label, *_ in targets[:-1]:
        ratios[label] = {}
        for n in sizes:
            for c in concs:
                a, b = cell(label, n, c), cell("in-graph", n, c)
                ratios[label][f"N={n},c={c}"] = {
                    "p50": a["p50_ms"] / b["p50_ms"],
                    "p99": a["p99_ms"] / b["p99_ms"],
                    "rps": a["rps"] / b["rps"],
                }
    acceptance = {}
    if 200 in sizes:
        for label, *_ in targets[:-1]:
            c1, c8 = cell(label, 200, 1), cell(label, 200, max(concs))
            acc = {}
            if c1:
                acc["p50_ms<=6"] = {"value": c1["p50_ms"], "ok": c1["p50_ms"] <= FLOORS["p50_ms"]}
                acc["p99_ms<=12"] = {"value": c1["p99_ms"], "ok": c1["p99_ms"] <= FLOORS["p99_ms"]}
                r = ratios[label]["N=200,c=1"]["p50"]
                acc["ratio_p50_vs_ingraph<=1.3"] = {"value": r, "ok": r <= FLOORS["ratio"]}
            if c8 and max(concs) >= 8:
                acc["rps_c8>=250"] = {"value": c8["rps"], "ok": c8["rps"] >= FLOORS["rps"]}
            acceptance[label] = acc

    breakdown = None
    if not args.no_breakdown:
        breakdown = {}
        for size in sorted({200, max(sizes)} & set(sizes)):
            try:
                breakdown[f"N={size}"] = {
                    n: library_breakdown(
                        models_src / n,
                        bodies[size][0],
                        100,
                        args.cache_mb / max(1, len(names)),
                        args.intra_threads,
                        args.inter_threads,
                    )
                    for n in names
                }
            except Exception as e:  # noqa: BLE001 - the breakdown is extra information
                breakdown[f"N={size}"] = {"error": f"{type(e).__name__}: {e}"}

    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "settings": {
            "sizes": sizes,
            "concurrency": concs,
            "requests_per_cell": args.requests,
            "seconds_per_cell": args.seconds,
            "warmup": args.warmup,
            "bodies_per_n": args.bodies,
            "intra_threads": args.intra_threads,
            "inter_threads": args.inter_threads,
            "score_threads": args.score_threads,
            "workers": args.workers,
            "cache_mb": args.cache_mb,
            "models": names,
            "follow_seconds": args.follow_seconds,
            "run": str(args.run),
            "data": str(args.data),
        },
        "results": results,
        "ratio_vs_ingraph": ratios,
        "acceptance_n200": acceptance,
        "max_abs_score_diff_vs_ingraph_n200": parity,
        "library_breakdown_ms": breakdown,
    }
    (out / "serve_latency.json").write_text(json.dumps(report, indent=2))
    plot(results, sizes, concs, out / "serve_latency.png")

    print(f"\nN=200 acceptance (c=1 p50/p99 over HTTP, p50 ratio vs in-graph, c={max(concs)} throughput):")
    for label, acc in acceptance.items():
        print(
            f"  {label}: " + ", ".join(f"{k} {v['value']:.2f} {'ok' if v['ok'] else 'MISSED'}" for k, v in acc.items())
        )
    print(f"  |score offgraph - in-graph| at N=200: {parity}")
    for size, per_model in (breakdown or {}).items():
        for name, b in per_model.items():
            print(
                f"  library Scorer.score in-process, {size}, {name} (median ms): "
                + (
                    ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in b.items())
                    if isinstance(b, dict)
                    else str(b)
                )
            )
    print(f"wrote {out / 'serve_latency.json'} and {out / 'serve_latency.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""HTTP serving latency: ``offgraph serve`` (embeddings out of the graph) vs an in-graph baseline.

The servers run as subprocesses on free loopback ports, with the same uvicorn settings
(uvloop, httptools), the same number of worker processes (``--workers``, default one per
core, sharing the port with SO_REUSEPORT), the same TF threads and scoring-pool size:

* new code: ``offgraph serve`` of this checkout over the exported versions (default models ``sint8`` and ``sfp32``,
  linked into a private MODELS directory);
* in-graph: ``bench.ingraph_baseline``: the run's full Keras model as ONE SavedModel on padded ids
  + masks, fed by the same FG, behind the same kind of FastAPI endpoint;
* old code (``--baseline-repo DIR``, a ``git archive REV | tar -x -C DIR``): its ``offgraph serve``
  (``python -m offgraph_cli serve`` in the old layout) run from DIR with DIR first on PYTHONPATH, over
  the same versions.

Requests are real MovieLens requests: rows grouped by ``request_id``, the request = the group's
user features, N candidates = N distinct real movies' item features (past the catalogue: every
movie once, some twice); when the first model's spec
declares feature tables, the same N = 1000 requests are also sent ids-only to the new code (the
feature join fills them; ``bench.ids_only_latency.ids_only_bodies``). Each cell (N, concurrency) is
measured ``--alternations`` times, the servers' order rotated each time (so that a change in the
machine's load hits all of them), with a keep-alive raw asyncio HTTP/1.1 client (one connection per
concurrent stream, bodies serialized beforehand), a bounded number of requests and seconds per cell;
the server CPU per request is the servers' processes' CPU time (``/proc/PID/stat``) over a cell
divided by its requests. Then the phases of one request in process (``bench.serve_breakdown``) at
N = 1000 and the largest N, over distinct bodies. Prints the medians over alternations per server
with the ratios new / in-graph and new / old, and issue 29's acceptance lines
(``bench.serve_latency_summary``); writes ``DIR/serve_latency.json`` and ``DIR/serve_latency.png``.

    python -m bench.serve_latency --run RUN --models MODELS --data movielens.parquet --out DIR \
        [--baseline-repo OLD] [--alternations 3]
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

from bench.serve_breakdown import breakdown_lines, layout
from bench.serve_latency_summary import (
    Roles,
    acceptance,
    acceptance_lines,
    find,
    medians,
    ratios,
    rotation,
    table_lines,
)
from offgraph.testing.harness import free_port, wait_ready

REPO = Path(__file__).resolve().parent.parent
REQUEST_INPUTS = ["user_id", "age", "gender", "occupation", "zip_prefix"]
ITEM_INPUTS = ["movie_id", "genres", "title_words", "release_year"]


# -- requests ---------------------------------------------------------------------------------------
def candidate_rows(rng: np.random.Generator, movies: int, n: int) -> np.ndarray:
    """N distinct movies; past the catalogue (MovieLens-100k has fewer movies than a large N), every movie
    once and the rest drawn again, distinct among themselves: the request repeats some candidates."""
    if n <= movies:
        return rng.choice(movies, n, replace=False)
    return np.concatenate([rng.permutation(movies), candidate_rows(rng, movies, n - movies)])


def build_bodies(data: Path, sizes: list[int], per_size: int, seed: int) -> dict[int, list[bytes]]:
    """Serialized score bodies per N: real requests (grouped by request_id) x N real movies (``candidate_rows``)."""
    import pyarrow.parquet as pq

    cols = pq.read_table(data, columns=REQUEST_INPUTS + ITEM_INPUTS + ["request_id"]).to_pydict()
    first: dict[str, int] = {}
    items: dict[int, dict] = {}
    for i, (rid, mid) in enumerate(zip(cols["request_id"], cols["movie_id"])):
        first.setdefault(rid, i)
        if mid not in items:
            items[mid] = {c: cols[c][i] for c in ITEM_INPUTS}
    movies = list(items.values())
    rng = np.random.default_rng(seed)
    groups = list(first.values())
    out = {}
    for n in sizes:
        bodies = []
        for g in rng.choice(len(groups), per_size, replace=False):
            req = {c: cols[c][groups[g]] for c in REQUEST_INPUTS}
            cands = [movies[j] for j in candidate_rows(rng, len(movies), n)]
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
    def __init__(
        self, name: str, cmd: list[str], port: int, log_path: Path, cwd: Path = REPO, pythonpath: Path | None = None
    ):
        """``cwd``: where ``cmd`` runs; ``python -m offgraph.cli`` imports the code found there first (the
        editable install's finder comes after the path), so another checkout's directory runs its code;
        ``pythonpath`` puts that directory first for the processes the server starts too (its workers)."""
        self.name, self.port = name, port
        self.log_path = log_path
        self._log = open(log_path, "w")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
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


# -- report -----------------------------------------------------------------------------------------------------
def plot(results: list[dict], sizes: list[int], concurrencies: list[int], path: Path) -> None:
    """p50/p99 per N for each concurrency, and throughput at the highest: the medians over alternations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = sorted({r["server"] for r in results})
    fig, axes = plt.subplots(1, len(concurrencies) + 1, figsize=(5.5 * (len(concurrencies) + 1), 4.5))
    for ax, c in zip(axes, concurrencies):
        for s in servers:
            rows = [r for r in (find(results, s, n, c) for n in sizes) if r is not None]
            if not rows:
                continue
            xs = [r["n"] for r in rows]
            (line,) = ax.plot(xs, [r["p50_ms"] for r in rows], marker="o", label=f"{s} p50")
            ax.plot(
                xs, [r["p99_ms"] for r in rows], marker="x", linestyle="--", color=line.get_color(), label=f"{s} p99"
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
        got = [find(results, s, n, max(concurrencies)) for n in sizes]
        ax.bar(np.arange(len(sizes)) + k * width, [r["rps"] if r else 0.0 for r in got], width, label=s)
    ax.set_xticks(np.arange(len(sizes)) + width * (len(servers) - 1) / 2, [str(n) for n in sizes])
    ax.set_xlabel("candidates per request (N)")
    ax.set_ylabel("requests/s")
    ax.set_title(f"throughput, concurrency {max(concurrencies)}")
    ax.legend(fontsize=7)
    fig.suptitle("offgraph serve (new, old code) vs in-graph SavedModel, same FG + FastAPI: medians over alternations")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="trained run directory (the in-graph baseline's model)")
    ap.add_argument("--models", required=True, help="MODELS directory holding the exported versions")
    ap.add_argument("--model-names", default="sint8,sfp32", help="models of MODELS to serve and measure")
    ap.add_argument("--data", required=True, help="MovieLens parquet (offgraph data movielens-100k)")
    ap.add_argument("--out", required=True, help="output directory (JSON, PNG, server logs)")
    ap.add_argument("--sizes", default="1,50,200,1000,2000")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=400, help="most measured requests per cell")
    ap.add_argument("--seconds", type=float, default=5.0, help="most measured seconds per cell")
    ap.add_argument("--warmup", type=int, default=40, help="warm-up requests per cell")
    ap.add_argument("--bodies", type=int, default=64, help="distinct requests per N")
    ap.add_argument(
        "--baseline-repo",
        default=None,
        help="the old code (`git archive REV | tar -x -C DIR`): its `offgraph serve` is measured beside the new",
    )
    ap.add_argument(
        "--baseline-models",
        default=None,
        help="the old code's MODELS directory (default: --models): its own export of the same run, where the old "
        "code cannot read a version the new code wrote",
    )
    ap.add_argument(
        "--alternations",
        type=int,
        default=3,
        help="times each cell is measured, the servers' order rotated each time; the table gives medians",
    )
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
    ap.add_argument("--no-ids-only", action="store_true", help="skip the ids-only requests at N = 1000")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.model_names = [x for x in args.model_names.split(",") if x]
    if args.alternations < 1:
        ap.error(f"--alternations {args.alternations}: at least 1")
    if args.baseline_repo is not None:
        args.baseline_repo = Path(args.baseline_repo).resolve()
        if (
            not (args.baseline_repo / "offgraph_cli.py").exists()
            and not (args.baseline_repo / "offgraph" / "cli").exists()
        ):
            ap.error(f"--baseline-repo {args.baseline_repo}: neither offgraph_cli.py nor offgraph/cli there")
    return args


def serve_module(repo: Path) -> str:
    """The module that runs ``serve`` in a checkout: ``offgraph.cli``, or ``offgraph_cli`` in the old layout."""
    return "offgraph_cli" if layout(repo) == "old" else "offgraph.cli"


def ids_only_model(models: Path, name: str):
    """The spec of ``name``'s newest version if it declares feature tables (ids-only bodies are joined), else None."""
    from offgraph.modeldir.manifest import complete_versions
    from offgraph.modeldir.version import ModelVersion

    vdir = models / name / str(complete_versions(models / name)[-1])
    spec = ModelVersion.open(vdir, verify_dense=False).spec
    return spec if spec.tables else None


IDS_N = 1000  # ids-only requests are measured at this N


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes, concs, names = args.sizes, args.concurrency, args.model_names
    models_src = Path(args.models).resolve()
    for n in names:
        if not (models_src / n).is_dir():
            raise SystemExit(f"--models {models_src}: no model '{n}' (use --model-names)")

    print(f"building requests from {args.data} ...", flush=True)
    bodies = build_bodies(Path(args.data), sizes, args.bodies, args.seed)
    ids_bodies = None
    spec = None if args.no_ids_only or IDS_N not in sizes else ids_only_model(models_src, names[0])
    if spec is not None:
        from bench.ids_only_latency import ids_only_bodies

        ids_bodies = {IDS_N: ids_only_bodies(spec, bodies[IDS_N])}

    old_src = Path(args.baseline_models).resolve() if args.baseline_models else models_src
    for n in names if args.baseline_repo is not None else []:
        if not (old_src / n).is_dir():
            raise SystemExit(f"--baseline-models {old_src}: no model '{n}'")
    work = Path(tempfile.mkdtemp(prefix="serve-latency-"))
    for sub, src in (("models", models_src), ("old-models", old_src)):
        (work / sub).mkdir()
        for n in names:
            os.symlink(src / n, work / sub / n)
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

    def offgraph_proc(tag: str, repo: Path) -> Proc:
        port = free_port()
        models = work / ("models" if repo == REPO else "old-models")
        cmd = [sys.executable, "-m", serve_module(repo), "serve", "--models", str(models), "--port", str(port)]
        cmd += ["--cache-mb", str(args.cache_mb), "--log-level", "warning", *threads]
        cmd += ["--follow-seconds", str(args.follow_seconds)] if args.follow_seconds else []
        return Proc(tag, cmd, port, out / f"{tag}_server.log", cwd=repo, pythonpath=None if repo == REPO else repo)

    procs = [offgraph_proc("new", REPO)]
    if args.baseline_repo is not None:
        procs.append(offgraph_proc("old", args.baseline_repo))
    ig_port = free_port()
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
    procs.append(ingraph)
    targets = [
        {"label": f"{p.name}:{n}", "port": p.port, "path": f"/v1/models/{n}:score", "pid": p.p.pid, "bodies": bodies}
        for p in procs[:-1]
        for n in names
    ]
    targets.append(
        {
            "label": "in-graph",
            "port": ig_port,
            "path": "/v1/models/ingraph:score",
            "pid": ingraph.p.pid,
            "bodies": bodies,
        }
    )
    roles = Roles(
        new=f"new:{names[0]}",
        ingraph="in-graph",
        old=f"old:{names[0]}" if args.baseline_repo is not None else None,
        ids=f"new:{names[0]} ids-only" if ids_bodies else None,
    )
    if ids_bodies:
        targets.append({**targets[0], "label": roles.ids, "bodies": ids_bodies})
    cells: list[dict] = []
    try:
        for p in procs:
            p.wait_ready(180)
        print("servers ready: " + ", ".join(f"{p.name} :{p.port}" for p in procs), flush=True)

        async def measure():
            parity = {}
            probe = bodies[200 if 200 in bodies else sizes[0]][0]
            ref = await fetch_scores("127.0.0.1", ig_port, "/v1/models/ingraph:score", probe)
            for t in targets:
                if t["label"] != "in-graph" and t["bodies"] is bodies:
                    got = await fetch_scores("127.0.0.1", t["port"], t["path"], probe)
                    parity[t["label"]] = float(np.abs(got - ref).max())
            for n in sizes:
                for c in concs:
                    here = [t for t in targets if n in t["bodies"]]
                    for k in range(args.alternations):
                        for t in rotation(here, k):
                            r = await run_cell(
                                "127.0.0.1",
                                t["port"],
                                t["path"],
                                t["bodies"][n],
                                c,
                                args.requests,
                                args.seconds,
                                args.warmup,
                                n,
                                t["pid"],
                            )
                            r.update(server=t["label"], n=n, concurrency=c, alternation=k)
                            cells.append(r)
                            print(
                                f"  [{k + 1}/{args.alternations}] {t['label']:22s} N={n:<5d} c={c}: p50 {r['p50_ms']:7.2f} ms  "
                                f"p99 {r['p99_ms']:7.2f} ms  {r['rps']:7.1f} req/s  server CPU "
                                f"{r['server_cpu_ms_per_request']:5.2f} ms/req  (load {r['loadavg_1m']:.1f}, "
                                f"{r['requests']} requests" + (f", ERRORS {r['errors']}" if r["errors"] else "") + ")",
                                flush=True,
                            )
            return parity

        import uvloop

        parity = uvloop.run(measure())
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(work, ignore_errors=True)

    rows = medians(cells)
    checks = acceptance(rows, roles)

    breakdown: dict = {}
    if not args.no_breakdown:
        from bench.serve_breakdown import run_breakdown

        forms = [(f"N={n}", bodies[n]) for n in sorted({IDS_N, max(sizes)} & set(sizes))]
        forms += [(f"N={IDS_N} ids-only", ids_bodies[IDS_N])] if ids_bodies else []
        codes = [("new", REPO)] + ([("old", args.baseline_repo)] if args.baseline_repo is not None else [])
        for label, bs in forms:
            for tag, repo in codes:
                key = f"{tag}:{names[0]}, {label}"
                print(f"in-process breakdown: {key} ...", flush=True)
                try:
                    breakdown[key] = run_breakdown(
                        repo,
                        (models_src if repo == REPO else old_src) / names[0],
                        bs,
                        100,
                        args.cache_mb / max(1, len(names)),
                        args.intra_threads,
                        args.inter_threads,
                    )
                except Exception as e:  # noqa: BLE001 - the breakdown is extra information
                    breakdown[key] = {"error": f"{type(e).__name__}: {e}"}

    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "old_serve_module": serve_module(args.baseline_repo) if args.baseline_repo else None,
        },
        "roles": vars(roles),
        "cells": cells,
        "medians": rows,
        "ratios": ratios(rows, roles),
        "acceptance": checks,
        "max_abs_score_diff_vs_ingraph": parity,
        "library_breakdown_ms": breakdown,
    }
    (out / "serve_latency.json").write_text(json.dumps(report, indent=2))
    plot(rows, sizes, concs, out / "serve_latency.png")

    print()
    print("\n".join(table_lines(rows, roles)))
    print(f"\nacceptance (issue 29), medians of {args.alternations} alternation(s):")
    print("\n".join(acceptance_lines(checks)))
    print(f"  |score - in-graph| on one request: {parity}")
    for label, b in breakdown.items():
        print("\n".join(breakdown_lines(f"in-process, {label}", b)))
    print(f"wrote {out / 'serve_latency.json'} and {out / 'serve_latency.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

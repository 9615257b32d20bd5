"""HTTP serving latency: ``offgraph serve`` (embeddings out of the graph) vs an in-graph baseline.

The servers run as subprocesses on free loopback ports, with the same uvicorn settings
(uvloop, httptools), the same number of worker processes (``--workers``, default one per
core, sharing the port with SO_REUSEPORT), the same TF threads and scoring-pool size:

* new code: ``offgraph serve`` of this checkout over the exported versions (default models ``sint8`` and ``sfp32``,
  linked into a private MODELS directory);
* in-graph: ``bench.ingraph_baseline``: the run's full Keras model as ONE SavedModel on padded ids
  + masks, fed by the same FG, behind the same kind of FastAPI endpoint;
* gRPC (``--grpc``, default on): the new code's own ``--grpc-port``, called with TF Serving's ``Predict`` and KServe
  v2's ``ModelInfer`` on the same bodies as named tensors (``bench.lib.grpc_client``), beside ``:score`` on the same
  server (its CPU per request is the same processes' CPU);
* old code (``--baseline-repo DIR``, a ``git archive REV | tar -x -C DIR``): its ``offgraph serve``
  (``python -m offgraph_cli serve`` in the old layout) run from DIR with DIR first on PYTHONPATH, over
  the same versions.

Requests are real MovieLens requests: rows grouped by ``request_id``, the request = the group's
user features, N candidates = N distinct real movies' item features (past the catalogue: every
movie once, some twice); when the first model's spec
declares feature tables, the same N = 1000 requests are also sent ids-only to the new code (the
feature join fills them; ``bench.lib.bodies.ids_only_bodies``). Each cell (N, concurrency) is
measured ``--alternations`` times, the servers' order rotated each time (so that a change in the
machine's load hits all of them), with a keep-alive raw asyncio HTTP/1.1 client (``bench.lib.client``, one connection per
concurrent stream, bodies serialized beforehand), a bounded number of requests and seconds per cell;
the server CPU per request is the servers' processes' CPU time (``/proc/PID/stat``) over a cell
divided by its requests. Then the phases of one request in process (``bench.lib.breakdown``) at
N = 1000 and the largest N, over distinct bodies. Prints the medians over alternations per server
with the ratios new / in-graph and new / old, and its acceptance lines
(``bench.lib.latency_table``); writes ``DIR/serve_latency.json`` and ``DIR/serve_latency.png``.

    python -m bench.serve_latency --run RUN --models MODELS --data movielens.parquet --out DIR \
        [--baseline-repo OLD] [--alternations 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.lib.bodies import build_bodies
from bench.lib.breakdown import breakdown_lines, layout
from bench.lib.client import fetch_scores, run_cell
from bench.lib.grpc_client import fetch_grpc_scores, grpc_bodies, model_inputs, run_grpc_cell
from bench.lib.latency_table import (
    Roles,
    acceptance,
    acceptance_lines,
    find,
    medians,
    ratios,
    rotation,
    table_lines,
)
from bench.lib.server import REPO, build_extensions, start
from offgraph.testing.harness import ServerProcess, free_port, serve_command


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
    ap.add_argument(
        "--baseline-grpc",
        action="store_true",
        help="the old code serves --grpc-port too: its gRPC clients are measured beside the new code's",
    )
    ap.add_argument(
        "--no-grpc", action="store_true", help="skip the gRPC clients (TF Serving Predict, KServe v2 ModelInfer)"
    )
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
        build_extensions(args.baseline_repo)
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
GRPC_LABELS = {"tfserving": "grpc Predict", "kserve": "grpc ModelInfer"}  # protocol -> its cells' label suffix


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
        from bench.lib.bodies import ids_only_bodies

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

    grpc_ports: dict[str, int] = {}  # server tag -> its --grpc-port

    def offgraph_proc(tag: str, repo: Path) -> ServerProcess:
        port = free_port()
        models = work / ("models" if repo == REPO else "old-models")
        cmd = serve_command(models, port, module=serve_module(repo))
        if not args.no_grpc and (repo == REPO or args.baseline_grpc):
            grpc_ports[tag] = free_port()
            cmd += ["--grpc-port", str(grpc_ports[tag])]
        cmd += ["--cache-mb", str(args.cache_mb), "--log-level", "warning", *threads]
        cmd += ["--follow-seconds", str(args.follow_seconds)] if args.follow_seconds else []
        return start(tag, cmd, port, out / f"{tag}_server.log", cwd=repo, pythonpath=None if repo == REPO else repo)

    procs = [offgraph_proc("new", REPO)]
    if args.baseline_repo is not None:
        procs.append(offgraph_proc("old", args.baseline_repo))
    ig_port = free_port()
    ingraph = start(
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
        {
            "label": f"{p.name}:{n}",
            "port": p.port,
            "path": f"/v1/models/{n}:score",
            "pid": p.pid,
            "bodies": bodies,
            "protocol": "rest",
        }
        for p in procs[:-1]
        for n in names
    ]
    targets.append(
        {
            "label": "in-graph",
            "port": ig_port,
            "path": "/v1/models/ingraph:score",
            "pid": ingraph.pid,
            "bodies": bodies,
            "protocol": "rest",
        }
    )
    roles = Roles(
        new=f"new:{names[0]}",
        ingraph="in-graph",
        old=f"old:{names[0]}" if args.baseline_repo is not None else None,
        ids=f"new:{names[0]} ids-only" if ids_bodies else None,
        grpc=() if args.no_grpc else tuple(f"new:{names[0]} {GRPC_LABELS[p]}" for p in GRPC_LABELS),
    )
    if ids_bodies:
        targets.append({**targets[0], "label": roles.ids, "bodies": ids_bodies})
    cells: list[dict] = []
    try:
        for p in procs:
            p.wait_ready(180)
        print("servers ready: " + ", ".join(f"{p.name} :{p.port}" for p in procs), flush=True)
        messages: dict[str, dict[int, list[bytes]]] = {}
        if grpc_ports:  # the first model's bodies as each protocol's messages, on each server's gRPC port
            inputs = model_inputs(procs[0].port, names[0])
            messages = {protocol: grpc_bodies(protocol, names[0], bodies, inputs) for protocol in GRPC_LABELS}
            for p in procs[:-1]:
                for protocol, label in GRPC_LABELS.items():
                    if p.name in grpc_ports:
                        targets.append(
                            {
                                "label": f"{p.name}:{names[0]} {label}",
                                "port": grpc_ports[p.name],
                                "path": protocol,
                                "pid": p.pid,
                                "bodies": messages[protocol],
                                "protocol": protocol,
                            }
                        )

        async def measure():
            parity = {}
            probe_n = 200 if 200 in bodies else sizes[0]
            probe = bodies[probe_n][0]
            ref = await fetch_scores("127.0.0.1", ig_port, "/v1/models/ingraph:score", probe)
            mine = await fetch_scores("127.0.0.1", targets[0]["port"], targets[0]["path"], probe)
            for t in targets:
                if t["protocol"] != "rest":  # the same candidates as named tensors: :score's scores
                    got = await fetch_grpc_scores(t["protocol"], t["port"], t["bodies"][probe_n][0])
                    parity[t["label"]] = float(np.abs(got - ref).max())
                    parity[f"{t['label']} vs {targets[0]['label']}"] = float(np.abs(got - mine).max())
                elif t["label"] != "in-graph" and t["bodies"] is bodies:
                    got = await fetch_scores("127.0.0.1", t["port"], t["path"], probe)
                    parity[t["label"]] = float(np.abs(got - ref).max())
            for n in sizes:
                for c in concs:
                    here = [t for t in targets if n in t["bodies"]]
                    for k in range(args.alternations):
                        for t in rotation(here, k):
                            cell = (t["bodies"][n], c, args.requests, args.seconds, args.warmup, n, t["pid"])
                            if t["protocol"] == "rest":
                                r = await run_cell("127.0.0.1", t["port"], t["path"], *cell)
                            else:
                                r = await run_grpc_cell(t["protocol"], t["port"], *cell)
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
        from bench.lib.breakdown import run_breakdown

        forms = [(f"N={n}", bodies[n], n) for n in sorted({IDS_N, max(sizes)} & set(sizes))]
        forms += [(f"N={IDS_N} ids-only", ids_bodies[IDS_N], None)] if ids_bodies else []
        codes = [("new", REPO)] + ([("old", args.baseline_repo)] if args.baseline_repo is not None else [])
        for label, bs, n in forms:
            # the same candidates as each gRPC protocol's messages: their per-request phases beside :score's
            grpc_msgs = {p: ms[n] for p, ms in messages.items()} if messages and n is not None else None
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
                        grpc_msgs,
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
    print(f"\nacceptance, medians of {args.alternations} alternation(s):")
    print("\n".join(acceptance_lines(checks)))
    print(f"  |score - in-graph| on one request: {parity}")
    for label, b in breakdown.items():
        print("\n".join(breakdown_lines(f"in-process, {label}", b)))
    print(f"wrote {out / 'serve_latency.json'} and {out / 'serve_latency.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

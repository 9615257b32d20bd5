"""Ids-only requests vs full-feature requests on the same server and model.

One ``offgraph serve`` subprocess serves a model whose spec declares feature tables (loaded). The
same real MovieLens requests (``bench.serve_latency.build_bodies``: a real user's request x N real
movies) are sent in two forms: every raw feature sent (the baseline), and ids only
(``{"request": {"user_id": ...}, "candidates": [{"movie_id": ...}, ...]}``, the server joins the
user row and all candidate rows from its RocksDB feature tables). The forms are measured in turn,
``--rounds`` times each (interleaved, so a change in the machine's load hits both), with the keep-alive
client of ``bench.serve_latency``; a cell's figures are the median over its rounds. Before timing,
both forms of a few requests must score identically. Prints the table, the p50 ratio (acceptance:
ids-only p50 <= 1.1x full at concurrency 1) and the bytes per request saved; writes
``DIR/ids_only_latency.json`` and ``DIR/ids_only_latency.png``.

    python -m bench.ids_only_latency --models MODELS --model movielens --data movielens.parquet --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

from bench.lib.bodies import build_bodies, ids_only_bodies
from bench.lib.client import fetch_scores, run_cell
from bench.lib.server import start
from offgraph.testing.harness import free_port

RATIO_LIMIT = 1.1


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = sorted({r["concurrency"] for r in results})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    x = np.arange(len(cs))
    for k, form in enumerate(("full", "ids-only")):
        rs = [next(r for r in results if r["form"] == form and r["concurrency"] == c) for c in cs]
        axes[0].bar(x + (k - 0.5) * 0.35, [r["p50_ms"] for r in rs], 0.35, label=f"{form} p50")
        axes[0].scatter(x + (k - 0.5) * 0.35, [r["p99_ms"] for r in rs], marker="_", s=300, color="k")
        axes[1].bar(x + (k - 0.5) * 0.35, [r["rps"] for r in rs], 0.35, label=form)
    for ax, title in zip(axes, ("latency (ms; bar p50, tick p99)", "throughput (req/s)")):
        ax.set_xticks(x, [f"c={c}" for c in cs])
        ax.set_title(title)
        ax.legend()
    n = results[0]["n"]
    fig.suptitle(f"N={n} candidates: ids-only (server joins the feature tables) vs every feature sent")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="MODELS directory (the model's feature tables loaded)")
    ap.add_argument("--model", default="movielens")
    ap.add_argument("--data", required=True, help="MovieLens flat table (offgraph data movielens-100k)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=200, help="candidates per request")
    ap.add_argument("--bodies", type=int, default=50, help="distinct requests per form")
    ap.add_argument("--requests", type=int, default=200, help="requests per cell (N = 200 of the issue)")
    ap.add_argument("--seconds", type=float, default=30.0, help="at most this long per cell")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from offgraph.modeldir.manifest import complete_versions
    from offgraph.modeldir.version import ModelVersion

    mdir = Path(args.models) / args.model
    vdir = mdir / str(complete_versions(mdir)[-1])
    spec = ModelVersion.open(vdir, verify_dense=False).spec
    if not spec.tables:
        print(f"{vdir}: the spec declares no feature tables", file=sys.stderr)
        return 2
    full = build_bodies(Path(args.data), [args.n], args.bodies, args.seed)[args.n]
    ids = ids_only_bodies(spec, full)
    forms = {"full": full, "ids-only": ids}
    size = {k: float(np.mean([len(b) for b in v])) for k, v in forms.items()}
    port = free_port()
    server = start(
        "offgraph",
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "serve",
            "--models",
            str(args.models),
            "--port",
            str(port),
            "--workers",
            str(args.workers),
        ],
        port,
        out / "server.log",
    )
    path = f"/v1/models/{args.model}:score"
    results: list[dict] = []
    try:
        server.wait_ready(180)
        for k in range(5):  # the forms must score the same (the tables hold every movie of the data)
            a = asyncio.run(fetch_scores("127.0.0.1", port, path, full[k]))
            b = asyncio.run(fetch_scores("127.0.0.1", port, path, ids[k]))
            if not np.array_equal(a, b):
                raise RuntimeError(
                    f"request {k}: ids-only scores differ from full-feature scores by up to {np.abs(a - b).max():.3g}"
                )
        print(
            f"parity: ids-only == full on 5 requests; body {size['full']:,.0f} B full vs {size['ids-only']:,.0f} B "
            f"ids-only",
            flush=True,
        )
        for c in [int(x) for x in args.concurrency.split(",")]:
            rounds: dict[str, list[dict]] = {f: [] for f in forms}
            for _ in range(args.rounds):
                for form, bodies in forms.items():
                    r = asyncio.run(
                        run_cell(
                            "127.0.0.1",
                            port,
                            path,
                            bodies,
                            c,
                            args.requests,
                            args.seconds,
                            warmup=20,
                            check_n=args.n,
                            pid=server.pid,
                        )
                    )
                    rounds[form].append(r)
            for form, rs in rounds.items():
                med = {
                    k: float(np.median([r[k] for r in rs]))
                    for k in ("p50_ms", "p99_ms", "rps", "server_cpu_ms_per_request", "server_cpu_utilization")
                }
                med.update(
                    form=form,
                    concurrency=c,
                    n=args.n,
                    requests=sum(r["requests"] for r in rs),
                    body_bytes=size[form],
                    rounds=rs,
                )
                results.append(med)
                print(
                    f"c={c:<2} {form:<8}  p50 {med['p50_ms']:6.2f} ms  p99 {med['p99_ms']:6.2f} ms  "
                    f"{med['rps']:6.1f} req/s  server CPU {med['server_cpu_ms_per_request']:5.2f} ms/req  "
                    f"body {size[form]:,.0f} B",
                    flush=True,
                )
    finally:
        server.stop()

    def cell(form, c):
        return next(r for r in results if r["form"] == form and r["concurrency"] == c)

    summary = {}
    for c in sorted({r["concurrency"] for r in results}):
        f, i = cell("full", c), cell("ids-only", c)
        summary[f"c={c}"] = {
            "p50_ratio": i["p50_ms"] / f["p50_ms"],
            "p99_ratio": i["p99_ms"] / f["p99_ms"],
            "rps_ratio": i["rps"] / f["rps"],
            "cpu_ratio": i["server_cpu_ms_per_request"] / f["server_cpu_ms_per_request"],
        }
        print(
            f"c={c}: ids-only / full: p50 x{summary[f'c={c}']['p50_ratio']:.3f}, p99 "
            f"x{summary[f'c={c}']['p99_ratio']:.3f}, req/s x{summary[f'c={c}']['rps_ratio']:.3f}, server CPU "
            f"x{summary[f'c={c}']['cpu_ratio']:.3f}"
        )
    c1 = min(r["concurrency"] for r in results)
    ok = summary[f"c={c1}"]["p50_ratio"] <= RATIO_LIMIT
    saved = size["full"] - size["ids-only"]
    print(
        f"bytes per request saved: {saved:,.0f} of {size['full']:,.0f} ({saved / size['full']:.1%}); acceptance "
        f"ids-only p50 <= {RATIO_LIMIT}x full at c={c1}: {'PASS' if ok else 'FAIL'}"
    )
    report = {
        "results": results,
        "summary": summary,
        "bytes_full": size["full"],
        "bytes_ids_only": size["ids-only"],
        "bytes_saved_per_request": saved,
        "acceptance": {"p50_ratio_limit": RATIO_LIMIT, "pass": ok},
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()},
    }
    (out / "ids_only_latency.json").write_text(json.dumps(report, indent=2))
    plot(results, out / "ids_only_latency.png")
    print(f"wrote {out / 'ids_only_latency.json'} and {out / 'ids_only_latency.png'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The server's thread settings side by side: ``--workers``, ``--score-threads`` and TensorFlow's intra-op threads.

Runs ``bench.serve_latency`` once per setting (the new code and the in-graph baseline under the same
setting, alternated inside each run) and tabulates throughput, p50/p99 and server CPU per request for each
(N, concurrency) cell. The settings are measured one after another, so a setting's figures are compared
with the in-graph baseline of the same run (``req/s ratio``) as well as with each other.

    python -m bench.serve_threads --run RUN --models MODELS --model-names movielens --data movielens.parquet \\
        --out bench/results/serve-threads [--sizes 200,1000 --concurrency 1,8]

Writes ``OUT/serve_threads.json`` and ``.png`` (and each run's own output under ``OUT/<setting>/``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (workers, score threads, TF intra-op threads): the defaults, then one change at a time
SETTINGS = ((2, 2, 1), (1, 2, 1), (2, 1, 1), (1, 1, 1), (1, 2, 2))


def _name(setting: tuple[int, int, int]) -> str:
    w, s, i = setting
    return f"w{w}-s{s}-i{i}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--model-names", default="movielens")
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="bench/results/serve-threads")
    p.add_argument("--sizes", default="200,1000")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--alternations", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--requests", type=int, default=200)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for setting in SETTINGS:
        w, s, i = setting
        sub = out / _name(setting)
        print(f"== --workers {w} --score-threads {s} --intra-threads {i}", flush=True)
        subprocess.run(  # an entry script of its own: run, not imported
            [
                *(sys.executable, "-m", "bench.serve_latency"),
                *("--run", args.run, "--models", args.models, "--model-names", args.model_names),
                *("--data", args.data, "--out", str(sub), "--sizes", args.sizes),
                *("--concurrency", args.concurrency, "--alternations", str(args.alternations)),
                *("--seconds", str(args.seconds), "--requests", str(args.requests)),
                *("--workers", str(w), "--score-threads", str(s), "--intra-threads", str(i)),
                "--no-breakdown",
                "--no-ids-only",
            ],
            cwd=REPO,
            check=True,
        )
        doc = json.loads((sub / "serve_latency.json").read_text())
        for m in doc["medians"]:
            rows.append({"setting": _name(setting), "workers": w, "score_threads": s, "intra_threads": i, **m})
    (out / "serve_threads.json").write_text(
        json.dumps({"machine": {"cpus": os.cpu_count()}, "settings": vars(args), "rows": rows}, indent=1)
    )
    print("\nsetting       server     N  c |   p50 ms   p99 ms    req/s  CPU ms/req")
    for r in rows:
        print(
            f"{r['setting']:12s}  {r['server'][:9]:9s} {r['n']:5d} {r['concurrency']:2d} | {r['p50_ms']:8.2f} "
            f"{r['p99_ms']:8.2f} {r['rps']:8.1f} {r['server_cpu_ms_per_request']:10.2f}"
        )
    _plot(rows, out / "serve_threads.png")
    print(f"wrote {out / 'serve_threads.json'} and {out / 'serve_threads.png'}")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["n"], r["concurrency"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(4 * len(cells), 3.4), squeeze=False)
    names = [_name(s) for s in SETTINGS]
    for ax, (n, c) in zip(axes[0], cells):
        for k, server in enumerate(sorted({r["server"] for r in rows})):
            vals = [
                next(
                    (
                        r["rps"]
                        for r in rows
                        if r["setting"] == nm and r["server"] == server and r["n"] == n and r["concurrency"] == c
                    ),
                    0.0,
                )
                for nm in names
            ]
            ax.bar([x + 0.4 * k for x in range(len(names))], vals, width=0.4, label=server)
        ax.set_xticks([x + 0.2 for x in range(len(names))], names, rotation=30, fontsize=7)
        ax.set_title(f"N={n} c={c}")
        ax.set_ylabel("req/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())

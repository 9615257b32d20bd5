"""Training step time against table size, per optimizer: `offgraph train`'s own step (``Trainer.prepare``: the
DeepFM, the pointwise objective with its L2 terms, the optimizer) at batch 1,024 on a synthetic spec of
``--fields`` id fields of R rows EACH (R = ``--sizes``, 10^5 and 10^7), D = 16 and the demo's head (MLP 64-32);
one id per field per row, drawn uniformly over the R rows (no locality: the hardest case for a big table) or,
with ``--ids zipf``, Zipf-distributed (exponent 1.1, as ``bench.scale``'s traffic). For each optimizer both sizes
are built and their steps alternated step by step after a warm-up, medians of the wall time and of the process's
CPU time (which other jobs on a shared machine inflate less); each round rebuilds them. Beside
the time, memory: in a fresh process per optimizer and size, the resident size of the built model and the peak
over a few steps (both optimizers then hold two slots per table; what differs at the peak is what a step
allocates). Then the held-out AUC of the demo's MovieLens training
(``examples/movielens.yaml``, per-key-time split, the default settings otherwise: early stopping and the refit)
with each optimizer, same seeds. ``--parts`` picks what runs; the parts not run are kept from ``OUT/results.json``.

    python -m bench.train_step --out bench/results/train-step [--fields 2] [--sizes 1e5,1e7] [--seeds 0,1]
        [--parts timing,memory,auc] [--tf-threads N]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from pathlib import Path

OPTIMIZERS = ("adam", "lazy_adam")
BATCH = 1024
ZIPF_EXPONENT = 1.1


def _spec(fields: int, rows: int):
    from offgraph.features import parse_spec

    raw = {
        "model": {"embedding_dim": 16, "mlp": [64, 32], "l2_embedding": 1e-6, "l2_dense": 1e-6},
        "label": "label",
        "fields": [
            {"name": f"f{i}", "scope": "request", "op": "id", "input": f"f{i}", "rows": rows} for i in range(fields)
        ],
    }
    return parse_spec(raw, source=f"train_step {fields}x{rows}")


def _batches(fields: int, rows: int, count: int, ids: str, seed: int) -> list:
    """``count`` batches of BATCH rows as the step's tensors (x, labels, segments), made beforehand."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        if ids == "zipf":  # rank r drawn with p ~ r^-s over the R rows, ranks scattered over the table
            draw = lambda: (rng.zipf(ZIPF_EXPONENT, BATCH) - 1) % rows * 7919 % rows  # noqa: E731
        else:
            draw = lambda: rng.integers(0, rows, BATCH)  # noqa: E731
        x = {}
        for i in range(fields):
            x[f"ids_{i}"] = tf.constant(draw().astype(np.int32)[:, None])
            x[f"mask_{i}"] = tf.ones((BATCH, 1), tf.float32)
        y = tf.constant(rng.integers(0, 2, BATCH).astype(np.float32))
        out.append((x, y, tf.zeros(BATCH, tf.int32)))
    return out


def _rss_mb() -> tuple[float, float]:
    """(resident MB now, peak resident MB since the last reset) of this process."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def _memory_probe(optimizer: str, fields: int, rows: int, steps: int) -> dict:
    """In this (fresh) process: resident MB of the built model, and the peak over ``steps`` steps (the optimizer's
    two slots per table are made by the first)."""
    from offgraph.model.train import TrainConfig, Trainer

    trainer = Trainer(_spec(fields, rows), TrainConfig(optimizer=optimizer, batch_size=BATCH, split="random"))
    batches = _batches(fields, rows, steps, "uniform", 0)
    step = trainer.prepare({k: v.numpy()[:1] for k, v in batches[0][0].items()}, steps)
    built, _ = _rss_mb()
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak (VmHWM) := now
    for b in batches:
        step(*b).numpy()
    _, peak = _rss_mb()
    tables_mb = fields * rows * (16 + 1) * 4 / 2**20
    return {"built_mb": built, "peak_mb": peak, "tables_mb": tables_mb, "peak_above_built_mb": peak - built}


def _memory(fields: int, sizes: list[int], steps: int) -> dict:
    """``_memory_probe`` of each optimizer and size, each in a fresh process (nothing freed before to reuse)."""
    import json
    import subprocess
    import sys

    out: dict = {}
    for opt in OPTIMIZERS:
        out[opt] = {}
        for rows in sizes:
            argv = [
                sys.executable,
                "-m",
                "bench.train_step",
                "--memory-probe",
                f"{opt},{rows}",
                "--fields",
                str(fields),
            ]
            res = subprocess.run(
                argv + ["--steps", str(steps), "--out", "-"], capture_output=True, text=True, check=True
            )
            out[opt][str(rows)] = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"memory {opt} R={rows:.0e}: peak {out[opt][str(rows)]['peak_mb']:.0f} MB", flush=True)
    return out


def _time_steps(optimizer: str, fields: int, sizes: list[int], steps: int, warmup: int, ids: str, seed: int) -> dict:
    """{rows: {"seconds": [per step], "median_ms": ...}}: both sizes built, their steps alternated."""
    import numpy as np

    from offgraph.model.train import TrainConfig, Trainer

    trainers, fns, batches = {}, {}, {}
    for rows in sizes:
        cfg = TrainConfig(optimizer=optimizer, batch_size=BATCH, seed=seed, split="random")
        trainers[rows] = Trainer(_spec(fields, rows), cfg)
        batches[rows] = _batches(fields, rows, warmup + steps, ids, seed)
        fns[rows] = trainers[rows].prepare({k: v.numpy()[:1] for k, v in batches[rows][0][0].items()}, steps)
    out: dict = {rows: {"seconds": [], "cpu_seconds": []} for rows in sizes}
    for rows in sizes:  # the first steps trace the function and build the optimizer's slots
        for b in batches[rows][:warmup]:
            fns[rows](*b).numpy()
    for i in range(warmup, warmup + steps):
        for rows in sizes:
            t0, c0 = time.perf_counter(), time.process_time()
            fns[rows](*batches[rows][i]).numpy()
            out[rows]["seconds"].append(time.perf_counter() - t0)
            out[rows]["cpu_seconds"].append(time.process_time() - c0)
    for rows in sizes:
        out[rows]["median_ms"] = float(np.median(out[rows]["seconds"]) * 1e3)
    del trainers, fns, batches
    gc.collect()
    return out


def _auc(optimizer: str, seed: int, work: Path) -> dict:
    """The demo's MovieLens training with ``optimizer``: held-out metrics, the epochs chosen, the seconds."""
    import pyarrow.parquet as pq

    from offgraph.data.datasets import build
    from offgraph.features import load_spec
    from offgraph.model.train import TrainConfig, train_run

    repo = Path(__file__).resolve().parent.parent
    table = pq.read_table(build("movielens-100k", work / "data"))
    cfg = TrainConfig(split="per-key-time", seed=seed, optimizer=optimizer)
    _, metrics = train_run(load_spec(repo / "examples" / "movielens.yaml"), table, cfg, None, progress=False)
    early = metrics["early_stopping"] or {}
    return {
        "held_out_auc": metrics["held_out"]["auc"],
        "held_out_logloss": metrics["held_out"]["logloss"],
        "best_epoch": early.get("best_epoch"),
        "train_seconds": metrics["train_seconds"],
    }


def _markdown(report: dict) -> str:
    lines = []
    if report.get("timing"):
        t = report["timing"]
        small, big = (str(s) for s in report["sizes"])
        lines += [
            f"# train step at batch {BATCH}: {report['fields']} fields of R rows each, D = 16, ids {report['ids']} "
            f"({report['cpus']} CPUs, {report['rounds']} rounds x {report['steps']} alternated steps, Keras Adam "
            f"{report['adam_steps']})",
            "",
            f"| optimizer | R = {int(small):.0e} ms/step | R = {int(big):.0e} ms/step | ratio | "
            f"R = {int(small):.0e} CPU ms/step | R = {int(big):.0e} CPU ms/step | CPU ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for opt in OPTIMIZERS:
            r = t[opt]
            lines.append(
                f"| {opt} | {r[small]['median_ms']:.1f} | {r[big]['median_ms']:.1f} | {r['ratio']:.2f} | "
                f"{r[small]['median_cpu_ms']:.1f} | {r[big]['median_cpu_ms']:.1f} | {r['cpu_ratio']:.2f} |"
            )
    if report.get("memory"):
        lines += ["", "| optimizer | R | tables MB | built model RSS MB | peak RSS MB | peak - built MB |"]
        lines.append("|---|---|---|---|---|---|")
        for opt in OPTIMIZERS:
            for rows, m in report["memory"][opt].items():
                lines.append(
                    f"| {opt} | {int(rows):.0e} | {m['tables_mb']:.0f} | {m['built_mb']:.0f} | {m['peak_mb']:.0f} | "
                    f"{m['peak_above_built_mb']:.0f} |"
                )
    if report.get("auc"):
        lines += ["", "| optimizer | seed | held-out AUC | logloss | epochs (early stopping) | train s |"]
        lines.append("|---|---|---|---|---|---|")
        for opt in OPTIMIZERS:
            for seed, a in report["auc"][opt].items():
                lines.append(
                    f"| {opt} | {seed} | {a['held_out_auc']:.4f} | {a['held_out_logloss']:.4f} | {a['best_epoch']} | "
                    f"{a['train_seconds']:.0f} |"
                )
        lines += ["", f"mean held-out AUC, lazy_adam - adam: {report['auc_difference']:+.4f}"]
    return "\n".join(lines) + "\n"


def _plot(report: dict, path: Path) -> None:
    if not report.get("timing"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    sizes = report["sizes"]
    for opt, c in zip(OPTIMIZERS, ("tab:gray", "tab:blue")):
        ax.plot(sizes, [report["timing"][opt][str(s)]["median_ms"] for s in sizes], "o-", color=c, label=opt)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows per table")
    ax.set_ylabel(f"median ms per step, batch {BATCH}")
    ax.set_title(f"{report['fields']} fields, ids {report['ids']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--fields", type=int, default=2, help="id fields, each a table of R rows")
    ap.add_argument("--sizes", default="1e5,1e7", help="rows per table, two sizes: the ratio is the second's")
    ap.add_argument("--ids", choices=("uniform", "zipf"), default="uniform")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per size and round (lazy_adam)")
    ap.add_argument("--adam-steps", type=int, default=8, help="timed steps per size and round of Keras Adam")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", default="0,1", help="MovieLens trainings per optimizer")
    ap.add_argument("--parts", default="timing,memory,auc")
    ap.add_argument("--tf-threads", type=int, default=0, help="TensorFlow's intra- and inter-op threads (0: default)")
    ap.add_argument("--work", default="/tmp/train_step", help="where MovieLens is built")
    ap.add_argument("--stem", default="results")
    ap.add_argument("--memory-probe", help=argparse.SUPPRESS)  # OPTIMIZER,ROWS: _memory's child, JSON on stdout
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.memory_probe:
        import json

        opt, rows = args.memory_probe.split(",")
        print(json.dumps(_memory_probe(opt, args.fields, int(rows), min(args.steps, 5))))
        return 0
    import json

    import numpy as np

    from bench.lib.report import write_report

    if args.tf_threads:
        from offgraph.server.process.compute_threads import configure_tf_threads

        configure_tf_threads(args.tf_threads, args.tf_threads)
    parts = set(args.parts.split(","))
    out = Path(args.out)
    kept = out / f"{args.stem}.json"
    report: dict = json.loads(kept.read_text()) if kept.exists() else {}
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    if "timing" in parts:
        seconds: dict = {opt: {s: [] for s in sizes} for opt in OPTIMIZERS}
        cpu: dict = {opt: {s: [] for s in sizes} for opt in OPTIMIZERS}
        for r in range(args.rounds):
            for opt in OPTIMIZERS:
                steps = args.adam_steps if opt == "adam" else args.steps
                res = _time_steps(opt, args.fields, sizes, steps, args.warmup, args.ids, seed=r)
                for s in sizes:
                    seconds[opt][s] += res[s]["seconds"]
                    cpu[opt][s] += res[s]["cpu_seconds"]
                    print(f"round {r} {opt} R={s:.0e}: {res[s]['median_ms']:.1f} ms/step", flush=True)
        timing: dict = {}
        for opt in OPTIMIZERS:
            row: dict = {
                str(s): {
                    "median_ms": float(np.median(seconds[opt][s]) * 1e3),
                    "p90_ms": float(np.percentile(seconds[opt][s], 90) * 1e3),
                    "median_cpu_ms": float(np.median(cpu[opt][s]) * 1e3),
                    "steps": len(seconds[opt][s]),
                }
                for s in sizes
            }
            row["ratio"] = row[str(sizes[-1])]["median_ms"] / row[str(sizes[0])]["median_ms"]
            row["cpu_ratio"] = row[str(sizes[-1])]["median_cpu_ms"] / row[str(sizes[0])]["median_cpu_ms"]
            timing[opt] = row
        report.update(
            fields=args.fields,
            sizes=sizes,
            rows_are="per table (each field has its own table of R rows, and a 1-wide first-order table of R rows)",
            ids=args.ids,
            batch=BATCH,
            steps=args.steps,
            adam_steps=args.adam_steps,
            rounds=args.rounds,
            tf_threads=args.tf_threads or "default",
            cpus=os.cpu_count(),
            machine=platform.processor() or platform.machine(),
            load_average_after_timing=os.getloadavg(),
            timing=timing,
        )
    if "memory" in parts:
        report["memory"] = _memory(args.fields, sizes, args.steps)
    if "auc" in parts:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        report["auc"] = {opt: {str(seed): _auc(opt, seed, Path(args.work)) for seed in seeds} for opt in OPTIMIZERS}
        mean = {opt: float(np.mean([a["held_out_auc"] for a in report["auc"][opt].values()])) for opt in OPTIMIZERS}
        report["auc_difference"] = mean["lazy_adam"] - mean["adam"]
    out.mkdir(parents=True, exist_ok=True)
    write_report(out, args.stem, report, _markdown(report), _plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The dense head's two runtimes per call: the SavedModel's signature (``SignatureCall``, the scorer's TF path)
against the NumPy forward of the same weights (``offgraph/scoring/numpy_head.py``), in process, on the signature
the scorer calls (the split one where the version has it; the whole one too), N = 50, 200, 1000, 2000 candidates,
alternated call by call, medians; and the NumPy forward's max |dCTR| against the SavedModel on every version given
(the load's probe and a larger one).

    python -m bench.dense_head --version V [--version V2 ...] [--make W] --out OUT [--blas-threads 1]

``--tf-threads`` sets TensorFlow's intra- and inter-op threads (as ``offgraph serve --intra-threads``).
``--make W`` trains and exports, under W, the versions the tests export (``tests/conftest.py``: the tiny MovieLens
model, the full-size one and the numeric one, 1 epoch each), added to the parity list. The first ``--version``
is timed. ``--blas-threads`` sets OpenBLAS's threads (OPENBLAS_NUM_THREADS) before NumPy loads.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

SIZES = (50, 200, 1000, 2000)


def _make_versions(work: Path) -> list[Path]:
    """Train and export the tests' versions (tests/conftest.py's tiny_model, small_run, numeric_run) under work."""
    import pyarrow.parquet as pq
    import yaml

    from offgraph.data.datasets import build
    from offgraph.export.export import export_run
    from offgraph.features import load_spec, parse_spec
    from offgraph.model.train import TrainConfig, train_run

    repo = Path(__file__).resolve().parent.parent
    table = pq.read_table(build("movielens-100k", work / "data"))
    raw = yaml.safe_load((repo / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    runs = {
        "tiny": (parse_spec(raw, source="tiny movielens"), table.slice(0, 8000), 512),
        "small": (load_spec(repo / "examples" / "movielens.yaml"), table.slice(0, 30000), None),
        "numeric": (load_spec(repo / "examples" / "movielens_numeric.yaml"), table.slice(0, 30000), None),
    }
    out = []
    for name, (spec, rows, batch) in runs.items():
        version = work / "models" / name / "1"
        if not (version / "manifest.json").exists():
            cfg = TrainConfig(epochs=1, split="per-key-time")
            if batch:
                cfg.batch_size = batch
            train_run(spec, rows, cfg, work / "runs" / name, progress=False)
            export_run(work / "runs" / name, version, shards=2, quant="fp32", progress=False)
        out.append(version)
    return out


def _heads(version: Path):
    """{signature name: (SignatureCall, the NumPy forward)} of a version: ``whole``, and ``split`` where it has it."""
    from offgraph.modeldir.version import ModelVersion
    from offgraph.scoring.numpy_head import NumpyHead, read_weights
    from offgraph.scoring.signature_call import SignatureCall

    mv = ModelVersion.open(version)
    loaded, serve = mv.dense
    split = mv.manifest.dense.split if mv.manifest.dense is not None else None
    w = read_weights(loaded, len(mv.spec.fields), mv.manifest.embedding_dim, len(mv.spec.numeric))
    if w is None:
        raise SystemExit(f"{version}: the dense head's weights are not where the export puts them")
    head = NumpyHead(w, *((split.request_fields, split.candidate_fields) if split else ((), ())))
    out = {"whole": (SignatureCall(serve), head.whole)}
    if split is not None:
        out["split"] = (SignatureCall(loaded.signatures[split.name]), head.split)
    return out, loaded


def _parity(version: Path) -> dict:
    from offgraph.scoring.numpy_head import PROBE_ROWS, max_gap, probe_inputs

    heads, _loaded = _heads(version)
    out = {}
    for name, (call, fwd) in heads.items():
        big = probe_inputs(call.shapes, rows=2000, seed=1)
        gap_big = float(abs(fwd(big) - call(big)["ctr"].numpy()).max())
        out[name] = {f"probe_{PROBE_ROWS}": max_gap(fwd, call, call.shapes), "probe_2000": gap_big}
    return out


def _timings(version: Path, rounds: int, calls: int) -> dict:
    import numpy as np

    from offgraph.scoring.numpy_head import probe_inputs

    heads, _loaded = _heads(version)
    out: dict = {}
    for name, (call, fwd) in heads.items():
        out[name] = {}
        for n in SIZES:
            inputs = probe_inputs(call.shapes, rows=n, seed=n)
            runs = {"savedmodel": lambda: call(inputs)["ctr"].numpy(), "numpy": lambda: fwd(inputs)}
            for f in runs.values():  # warm both
                for _ in range(20):
                    f()
            ts: dict = {k: [] for k in runs}
            for _ in range(rounds * calls):  # alternated call by call: a noisy neighbour hits both alike
                for k, f in runs.items():
                    t0 = time.perf_counter()
                    f()
                    ts[k].append(time.perf_counter() - t0)
            row = {k: float(np.median(v) * 1e6) for k, v in ts.items()}
            row["numpy_over_savedmodel"] = row["numpy"] / row["savedmodel"]
            out[name][str(n)] = row
            print(f"{name} N={n}: SavedModel {row['savedmodel']:.0f} us, NumPy {row['numpy']:.0f} us", flush=True)
    return out


def _markdown(report: dict) -> str:
    lines = [
        f"# dense head: SavedModel vs NumPy per call ({report['timed']}, OpenBLAS threads "
        f"{report['blas_threads']}, TensorFlow threads {report.get('tf_threads', 'default')}, {report['cpus']} CPUs)",
        "",
        "| signature | N | SavedModel us | NumPy us | NumPy / SavedModel |",
        "|---|---|---|---|---|",
    ]
    for sig, rows in report["timings"].items():
        for n, r in rows.items():
            lines.append(
                f"| {sig} | {n} | {r['savedmodel']:.0f} | {r['numpy']:.0f} | {r['numpy_over_savedmodel']:.2f} |"
            )
    lines += ["", "| version | signature | max dCTR, probe (load) | max dCTR, 2000 rows |", "|---|---|---|---|"]
    for v, sigs in report["parity"].items():
        for sig, g in sigs.items():
            vals = list(g.values())
            lines.append(f"| {v} | {sig} | {vals[0]:.3g} | {vals[1]:.3g} |")
    return "\n".join(lines) + "\n"


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sigs = list(report["timings"])
    fig, axes = plt.subplots(1, len(sigs), figsize=(5 * len(sigs), 3.4), squeeze=False)
    for ax, sig in zip(axes[0], sigs):
        rows = report["timings"][sig]
        ns = [int(n) for n in rows]
        for k, c in (("savedmodel", "tab:gray"), ("numpy", "tab:blue")):
            ax.plot(ns, [rows[str(n)][k] for n in ns], "o-", color=c, label=k)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("candidates N")
        ax.set_ylabel("median us per call")
        ax.set_title(f"{sig} signature")
        ax.legend()
    fig.suptitle(
        f"dense head per call, OpenBLAS threads {report['blas_threads']}, TF threads {report.get('tf_threads', 'default')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="append", default=[], help="an exported version (the first is timed)")
    ap.add_argument("--make", help="train and export the tests' versions under this folder (parity)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=60, help="calls of each runtime per round and N")
    ap.add_argument("--blas-threads", default="", help="OPENBLAS_NUM_THREADS (empty: OpenBLAS's default)")
    ap.add_argument(
        "--tf-threads", type=int, default=0, help="TensorFlow's intra- and inter-op threads (0: its default)"
    )
    ap.add_argument("--stem", default="dense_head")
    args = ap.parse_args(argv)
    if args.blas_threads:
        os.environ["OPENBLAS_NUM_THREADS"] = args.blas_threads
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from bench.lib.report import write_report

    if args.tf_threads:
        from offgraph.server.process.compute_threads import configure_tf_threads

        configure_tf_threads(args.tf_threads, args.tf_threads)

    versions = [Path(v) for v in args.version]
    if args.make:
        versions += _make_versions(Path(args.make))
    if not versions:
        ap.error("give --version or --make")
    report = {
        "timed": str(versions[0]),
        "blas_threads": args.blas_threads or "default",
        "tf_threads": args.tf_threads or "default",
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "rounds": args.rounds,
        "calls": args.calls,
        "parity": {str(v): _parity(v) for v in versions},
        "timings": _timings(versions[0], args.rounds, args.calls),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_report(out, args.stem, report, _markdown(report), _plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

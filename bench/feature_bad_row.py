"""A stored feature row the server cannot use: valid requests naming other items are unaffected.

One ``offgraph serve`` subprocess serves a small MovieLens DeepFM whose item table holds every movie (built here:
1 epoch on the first ``--rows`` ratings, tables 1/50 of the example's, unless ``--models`` names a model with
loaded tables). One movie X's row is switched, through the table's one writer (``FeatureDB.write``, around the
writers' value checks, as a row written before them would be), between its real values ("without") and values
FG refuses ("with": ``release_year`` "abc" and 5,000 genres); the server follows the table. The same mixed
ids-only traffic runs in both: ``--share`` of the requests name X among their N candidates (scored with X as
an unknown key while the row is bad, never a 422), the others name other movies only. The two states alternate
``--alternations`` times in one run (a change in the machine's load hits both); a state's figures are the
medians over its runs. Acceptance: the p99 of the requests naming other items, with the bad row, is within
``RATIO_LIMIT`` of the p99 without it; every response is a 200. The noise is reported as the spread of the
runs without the bad row (each against their median). Writes ``DIR/feature_bad_row.json`` and ``.png``.

    python -m bench.feature_bad_row --out bench/results/feature-bad-row
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib.client import Conn
from bench.lib.proc import cpu_seconds
from bench.lib.server import start
from offgraph.testing.harness import free_port

RATIO_LIMIT = 1.10
MODEL = "ml"


def build_model(root: Path, rows: int) -> tuple[Path, object]:
    """MODELS with ml/1 (the tiny test model's recipe) and its tables loaded from every row; (MODELS, table)."""
    import pyarrow.parquet as pq
    import yaml

    from offgraph.data.datasets import build
    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    table = pq.read_table(build("movielens-100k", root / "data")).slice(0, rows)
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    spec = parse_spec(raw, source="bench movielens")
    train_run(spec, table, TrainConfig(epochs=1, batch_size=512, split="per-key-time"), root / "run", progress=False)
    models = root / "models"
    export_run(
        root / "run",
        models / MODEL / "1",
        shards=2,
        quant="fp32",
        progress=False,
        feature_data=table,
        feature_rows="all",
    )
    return models, table


def bodies(table, n: int, count: int, bad_movie, share: float, seed: int) -> tuple[list[bytes], list[bool]]:
    """Ids-only bodies (a real user x N distinct movies) and whether each names ``bad_movie``."""
    rng = np.random.default_rng(seed)
    users = sorted(set(table.column("user_id").to_pylist()))
    movies = [m for m in sorted(set(table.column("movie_id").to_pylist())) if m != bad_movie]
    out, names_bad = [], []
    for _k in range(count):
        cands = [int(m) for m in rng.choice(movies, n, replace=False)]
        bad = rng.random() < share
        if bad:
            cands[int(rng.integers(n))] = bad_movie
        body = {"request": {"user_id": int(rng.choice(users))}, "candidates": [{"movie_id": m} for m in cands]}
        out.append(json.dumps(body, separators=(",", ":")).encode())
        names_bad.append(bad)
    return out, names_bad


async def run_phase(
    port: int, path: str, bodies_: list[bytes], names_bad: list[bool], concurrency: int, requests: int, pid: int
) -> dict:
    """``requests`` requests over ``concurrency`` keep-alive connections; latency per class (other / bad)."""
    conns = [await Conn.open("127.0.0.1", port) for _ in range(concurrency)]
    lat = {"other": [], "bad": []}
    status_counts: dict[int, int] = {}
    unknown = 0
    issued = 0

    async def stream(conn: Conn, k: int) -> None:
        nonlocal issued, unknown
        j = k
        while issued < requests:
            issued += 1
            i = j % len(bodies_)
            j += concurrency
            t0 = time.perf_counter()
            status, payload = await conn.post(path, bodies_[i])
            lat["bad" if names_bad[i] else "other"].append(time.perf_counter() - t0)
            status_counts[status] = status_counts.get(status, 0) + 1
            if status == 200 and names_bad[i]:
                unknown += json.loads(payload)["unknown_candidates"]

    try:
        for i in range(min(20, len(bodies_))):  # warm-up: connections, caches
            await conns[i % concurrency].post(path, bodies_[i])
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(stream(c, k) for k, c in enumerate(conns)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    finally:
        for c in conns:
            c.close()
    out = {
        "requests": issued,
        "seconds": wall,
        "statuses": status_counts,
        "server_cpu_ms_per_request": cpu / max(issued, 1) * 1e3,
        "bad_candidates_unknown": unknown,
        "loadavg_1m": os.getloadavg()[0],
    }
    for cls, xs in lat.items():
        a = np.asarray(xs) * 1e3
        out[cls] = {
            "requests": len(a),
            **(
                {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}
                if len(a)
                else {}
            ),
        }
    return out


async def wait_state(port: int, path: str, probe: bytes, bad: bool, timeout: float = 10.0) -> None:
    """Until the server serves the row as written (the probe names X: unknown while bad)."""
    deadline = time.monotonic() + timeout
    c = await Conn.open("127.0.0.1", port)
    try:
        while True:
            status, payload = await c.post(path, probe)
            if status != 200:
                raise RuntimeError(f"probe: {status} {payload[:300]!r}")
            if (json.loads(payload)["unknown_candidates"] > 0) == bad:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not pick up the {'bad' if bad else 'good'} row in {timeout} s")
            await asyncio.sleep(0.05)
    finally:
        c.close()


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for state, mark in (("without", "o"), ("with", "s")):
        runs = report["runs"][state]
        x = np.arange(len(runs))
        axes[0].plot(x, [r["other"]["p99_ms"] for r in runs], marker=mark, label=f"{state} bad row: p99")
        axes[0].plot(x, [r["other"]["p50_ms"] for r in runs], marker=mark, linestyle=":", label=f"{state}: p50")
        axes[1].plot(x, [r["bad"].get("p99_ms", np.nan) for r in runs], marker=mark, label=f"{state} bad row: p99")
    axes[0].set_title("requests naming other items (ms)")
    axes[1].set_title("requests naming the item X (ms)")
    for ax in axes:
        ax.set_xlabel("alternation")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    s = report["summary"]
    fig.suptitle(
        f"stored bad feature row: other items' p99 with / without = x{s['p99_ratio']:.3f} "
        f"(limit x{RATIO_LIMIT}); noise +-{s['noise_p99_pct']:.1f}%"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", help="MODELS holding ml/ with its feature tables loaded (default: build one)")
    ap.add_argument("--rows", type=int, default=8000, help="ratings to train the built model on")
    ap.add_argument("--n", type=int, default=50, help="candidates per request")
    ap.add_argument("--share", type=float, default=0.2, help="share of requests naming the item X")
    ap.add_argument("--requests", type=int, default=1500, help="requests per run")
    ap.add_argument("--alternations", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from offgraph.feature_tables.db import FeatureDB, row_key, table_dir

    with tempfile.TemporaryDirectory(prefix="feature-bad-row-") as tmp:
        import pyarrow.parquet as pq

        from offgraph.data.datasets import build

        if args.models:
            models = Path(args.models)
            table = pq.read_table(build("movielens-100k", Path(tmp) / "data")).slice(0, args.rows)
        else:
            t0 = time.monotonic()
            models, table = build_model(Path(tmp), args.rows)
            print(f"model built in {time.monotonic() - t0:.0f} s", flush=True)
        movies = table.column("movie_id").to_pylist()
        bad_movie = max(set(movies), key=movies.count)  # the most rated movie: a real, popular item
        items, names_bad = bodies(table, args.n, 200, bad_movie, args.share, args.seed)
        probe = json.dumps({"request": {"user_id": 1}, "candidates": [{"movie_id": bad_movie}]}).encode()
        port = free_port()
        server = start(
            "offgraph",
            [
                sys.executable,
                "-m",
                "offgraph.cli",
                "serve",
                "--models",
                str(models),
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            port,
            out / "server.log",
        )
        path = f"/v1/models/{MODEL}:score"
        runs: dict[str, list[dict]] = {"without": [], "with": []}
        db = FeatureDB(table_dir(models / MODEL, "item"), "w")  # the table's one writer (no updater runs here)
        k = row_key(bad_movie)
        good = db.get([k])[0]
        bad = {**good, "release_year": "abc", "genres": [f"g{i}" for i in range(5000)]}
        try:
            server.wait_ready(180)
            seq = 0
            for a in range(args.alternations):
                for state in ("without", "with") if a % 2 == 0 else ("with", "without"):  # ABBA: no order bias
                    seq += 1
                    db.write([k], [bad if state == "with" else good], [seq])
                    asyncio.run(wait_state(port, path, probe, state == "with"))
                    r = asyncio.run(
                        run_phase(port, path, items, names_bad, args.concurrency, args.requests, server.pid)
                    )
                    runs[state].append(r)
                    print(
                        f"alternation {a} {state:>7} bad row: other items p50 {r['other']['p50_ms']:6.2f} ms "
                        f"p99 {r['other']['p99_ms']:6.2f} ms | naming X p50 {r['bad'].get('p50_ms', 0):6.2f} ms "
                        f"p99 {r['bad'].get('p99_ms', 0):6.2f} ms | statuses {r['statuses']} | load "
                        f"{r['loadavg_1m']:.2f}",
                        flush=True,
                    )
        finally:
            db.write([k], [good], [seq + 1])
            db.close()
            server.stop()
        log_lines = [ln for ln in (out / "server.log").read_text().splitlines() if "cannot use" in ln]

    def med(state: str, cls: str, key: str) -> float:
        return float(np.median([r[cls][key] for r in runs[state] if key in r[cls]]))

    without = [r["other"]["p99_ms"] for r in runs["without"]]
    noise = float(np.max(np.abs(np.asarray(without) / np.median(without) - 1)) * 100)
    summary = {
        "other_p99_ms": {s: med(s, "other", "p99_ms") for s in runs},
        "other_p50_ms": {s: med(s, "other", "p50_ms") for s in runs},
        "bad_item_p50_ms": {s: med(s, "bad", "p50_ms") for s in runs},
        "bad_item_p99_ms": {s: med(s, "bad", "p99_ms") for s in runs},
        "server_cpu_ms_per_request": {
            s: float(np.median([r["server_cpu_ms_per_request"] for r in runs[s]])) for s in runs
        },
        "noise_p99_pct": noise,
        "non_200": sum(n for rs in runs.values() for r in rs for st, n in r["statuses"].items() if st != 200),
        "bad_candidates_scored_unknown": sum(r["bad_candidates_unknown"] for r in runs["with"]),
        "requests_naming_x_with_bad_row": sum(r["bad"]["requests"] for r in runs["with"]),
        "server_log_lines_about_the_row": len(log_lines),
    }
    summary["p99_ratio"] = summary["other_p99_ms"]["with"] / summary["other_p99_ms"]["without"]
    # each alternation's two runs side by side: a drift of the machine's load over the run cancels out
    summary["paired_p99_ratios"] = [
        w["other"]["p99_ms"] / o["other"]["p99_ms"] for w, o in zip(runs["with"], runs["without"])
    ]
    summary["paired_p99_ratio_median"] = float(np.median(summary["paired_p99_ratios"]))
    summary["p50_ratio"] = summary["other_p50_ms"]["with"] / summary["other_p50_ms"]["without"]
    ok = (
        summary["p99_ratio"] <= RATIO_LIMIT
        and summary["non_200"] == 0
        and (summary["bad_candidates_scored_unknown"] == summary["requests_naming_x_with_bad_row"])
    )
    s = summary
    print(
        f"other items, median of {args.alternations} runs: p99 {s['other_p99_ms']['without']:.2f} ms without the "
        f"bad row, {s['other_p99_ms']['with']:.2f} ms with it: x{s['p99_ratio']:.3f} (p50 x{s['p50_ratio']:.3f}); "
        f"noise: runs without the bad row within +-{noise:.1f}% of their median p99; paired ratios "
        f"{', '.join(f'x{r:.2f}' for r in s['paired_p99_ratios'])} (median x{s['paired_p99_ratio_median']:.3f})"
    )
    print(
        f"requests naming X: p50 {s['bad_item_p50_ms']['without']:.2f} ms with its good row, "
        f"{s['bad_item_p50_ms']['with']:.2f} ms with the bad row (X scored unknown in "
        f"{s['bad_candidates_scored_unknown']} of {s['requests_naming_x_with_bad_row']}); non-200 responses "
        f"{s['non_200']}; server log lines about the row {s['server_log_lines_about_the_row']}"
    )
    print(
        f"acceptance: other items' p99 with / without <= x{RATIO_LIMIT}, all 200, X unknown: {'PASS' if ok else 'FAIL'}"
    )
    report = {
        "summary": summary,
        "runs": runs,
        "acceptance": {"p99_ratio_limit": RATIO_LIMIT, "pass": ok},
        "bad_movie": bad_movie,
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()},
    }
    (out / "feature_bad_row.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "feature_bad_row.png")
    (out / "server.log").unlink(missing_ok=True)
    print(f"wrote {out / 'feature_bad_row.json'} and {out / 'feature_bad_row.png'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

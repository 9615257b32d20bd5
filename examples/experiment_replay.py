"""An online experiment replayed on MovieLens-100k's held-out user-days (`make demo-experiment`).

    python examples/experiment_replay.py --out out/demo-experiment [--figures bench/results/experiment-replay]

1. the data (`offgraph data movielens-100k`), two models of examples/movielens.yaml trained on the same rows
   (`offgraph train --split per-key-time`: each user's latest 20% of ratings held out): **pointwise** (the
   spec's label, rating >= 4) and **listwise** (softmax cross-entropy over each user-day's list), 3 epochs
   each, no validation pass (the demo's budget); exported as versions 1 and 2 of one model, feature tables
   included (the requests send ids only);
2. `offgraph serve` with the served log at rate 1.0 (`--served-log-rate 1 --served-log-dir`), the labels
   ``pointwise`` -> 1 and ``listwise`` -> 2, and an experiment (`offgraph experiment set`) of three arms sticky
   by ``user_id``: ``prior`` (no model: the candidates in the order sent, which is the items' prior order, their
   mean rating over the training rows), ``pointwise`` and ``listwise``, weights 0.34 / 0.33 / 0.33, a fixed salt
   (the same users in the same arms on every run);
3. the replay: one request per held-out user-day (the spec's group ``request_id``), its candidates that day's
   held-out rated movies in the prior order, ids only, through ``offgraph.Client``; the server answers each
   from the user's arm and logs it;
4. the outcome log, from the held-out ratings: a ``click`` for a rating >= 4 (the models' label) and a
   ``play_share`` of (2^(rating - 1) - 1) / 15 for every rating (0 for one star, 1 for five: bench.ltr's graded
   gain 2^grade - 1 scaled into [0, 1], so NDCG is that graded NDCG). The server gives each request its own id
   (the client does not choose it), so each logged candidate is matched to its rating by (user, movie), which a
   MovieLens user rates once;
5. `offgraph experiment report` on the two logs, control ``prior``: printed, and OUT/report.json, .png, .txt
   (copied to ``--figures``).

A step whose output exists is skipped (a second run replays and reports only); ``--fresh`` redoes them all.
The candidates of a request are the movies the user rated that day, so CTR and mean gain are the same for
every arm up to which users each arm holds: the order is what the arms change, and NDCG measures it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offgraph.runtime import install_quiet_tensorflow_import

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "examples" / "movielens.yaml"
MODEL = "movielens"
TOKEN = "demo-experiment-token"
ARMS = (("prior", None, 0.34), ("pointwise", 1, 0.33), ("listwise", 2, 0.33))
"""(arm, the version its label names (None: the prior arm), weight)."""
SALT = "movielens-replay"
"""The experiment's salt: the same users in the same arms on every run."""
CLICK_RATING = 4
"""A click: the models' label, rating >= 4 (examples/movielens.yaml)."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python examples/experiment_replay.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (its steps' outputs are reused when present)")
    p.add_argument("--figures", default=None, help="copy report.json, report.png and report.txt here")
    p.add_argument("--epochs", type=int, default=3, help="training epochs of each model")
    p.add_argument("--draws", type=int, default=1000, help="the report's bootstrap resamples")
    p.add_argument("--fresh", action="store_true", help="redo every step (delete OUT first)")
    return p.parse_args(argv)


def offgraph(*args: str, log: Path) -> None:
    """``offgraph ARGS`` with this interpreter, its output in ``log`` (quiet); its log's tail if it fails."""
    with open(log, "wb") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "offgraph.cli", *args], stdout=f, stderr=subprocess.STDOUT
        ).returncode
    if rc != 0:
        sys.exit(f"offgraph {' '.join(args[:2])} failed ({rc}); {log}:\n{log.read_text(errors='replace')[-3000:]}")


def step(name: str, done: bool, run) -> None:
    """Run a step unless its output exists, saying which and how long it took."""
    if done:
        print(f"{name}: reused")
        return
    t0 = time.perf_counter()
    run()
    print(f"{name}: {time.perf_counter() - t0:.0f} s")


def held_out_requests(data: Path, run: Path) -> tuple[pa.Table, dict[str, list[int]]]:
    """(the held-out rows: user_id, movie_id, request_id, rating; each held-out user-day's movies in the prior
    order: by the movie's mean rating over the training rows, the run's split)."""
    import yaml

    from offgraph.export.run_split import run_held_out_mask
    from offgraph.features.spec import parse_spec

    table = pq.read_table(data, columns=["user_id", "movie_id", "request_id", "rating", "timestamp"])
    held = run_held_out_mask(run, parse_spec(yaml.safe_load((run / "spec.yaml").read_text())), table)
    train, test = table.filter(pa.array(~held)), table.filter(pa.array(held))
    means = train.group_by("movie_id").aggregate([("rating", "mean")])
    means = pa.table({"movie_id": means.column("movie_id"), "prior": means.column("rating_mean")})
    overall = pc.mean(train.column("rating"))
    test = test.join(means, "movie_id", join_type="left outer")  # a movie never rated in training: the overall mean
    test = test.set_column(test.schema.get_field_index("prior"), "prior", test.column("prior").fill_null(overall))
    movie, score = test.column("movie_id").to_numpy(), test.column("prior").to_numpy()
    rid_code, rids = _codes(test.column("request_id"))
    order = np.lexsort((movie, -score, rid_code))  # per user-day: by descending prior, then movie id
    starts = np.r_[0, np.flatnonzero(np.diff(rid_code[order])) + 1]
    requests = {rids[rid_code[order][s]]: ms.tolist() for s, ms in zip(starts, np.split(movie[order], starts[1:]))}
    return test.select(["user_id", "movie_id", "request_id", "rating"]), requests


def _codes(column) -> tuple[np.ndarray, list]:
    enc = pc.dictionary_encode(column.combine_chunks())
    return enc.indices.to_numpy(), enc.dictionary.to_pylist()


def replay(url: str, requests: dict[str, list[int]]) -> dict[str, int]:
    """Each user-day's request, ids only, through the client; {arm: requests it answered}."""
    from tqdm import tqdm

    import offgraph

    answered: dict[str, int] = {}
    with offgraph.Client(url, timeout=60) as client:
        for rid, movies in tqdm(requests.items(), desc="replay", unit="req", mininterval=1.0):
            user = int(rid.partition("-")[0])  # request_id is "<user_id>-<YYYY-MM-DD>" (offgraph.data.movielens)
            out = client.score(MODEL, {"user_id": user}, [{"movie_id": m} for m in movies])
            answered[out.arm or "none"] = answered.get(out.arm or "none", 0) + 1
    return answered


def outcomes_from_ratings(served_dir: Path, held: pa.Table) -> pa.Table:
    """The outcome log: each logged candidate matched to its held-out rating by (user, movie), a click for a
    rating >= 4 and a play_share of (2^(rating - 1) - 1) / 15 for each."""
    from offgraph.experiments.report import json_field
    from offgraph.server.process.served_log_spool import read_served

    served = read_served(served_dir)
    cands = served.column("candidates")
    parent = pc.list_parent_indices(cands)
    logged = pa.table(
        {
            "request_id": served.column("request_id").take(parent),
            "user_id": json_field(served.column("request"), "user_id").take(parent),
            "movie_id": json_field(pc.list_flatten(cands), "movie_id"),
        }
    )
    ratings = pa.table(
        {
            "user_id": held.column("user_id").cast(pa.string()),
            "movie_id": held.column("movie_id").cast(pa.string()),
            "rating": held.column("rating"),
        }
    )
    rated = logged.join(ratings, ["user_id", "movie_id"], join_type="inner")
    rating = rated.column("rating").to_numpy()
    clicks = rated.filter(pa.array(rating >= CLICK_RATING))
    share = (2.0 ** (rating - 1) - 1) / 15
    movie = pc.cast(rated.column("movie_id"), pa.int64())
    return pa.concat_tables(
        [
            pa.table(
                {
                    "request_id": clicks.column("request_id"),
                    "movie_id": pc.cast(clicks.column("movie_id"), pa.int64()),
                    "event": pa.array(["click"] * clicks.num_rows),
                    "value": pa.nulls(clicks.num_rows, pa.float64()),
                }
            ),
            pa.table(
                {
                    "request_id": rated.column("request_id"),
                    "movie_id": movie,
                    "event": pa.array(["play_share"] * rated.num_rows),
                    "value": pa.array(share),
                }
            ),
        ]
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the held-out split's import of the trainer: quiet
    install_quiet_tensorflow_import()
    out = Path(args.out)
    if args.fresh and out.exists():
        shutil.rmtree(out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data = out / "data" / "movielens.parquet"
    step(
        "data",
        data.exists(),
        lambda: offgraph("data", "movielens-100k", "--out", str(data.parent), log=logs / "data.log"),
    )
    runs = {"pointwise": out / "run-pointwise", "listwise": out / "run-listwise"}
    for loss, run in runs.items():
        step(
            f"train {loss}",
            (run / "model.weights.h5").exists(),
            lambda loss=loss, run=run: offgraph(
                "train",
                "--spec",
                str(SPEC),
                "--data",
                str(data),
                "--out",
                str(run),
                "--split",
                "per-key-time",
                "--loss",
                loss,
                "--epochs",
                str(args.epochs),
                "--validation",
                "0",
                "--no-progress",
                log=logs / f"train-{loss}.log",
            ),
        )
    models = out / "models"
    for (loss, run), version in zip(runs.items(), (1, 2)):
        dest = models / MODEL / str(version)
        step(
            f"export {loss} as version {version}",
            (dest / "manifest.json").exists(),
            lambda run=run, dest=dest, loss=loss: offgraph(
                "export",
                "--run",
                str(run),
                "--out",
                str(dest),
                "--quant",
                "fp32",
                "--shards",
                "4",
                "--feature-data",
                str(data),
                "--feature-rows",
                "all",
                log=logs / f"export-{loss}.log",
            ),
        )
    held, requests = held_out_requests(data, runs["pointwise"])
    print(
        f"held-out: {held.num_rows:,} ratings in {len(requests):,} user-days of {len(set(held.column('user_id').to_pylist())):,} users"
    )
    served = out / "served"
    shutil.rmtree(served, ignore_errors=True)
    report_dir = out / "report"
    shutil.rmtree(report_dir, ignore_errors=True)
    report_dir.mkdir()

    from offgraph.client import Client
    from offgraph.testing.harness import ServerProcess, free_port, serve_command

    port = free_port()
    server = ServerProcess(
        serve_command(
            models,
            port,
            "--host",
            "127.0.0.1",
            "--admin-token",
            TOKEN,
            "--served-log-rate",
            "1.0",
            "--served-log-dir",
            str(served),
        ),
        port,
        logs / "serve.log",
    )
    try:
        t0 = time.perf_counter()
        server.wait_ready(180)
        with Client(server.url, admin_token=TOKEN) as c:
            for arm, version, _ in ARMS:
                if version is not None:
                    c.set_label(MODEL, arm, version)
        arm_flags = [f"--arm={'prior' if v is None else f'label={a}'}:{w}" for a, v, w in ARMS]
        offgraph(
            "experiment",
            "set",
            "--url",
            server.url,
            "--model",
            MODEL,
            "--admin-token",
            TOKEN,
            "--sticky-key",
            "user_id",
            "--salt",
            SALT,
            *arm_flags,
            log=logs / "experiment-set.log",
        )
        print(
            f"serve, labels and experiment ({', '.join(f'{a} {w}' for a, _, w in ARMS)}): {time.perf_counter() - t0:.0f} s"
        )
        t0 = time.perf_counter()
        answered = replay(server.url, requests)
        took = time.perf_counter() - t0
        print(
            f"replay: {sum(answered.values()):,} requests in {took:.0f} s ({', '.join(f'{a} {n:,}' for a, n in sorted(answered.items()))})"
        )
    finally:
        rc = server.stop(60)  # SIGTERM: the served log writes what it holds before the process exits
    if rc not in (0, None):
        sys.exit(f"offgraph serve exited {rc}; {logs / 'serve.log'}")
    outcomes = report_dir / "outcomes.parquet"
    pq.write_table(outcomes_from_ratings(served, held), outcomes)
    offgraph(
        "experiment",
        "report",
        "--served",
        str(served),
        "--outcomes",
        str(outcomes),
        "--models",
        str(models),
        "--control",
        "prior",
        "--draws",
        str(args.draws),
        "--json",
        str(report_dir / "report.json"),
        "--png",
        str(report_dir / "report.png"),
        log=report_dir / "report.txt",
    )
    print()
    print((report_dir / "report.txt").read_text().rstrip())
    print(
        f"\n{report_dir}: report.txt, report.json, report.png, outcomes.parquet; {time.perf_counter() - t_start:.0f} s in all"
    )
    if args.figures:
        figures = Path(args.figures)
        figures.mkdir(parents=True, exist_ok=True)
        for name in ("report.txt", "report.json", "report.png"):
            shutil.copyfile(report_dir / name, figures / name)
        print(f"copied to {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

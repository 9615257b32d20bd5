"""`python examples/demo_request.py`: start `offgraph serve` on loopback, score one real
MovieLens request over HTTP with `offgraph.Client` in its ids-only form (the server joins the user
and movie features from its feature tables), check it against the same request with every feature
sent, print it, stop the server (the serving step of `make demo`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pyarrow.parquet as pq

import offgraph
from offgraph.client import ApiError
from offgraph.testing.harness import NotReady, free_port, wait_ready


def real_request(data: str, n: int) -> dict:
    """The first request group's user features + the items of that user's next n ratings."""
    t = pq.read_table(data).to_pylist()
    first = t[0]
    user = {k: first[k] for k in ("user_id", "age", "gender", "occupation", "zip_prefix")}
    items = [
        {k: r[k] for k in ("movie_id", "genres", "title_words", "release_year")}
        for r in t
        if r["user_id"] == first["user_id"]
    ][:n]
    return {"request": user, "candidates": items}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", required=True)
    ap.add_argument("--model", default="movielens")
    ap.add_argument("--data", required=True)
    ap.add_argument("--candidates", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "serve",
            "--models",
            args.models,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(base, args.timeout, server)
        except NotReady as e:
            print(e, file=sys.stderr)
            return 1
        with offgraph.Client(base) as client:
            full = real_request(args.data, args.candidates)
            ids = {
                "request": {"user_id": full["request"]["user_id"]},
                "candidates": [{"movie_id": c["movie_id"]} for c in full["candidates"]],
            }
            try:
                out = client.score(args.model, **ids)
            except ApiError as e:
                print(f"POST {base}/v1/models/{args.model}:score -> {e}", file=sys.stderr)
                return 1
            print(f"POST {base}/v1/models/{args.model}:score -> 200")
            print("ids-only body:", json.dumps(ids))
            for cand, score in zip(full["candidates"], out.scores):
                print(f"  movie {cand['movie_id']:>5}  {score:.4f}  {' '.join(cand['title_words'])}")
            print(f"model {out.model} version {out.version}, unknown candidates {out.unknown_candidates}")
            same = client.score(args.model, **full).scores == out.scores
            print(
                f"the same request with every feature sent ({len(json.dumps(full))} bytes instead of "
                f"{len(json.dumps(ids))}): {'identical scores' if same else 'DIFFERENT scores'}"
            )
            return 0 if same else 1
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())

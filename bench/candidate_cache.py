"""The candidate cache in process (offgraph/scoring/candidate_cache.py): one scorer, N = 1000 MovieLens bodies parsed
as the score route parses them (``ScoreBodyParser``), alternated between candidates given decoded (the library's
dicts: every candidate joined and keyed, nothing held, as before the cache) and the route's candidates as sent
(through the candidate cache while its gate says so); then bodies whose candidates never repeat (each carries a
per-request value), once the cache is full. Medians over the bodies, each round.

    python -m bench.candidate_cache --model MODELS/NAME/VERSION --data movielens.parquet --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="an exported version directory")
    ap.add_argument("--data", required=True, help="MovieLens parquet (offgraph data movielens-100k)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from offgraph.server.process.compute_threads import configure_tf_threads

    configure_tf_threads(1, 1)
    from bench.lib.bodies import build_bodies
    from offgraph.scoring.scorer import Scorer
    from offgraph.server.api.schemas import ScoreRequest
    from offgraph.server.api.score_body import ScoreBodyParser

    n = args.n
    bodies = build_bodies(Path(args.data), [n], 64, 0)[n]
    parser = ScoreBodyParser(ScoreRequest, 2000)
    plain, raw = "dicts", "raw"
    s = Scorer(args.model, row_cache_mb=256, item_cache_size=10_000)

    def run(kind, body):
        b = parser.validate(body)
        return s.score(b.request, list(b.candidates) if kind == plain else b.candidates)

    for b in bodies:  # parity, and every catalog item held
        assert np.array_equal(run(plain, b), run(raw, b))

    def median_ms(parser, bs) -> float:
        ts = []
        for b in bs:
            t0 = time.perf_counter()
            run(parser, b)
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts) * 1e3)

    out: dict = {"n": n, "repeated": [], "never_repeating": []}
    for r in range(args.rounds):
        first, second = (plain, raw) if r % 2 == 0 else (raw, plain)
        a, b = median_ms(first, bodies), median_ms(second, bodies)
        d, c = (a, b) if first is plain else (b, a)
        out["repeated"].append({"dict_ms": d, "cache_ms": c})
        print(f"round {r + 1}: repeated candidates   dict path {d:6.2f} ms  cache path {c:6.2f} ms  ratio {c / d:.2f}")
    dec = [json.loads(b) for b in bodies]
    count = [0]

    def unique(k: int) -> bytes:
        body = dec[k % len(dec)]
        count[0] += 1
        cands = [{**c, "rt": count[0] * 100_000 + i} for i, c in enumerate(body["candidates"])]
        return json.dumps({"request": body["request"], "candidates": cands}).encode()

    for k in range(40):  # fill the cache with candidates that never come back
        run(raw, unique(k))
    for r in range(args.rounds):
        d = median_ms(plain, [unique(k) for k in range(40)])
        c = median_ms(raw, [unique(k) for k in range(40)])
        out["never_repeating"].append({"dict_ms": d, "cache_ms": c})
        print(f"round {r + 1}: never-repeating       dict path {d:6.2f} ms  cache path {c:6.2f} ms  ratio {c / d:.2f}")
    for k in ("repeated", "never_repeating"):
        out[f"{k}_median_ratio"] = float(np.median([x["cache_ms"] / x["dict_ms"] for x in out[k]]))
    out["candidate_cache"] = {"hits": s.candidates.hits, "misses": s.candidates.misses, "bytes": s.candidates.nbytes}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "candidate_cache.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k.endswith("ratio")}))
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

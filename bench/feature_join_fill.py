"""The feature join alone: ``FeatureJoin.fill`` ms per request, unprofiled, for full and ids-only bodies.

The bodies are real MovieLens requests (``bench.serve_latency.build_bodies``: a real user x N real movies)
and their ids-only form (``bench.lib.bodies.ids_only_bodies``); each form is filled once to warm,
then ``--runs`` times over its bodies (``--cycles`` passes each). Prints the median per-request time of
each run's median, and the spread of the runs.

    python -m bench.feature_join_fill --version-dir MODELS/NAME/VERSION --data movielens.parquet --n 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.lib.bodies import build_bodies, ids_only_bodies


def fill_ms(version_dir: Path, data: Path, n: int, bodies: int, runs: int, cycles: int, seed: int = 0) -> dict:
    """``{form: {"median_ms", "min_ms", "max_ms"}}`` over ``runs`` runs of per-request medians."""
    from offgraph.feature_tables.join import FeatureJoin
    from offgraph.modeldir.version import ModelVersion

    spec = ModelVersion.open(version_dir, verify_dense=False).spec
    full = build_bodies(data, [n], bodies, seed)[n]
    forms = {"full": full, "ids-only": ids_only_bodies(spec, full)}
    join = FeatureJoin(version_dir, spec)
    out = {}
    try:
        for form, raw in forms.items():
            reqs = [json.loads(b) for b in raw]
            for r in reqs:
                join.fill(r["request"], r["candidates"])
            meds = []
            for _ in range(runs):
                ts = []
                for r in reqs * cycles:
                    t0 = time.perf_counter()
                    join.fill(r["request"], r["candidates"])
                    ts.append(time.perf_counter() - t0)
                meds.append(statistics.median(ts) * 1e3)
            out[form] = {"median_ms": statistics.median(meds), "min_ms": min(meds), "max_ms": max(meds)}
    finally:
        join.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version-dir", required=True, help="a model version whose spec declares feature tables")
    ap.add_argument("--data", required=True, help="MovieLens flat table (offgraph data movielens-100k)")
    ap.add_argument("--n", type=int, default=1000, help="candidates per request")
    ap.add_argument("--bodies", type=int, default=20, help="distinct requests per form")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cycles", type=int, default=3, help="passes over the bodies per run")
    a = ap.parse_args(argv)
    res = fill_ms(Path(a.version_dir), Path(a.data), a.n, a.bodies, a.runs, a.cycles)
    for form, r in res.items():
        print(
            f"{form}: fill {r['median_ms']:.3f} ms/request median (runs {r['min_ms']:.3f}..{r['max_ms']:.3f}), N={a.n}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

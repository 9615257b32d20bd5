"""Where one request's time goes inside a server process: the phases of the library scorer, in process.

The bodies are decoded as the server decodes them (``ScoreBodyParser``), then scored by
``Scorer.score_joined`` (the feature join, FG, keys, store/cache reads, pooling, the TensorFlow call,
calibration). Each body of a list is scored in turn (distinct requests, as the HTTP cells send). The
phases are attributed with cProfile, by the cumulative time of the functions that carry them, matched
by file and function name so that a phase the scorer no longer has reads as absent rather than failing;
the profiled total and the unprofiled median are both given (cProfile adds per-call overhead, so the
phases are shares of the profiled total). The functions with the most own time come with them.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import time
from pathlib import Path

import numpy as np

# phase -> (file name, function name) of the calls whose cumulative time is that phase
PHASES: dict[str, tuple[str, str]] = {
    "feature_join": ("feature_join.py", "fill"),
    "fg": ("fg.py", "transform"),
    "keys": ("batch.py", "batch_keys"),
    "store_read": ("batch.py", "read_through_cache"),
    "pool": ("batch.py", "pool_batch"),
    "dense_tf": ("scorer.py", "dense"),
    "calibrate": ("calibration.py", "calibrate"),
}
TOTAL = ("scorer.py", "score_joined")


def _cumulative(stats: pstats.Stats, where: tuple[str, str]) -> float | None:
    """Cumulative seconds of the calls to ``where``, outermost calls only (pstats' cumtime excludes recursion)."""
    found = [v[3] for (path, _, func), v in stats.stats.items() if func == where[1] and path.endswith(where[0])]  # type: ignore[attr-defined]
    return sum(found) if found else None


def decode_ms(bodies: list[bytes], repeats: int) -> float:
    """Median ms of decoding a body as the server does."""
    from offgraph.server.schemas import ScoreRequest
    from offgraph.server.score_body import ScoreBodyParser

    parser = ScoreBodyParser(ScoreRequest, max(len(json.loads(b)["candidates"]) for b in bodies))
    ts = []
    for i in range(repeats):
        t0 = time.perf_counter()
        parser.validate(bodies[i % len(bodies)])
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def breakdown(model_dir: Path, bodies: list[bytes], repeats: int, row_cache_mb: float, intra: int, inter: int) -> dict:
    """Phases (ms per request) of ``repeats`` requests cycling through ``bodies``, after one warm pass."""
    from offgraph.server.tf_threads import configure_tf_threads

    configure_tf_threads(intra, inter)  # as the servers
    from offgraph.scoring.scorer import load

    reqs = [json.loads(b) for b in bodies]
    s = load(model_dir, row_cache_mb=row_cache_mb)
    try:
        for r in reqs:  # warm: item cache, row cache, TF
            s.score_joined(r["request"], r["candidates"])
        wall = []
        for i in range(repeats):
            r = reqs[i % len(reqs)]
            t0 = time.perf_counter()
            s.score_joined(r["request"], r["candidates"])
            wall.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(repeats):
            r = reqs[i % len(reqs)]
            s.score_joined(r["request"], r["candidates"])
        prof.disable()
    finally:
        s.close()
    stats = pstats.Stats(prof)
    per = 1e3 / repeats
    total = (_cumulative(stats, TOTAL) or 0.0) * per
    phases = {k: (None if (v := _cumulative(stats, w)) is None else v * per) for k, w in PHASES.items()}
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]  # type: ignore[attr-defined]
    return {
        "decode_ms": decode_ms(bodies, repeats),
        "score_unprofiled_median_ms": float(np.median(wall) * 1e3),
        "score_profiled_ms": total,
        "phases_profiled_ms": phases,
        "other_profiled_ms": total - sum(v for v in phases.values() if v is not None),
        "top_own_time_ms": [
            {"function": f"{Path(path).name}:{line}({func})", "ms": v[2] * per, "calls_per_request": v[1] / repeats}
            for (path, line, func), v in top
        ],
        "requests": repeats,
        "distinct_bodies": len(bodies),
    }


def breakdown_lines(label: str, b: dict) -> list[str]:
    if "error" in b:
        return [f"  {label}: {b['error']}"]
    phases = ", ".join(f"{k} {'-' if v is None else f'{v:.2f}'}" for k, v in b["phases_profiled_ms"].items())
    top = ", ".join(f"{t['function']} {t['ms']:.2f}" for t in b["top_own_time_ms"][:6])
    return [
        f"  {label}: decode {b['decode_ms']:.2f} ms; score {b['score_unprofiled_median_ms']:.2f} ms median "
        f"({b['score_profiled_ms']:.2f} profiled, over {b['distinct_bodies']} distinct bodies)",
        f"    phases (profiled ms/request): {phases}, other {b['other_profiled_ms']:.2f}",
        f"    most own time (ms/request): {top}",
    ]

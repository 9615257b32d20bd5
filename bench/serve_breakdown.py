"""Where one request's time goes inside a server process: the phases of the library scorer, in process.

Each body is parsed before each call as the checkout's score route parses it (``RawScoreBodyParser``:
the candidates as sent, through the scorer's candidate cache; in a checkout without it, decoded by
``ScoreBodyParser``), then scored by ``Scorer.score_joined`` (the candidate cache, the feature join, FG,
keys, store/cache reads, pooling, the TensorFlow call, calibration); the parse is timed apart (``decode``).
Each body of a list is scored in turn (distinct requests, as the HTTP cells send), after two warm passes. The
phases are attributed with cProfile, by the cumulative time of the functions that carry them, matched
by file and function name so that a phase the scorer no longer has reads as absent rather than failing;
the profiled total and the unprofiled median are both given (cProfile adds per-call overhead, so the
phases are shares of the profiled total). The functions with the most own time come with them.

``bench.lib.breakdown.run_breakdown`` runs this file as a script in a child process from a checkout's directory with that
directory first on the path (:func:`breakdown` imports that checkout's scorer, in the package layout or
in the old one of top-level ``server`` and ``features``), so that old and new code are broken down
alike and TensorFlow's thread settings stay out of the caller. It imports nothing of ``bench`` for that reason:
an old checkout has no ``bench.lib``.

    python bench/serve_breakdown.py --model-dir MODELS/NAME --bodies BODIES.jsonl --out OUT.json \
        [--grpc MESSAGES.json]

With ``--grpc`` (serialized ``ModelInferRequest`` / ``PredictRequest`` messages of the same candidates, by protocol:
``{"kserve": [base64, ...], "tfserving": [...]}``), the named-tensor path of each protocol is timed per request
too, unprofiled (medians, after two warm passes), in the phases its gRPC handler runs: ``parse`` (the message),
``tensors`` (its inputs as the server's ``Tensor`` s), ``convert`` (``predict_scoring.score_tensors`` less the
score: the wire keys or columns, the request-scope split) and ``score`` (``Scorer.score_joined``), beside the same
split of REST ``:score`` (``parse``: the body; ``score``). A checkout without the gRPC services says so.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import importlib
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

# phase -> (file names, function name) of the calls whose cumulative time is that phase
PHASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "candidate_cache": (("candidate_cache.py",), ("lookup",)),
    "feature_join": (("feature_join.py", "join.py"), ("fill",)),
    "fg": (("fg.py",), ("transform", "transform_entries", "candidate_entries")),
    "keys": (("batch.py", "scorer_impl.py"), ("batch_keys",)),
    "store_read": (("batch.py", "scorer_impl.py"), ("read_through_cache",)),
    # the request path calls one of the pool functions (the later name is the newer code's, which calls no older one)
    "pool": (("batch.py", "scorer_impl.py"), ("pool_batch", "pool_segments", "pool_rows")),
    "dense_tf": (("scorer.py",), ("dense", "_dense_segments")),
    "calibrate": (("calibration.py",), ("calibrate",)),
}
TOTAL = (("scorer.py",), ("score_joined",))
# module of each part, in the package layout and in the old one
MODULES = {
    "scorer": ("offgraph.scoring.scorer", "server.scorer"),
    "schemas": ("offgraph.server.api.schemas", "server.schemas"),
    "score_body": ("offgraph.server.api.score_body", "server.score_body"),
    "threads": ("offgraph.server.process.compute_threads", "server.tf_threads"),
}


def _module(part: str, code: str):
    """``part``'s module in layout ``code`` ("package", or "old": the top-level ``server`` and ``features``), chosen
    by the checkout, never by what imports: the installed package imports from an old checkout too."""
    return importlib.import_module(MODULES[part][code == "old"])


def _cumulative(stats: pstats.Stats, where: tuple[tuple[str, ...], tuple[str, ...]]) -> float | None:
    """Cumulative seconds of the calls to ``where``, outermost calls only (pstats' cumtime excludes recursion)."""
    files, names = where
    found = [v[3] for (path, _, func), v in stats.stats.items() if func in names and Path(path).name in files]  # type: ignore[attr-defined]
    return sum(found) if found else None


def threads_as_the_servers(intra: int | None, inter: int | None, code: str) -> None:
    """TensorFlow's pools as given, and NumPy's BLAS at the one thread ``offgraph serve`` sets (a checkout from
    before ``--blas-threads`` leaves OpenBLAS as it loaded, as its server did)."""
    try:
        mod = _module("threads", code)
    except ModuleNotFoundError:  # a package checkout from before the module's rename
        mod = importlib.import_module("offgraph.server.process.tf_threads")
    mod.configure_tf_threads(intra, inter)
    if hasattr(mod, "configure_blas_threads"):
        mod.configure_blas_threads(1)


def route_parser(bodies: list[bytes], code: str = "package"):
    """The parser of the checkout's score route: ``RawScoreBodyParser`` where it has one, else ``ScoreBodyParser``."""
    mod = _module("score_body", code)
    cls = getattr(mod, "RawScoreBodyParser", None) or mod.ScoreBodyParser
    return cls(_module("schemas", code).ScoreRequest, max(len(json.loads(b)["candidates"]) for b in bodies))


def decode_ms(bodies: list[bytes], repeats: int, code: str = "package") -> float:
    """Median ms of parsing a body as the checkout's score route does."""
    parser = route_parser(bodies, code)
    ts = []
    for i in range(repeats):
        t0 = time.perf_counter()
        parser.validate(bodies[i % len(bodies)])
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def breakdown(
    model_dir: Path,
    bodies: list[bytes],
    repeats: int,
    row_cache_mb: float,
    intra: int,
    inter: int,
    code: str = "package",
) -> dict:
    """Phases (ms per request) of ``repeats`` requests cycling through ``bodies``, after two warm passes."""
    threads_as_the_servers(intra, inter, code)
    load = _module("scorer", code).load
    parse = route_parser(bodies, code).validate
    s = load(model_dir, row_cache_mb=row_cache_mb)
    try:
        for _ in range(2):  # warm: candidate cache, item cache, row cache, TF
            for raw in bodies:
                r = parse(raw)
                s.score_joined(r.request, r.candidates)
        wall = []
        for i in range(repeats):
            r = parse(bodies[i % len(bodies)])
            t0 = time.perf_counter()
            s.score_joined(r.request, r.candidates)
            wall.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        for i in range(repeats):
            r = parse(bodies[i % len(bodies)])
            prof.enable()
            s.score_joined(r.request, r.candidates)
            prof.disable()
    finally:
        s.close()
    stats = pstats.Stats(prof)
    per = 1e3 / repeats
    total = (_cumulative(stats, TOTAL) or 0.0) * per
    phases = {k: (None if (v := _cumulative(stats, w)) is None else v * per) for k, w in PHASES.items()}
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]  # type: ignore[attr-defined]
    return {
        "decode_ms": decode_ms(bodies, repeats, code),
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


def _median_ms(xs: list[float]) -> float:
    return float(np.median(xs) * 1e3)


def tensor_phases(
    model_dir: Path,
    bodies: list[bytes],
    messages: dict[str, list[bytes]],
    repeats: int,
    row_cache_mb: float,
    intra: int,
    inter: int,
) -> dict:
    """Per-request phases (ms, medians) of REST ``:score`` and of each protocol's named-tensor path (the module's
    docstring), on one scorer, the protocols taking turns over the same candidates."""
    try:
        from tensorflow_serving.apis import predict_pb2
        from tritonclient.grpc import service_pb2

        from offgraph.server.api.predict_scoring import score_tensors
        from offgraph.server.grpc.kserve import tensors_of
        from offgraph.server.grpc.tfserving import tensor_of
    except ImportError as e:
        return {"error": f"no named-tensor path in this checkout ({e})"}
    threads_as_the_servers(intra, inter, "package")
    s = _module("scorer", "package").load(model_dir, row_cache_mb=row_cache_mb)
    parse = route_parser(bodies).validate
    times: dict[str, dict[str, list[float]]] = {}

    class _Holder:  # the registry's ModelHolder as score_tensors uses it, on the one scorer; times the score
        class _Served:
            scorer = s

        def acquire(self, version, label):
            return self._Served

        def peek(self, version, label):
            return self._Served

        def release(self, sv):
            pass

        def score(self, request, candidates, version, label):
            t0 = time.perf_counter()
            scores, joined = s.score_joined(request, candidates)
            self.score_s = time.perf_counter() - t0
            return 1, scores, joined, None

    holder = _Holder()
    decoders = {
        "kserve": (service_pb2.ModelInferRequest.FromString, tensors_of),
        "tfserving": (predict_pb2.PredictRequest.FromString, lambda r: [tensor_of(k, t) for k, t in r.inputs.items()]),
    }

    def rest(i: int, into: dict[str, list[float]] | None) -> None:
        t0 = time.perf_counter()
        r = parse(bodies[i % len(bodies)])
        t1 = time.perf_counter()
        s.score_joined(r.request, r.candidates)
        if into is not None:
            into.setdefault("parse", []).append(t1 - t0)
            into.setdefault("score", []).append(time.perf_counter() - t1)

    def tensor(protocol: str, i: int, into: dict[str, list[float]] | None) -> None:
        decode, tensors = decoders[protocol]
        msgs = messages[protocol]
        t0 = time.perf_counter()
        m = decode(msgs[i % len(msgs)])
        t1 = time.perf_counter()
        ts = tensors(m)
        t2 = time.perf_counter()
        score_tensors(holder, ts, None, None, 1 << 30)
        t3 = time.perf_counter()
        if into is not None:
            into.setdefault("parse", []).append(t1 - t0)
            into.setdefault("tensors", []).append(t2 - t1)
            into.setdefault("convert", []).append(t3 - t2 - holder.score_s)
            into.setdefault("score", []).append(holder.score_s)

    runs = {"rest": lambda i, into: rest(i, into)}
    runs.update({p: (lambda i, into, p=p: tensor(p, i, into)) for p in messages if p in decoders})
    try:
        for _ in range(2):  # warm: the candidate cache (one per key form), the row cache, TF
            for i in range(len(bodies)):
                for run in runs.values():
                    run(i, None)
        for i in range(repeats):
            for name, run in runs.items():
                run(i, times.setdefault(name, {}))
    finally:
        s.close()
    out = {}
    for name, phases in times.items():
        med = {k: _median_ms(v) for k, v in phases.items()}
        total = _median_ms([sum(x) for x in zip(*phases.values())])
        out[name] = {**med, "total": total}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="a model directory (its newest version) or a version")
    ap.add_argument("--bodies", required=True, help="score bodies, one JSON object a line")
    ap.add_argument("--out", required=True, help="where the breakdown's JSON goes")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--layout", choices=["package", "old"], default="package", help="the checkout's layout")
    ap.add_argument("--row-cache-mb", type=float, default=256.0)
    ap.add_argument("--intra-threads", type=int, default=1)
    ap.add_argument("--inter-threads", type=int, default=1)
    ap.add_argument("--grpc", default=None, help="JSON of serialized gRPC messages by protocol (base64)")
    a = ap.parse_args(argv)
    bodies = [b for b in Path(a.bodies).read_bytes().split(b"\n") if b]
    b = breakdown(Path(a.model_dir), bodies, a.repeats, a.row_cache_mb, a.intra_threads, a.inter_threads, a.layout)
    if a.grpc is not None and a.layout == "package":
        messages = {p: [base64.b64decode(m) for m in ms] for p, ms in json.loads(Path(a.grpc).read_text()).items()}
        b["per_request_ms"] = tensor_phases(
            Path(a.model_dir), bodies, messages, a.repeats, a.row_cache_mb, a.intra_threads, a.inter_threads
        )
    Path(a.out).write_text(json.dumps(b, indent=2))
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent  # run as a script: bench/ must not shadow the checkout's modules
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    raise SystemExit(main())

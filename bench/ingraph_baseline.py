"""The IN-GRAPH baseline of the serving benchmark: the trained full Keras DeepFM (embedding tables
inside the graph) exported as ONE SavedModel that takes padded row ids + masks, fed by the same
FG, behind the same kind of FastAPI endpoint as ``offgraph serve``.

    python -m bench.ingraph_baseline --run RUN --export-dir DIR --port 8501

``POST /v1/models/{name}:score`` takes and answers exactly what the offgraph server does
(``offgraph.server.api.schemas.ScoreRequest`` / ``ScoreResponse``, bodies parsed by the same
``offgraph.server.api.score_body.ScoreBodyParser``); the request path is
FG (``FeatureGenerator.transform``, with the same per-item cache) -> padded ids/masks
(request fields tiled to N rows) -> one SavedModel call (gather + pool + FM + MLP in TF)
-> calibration, in a bounded thread pool. Only the name in the path is not checked.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request

from offgraph.server.api.schemas import ScoreRequest, ScoreResponse
from offgraph.server.api.score_body import ScoreBodyParser

SIGNATURE = "serving_default"
MAX_VALUES_PER_FIELD = 64  # as offgraph.model.inputs pads for training


def export_ingraph(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Save the run's full Keras model as a SavedModel: ids_<i> int32 [N, L_i], mask_<i> float32 [N, L_i] -> ctr."""
    import tensorflow as tf
    from keras import ops

    from offgraph.model.model import load_run

    out = Path(out_dir)
    if (out / "saved_model.pb").exists():
        return out
    model, spec, _ = load_run(run_dir)
    sig = {}
    for i, f in enumerate(spec.fields):
        dtype = tf.int32 if f.rows < 2**31 else tf.int64
        sig[f"ids_{i}"] = tf.TensorSpec([None, None], dtype, name=f"ids_{i}")
        sig[f"mask_{i}"] = tf.TensorSpec([None, None], tf.float32, name=f"mask_{i}")

    class InGraph(tf.Module):
        def __init__(self):
            super().__init__(name="offgraph_ingraph")
            self.model = model

            @tf.function(input_signature=[sig])
            def serve(x):
                logit, _ = self.model.logit_and_l2(x, training=False)
                return {"ctr": ops.sigmoid(logit)}

            self.serve = serve

    module = InGraph()
    tmp = out.with_name(out.name + ".tmp")
    tf.saved_model.save(module, str(tmp), signatures={SIGNATURE: module.serve})
    os.replace(tmp, out)
    return out


class InGraphScorer:
    """FG -> padded ids/masks -> the in-graph SavedModel -> calibration. Thread-safe like ``Scorer``."""

    def __init__(self, run_dir: str | Path, saved_model: str | Path, item_cache_size: int = 100_000):
        import tensorflow as tf

        from offgraph.features.fg import FeatureGenerator
        from offgraph.features.spec import load_spec

        self.spec = load_spec(Path(run_dir) / "spec.yaml")
        self.fg = FeatureGenerator(self.spec, item_cache_size=item_cache_size)
        self._fg_lock = threading.Lock()
        self._loaded = tf.saved_model.load(str(saved_model))
        self._serve = self._loaded.signatures[SIGNATURE]
        self._dtypes = [np.int32 if f.rows < 2**31 else np.int64 for f in self.spec.fields]
        self._tf = tf

    def inputs(self, request, candidates) -> dict[str, np.ndarray]:
        with self._fg_lock:
            batch = self.fg.transform(request, candidates)
        n = batch.n
        x = {}
        for i, (rag, bcast) in enumerate(zip(batch.fields, batch.broadcast)):
            L = min(int(rag.lengths.max(initial=1)), MAX_VALUES_PER_FIELD)
            ids, mask = rag.padded(L)
            if bcast:  # a request field: the same ids on every row, as an in-graph model is fed
                ids, mask = np.repeat(ids, n, axis=0), np.repeat(mask, n, axis=0)
            x[f"ids_{i}"] = ids.astype(self._dtypes[i])
            x[f"mask_{i}"] = mask
        return x

    def score(self, request, candidates) -> np.ndarray:
        from offgraph.calibration import calibrate

        if len(candidates) == 0:
            return np.zeros(0, np.float32)
        tf = self._tf
        x = self.inputs(request, candidates)
        out = self._serve(**{k: tf.constant(v) for k, v in x.items()})
        return calibrate(out["ctr"].numpy(), self.spec.model.calibration)


def create_baseline_app(scorer: InGraphScorer, score_threads: int, max_candidates: int = 2000) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pool = ThreadPoolExecutor(max_workers=score_threads, thread_name_prefix="ingraph-score")
        try:
            yield {"pool": pool}
        finally:
            pool.shutdown(wait=True)

    app = FastAPI(title="offgraph in-graph baseline", lifespan=lifespan)
    parser = ScoreBodyParser(ScoreRequest, max_candidates)

    async def score_body(request: Request) -> Any:
        return await parser.parse(request)

    @app.post("/v1/models/{name}:score")
    async def score(name: str, request: Request, body: Any = Depends(score_body)) -> ScoreResponse:
        if len(body.candidates) > max_candidates:
            raise HTTPException(422, f"at most {max_candidates} candidates")
        scores = await asyncio.get_running_loop().run_in_executor(
            request.state.pool, scorer.score, body.request, body.candidates
        )
        return ScoreResponse(model=name, version=0, scores=scores.tolist())

    @app.get("/readyz")
    async def readyz() -> dict:
        return {"ready": True}

    return app


def _serve(run: str, export_dir: str, host: str, port: int, score_threads: int, intra: int, inter: int) -> None:
    """One server process (the only one, or a worker of several): load, warm up, serve."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from offgraph.server.process.compute_threads import configure_tf_threads

    configure_tf_threads(intra, inter)
    scorer = InGraphScorer(run, export_ingraph(run, export_dir))
    warm = [{c: None for c in scorer.spec.raw_inputs("item")}] * 200
    for n in (1, 16, 200):
        scorer.score({}, warm[:n])
    app = create_baseline_app(scorer, score_threads)
    from offgraph.server.process.gc_tuning import tune_gc
    from offgraph.server.process.workers import reuseport_socket, serve_on

    tune_gc()  # the same GC settings as offgraph serve
    serve_on(app, reuseport_socket(host, port), "warning")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="run directory (offgraph train)")
    p.add_argument("--export-dir", required=True, help="where the in-graph SavedModel is (or is written)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--intra-threads", type=int, default=1)
    p.add_argument("--inter-threads", type=int, default=1)
    p.add_argument("--score-threads", type=int, default=2)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes on the port (SO_REUSEPORT), as offgraph serve --workers",
    )
    args = p.parse_args(argv)
    from offgraph.server.process.workers import check_port_free

    check_port_free(args.host, args.port)
    serve_args = (
        args.run,
        args.export_dir,
        args.host,
        args.port,
        args.score_threads,
        args.intra_threads,
        args.inter_threads,
    )
    if args.workers <= 1:
        _serve(*serve_args)
        return 0
    import multiprocessing
    import signal

    export_ingraph(args.run, args.export_dir)  # once, before the workers read it (this process does not serve)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_serve, args=serve_args) for _ in range(args.workers)]
    for w in procs:
        w.start()
    signal.signal(signal.SIGTERM, lambda *_: [w.terminate() for w in procs])
    for w in procs:
        w.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

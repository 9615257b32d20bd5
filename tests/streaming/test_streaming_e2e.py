"""End to end: a delta file in the spool -> `offgraph update` (process) -> the live store ->
`offgraph serve` (process, follower + row cache) -> the HTTP score equals the score
recomputed by hand from the new row and the dense SavedModel."""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from scorer_parts import DenseHead, pooled
from server_helpers import serve_process

from offgraph.calibration import calibrate
from offgraph.export.export import export_run
from offgraph.features.hashing import row_of
from offgraph.scoring.scorer import Scorer
from offgraph.streaming.deltas import publish_delta
from offgraph.testing.harness import wait_ready

REPO = Path(__file__).resolve().parents[2]
REQUEST = {"user_id": 7, "age": 30, "gender": "F", "occupation": "writer", "zip_prefix": "941"}
CANDS = [
    {"movie_id": 50, "genres": ["Action", "Sci-Fi"], "title_words": ["star", "wars"]},
    {"movie_id": 181, "genres": ["Action"]},
    {"movie_id": 1},
]


def _start(args, log: Path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, "-m", "offgraph.cli", *args],
        cwd=REPO,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def _scores(client) -> list[float]:
    r = client.post("/v1/models/ml:score", json={"request": REQUEST, "candidates": CANDS})
    assert r.status_code == 200, r.text
    return r.json()["scores"]


def test_delta_file_changes_the_served_score_exactly_as_recomputed_by_hand(small_run, tmp_path):
    models, spool = tmp_path / "models", tmp_path / "spool"
    vdir = models / "ml" / "1"
    export_run(small_run[0], vdir, shards=2, quant="fp32", progress=False)
    with Scorer(vdir) as ref:  # before the update: pooled inputs of the dense model
        emb, fo, _ = pooled(ref, REQUEST, CANDS)
        spec = ref.spec
    f = spec.field_index("user_id")
    row = row_of(REQUEST["user_id"], spec.model.hash, spec.fields[f].rows)
    v = np.random.default_rng(3).normal(0, 0.2, 16).astype(np.float32)
    w = np.float32(0.75)
    emb[:, f, :] = v  # user_id is single-valued: its pooled vector is the row itself
    fo[:, f] = w
    expected = calibrate(DenseHead(vdir)(emb, fo), spec.model.calibration)

    server, url = serve_process(models, tmp_path / "serve.log", "--follow-seconds", "0.1", "--log-level", "warning")
    port = int(url.rsplit(":", 1)[1])
    updater = _start(
        ["update", "--models", str(models), "--model", "ml", "--source", f"spool:{spool}"], tmp_path / "update.log"
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", 120, server, log=str(tmp_path / "serve.log"))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            before = _scores(client)
            assert not np.allclose(before, expected, atol=1e-6)
            publish_delta(
                spool,
                model="ml",
                model_version=1,
                table_ids=[f],
                rows=[row],
                vectors=v[None, :],
                first_order=[w],
                seqs=[1],
                event_time_ms=int(time.time() * 1000),
            )
            deadline = time.monotonic() + 60
            got = before
            while np.allclose(got, before, atol=0, rtol=0) and time.monotonic() < deadline:
                assert updater.poll() is None, (tmp_path / "update.log").read_text()[-2000:]
                time.sleep(0.05)
                got = _scores(client)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    finally:
        for p in (updater, server):
            p.terminate()
        for p in (updater, server):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()

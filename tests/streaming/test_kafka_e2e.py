"""End to end over a real Kafka-protocol broker: `offgraph stream-train --emit kafka://` (process) ->
the topic -> `offgraph update --source kafka://` (process) -> the live store -> `offgraph serve`
(process): the HTTP scores equal the library scorer's on a copy of the version to which the
topic's deltas were applied independently (decoded and last-write-wins merged here); the
server's model status shows the updater's per-partition lag, and the updater's /metrics too."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
from kafka_helpers import consume_all
from server_helpers import serve_process

from offgraph.export.export import export_run
from offgraph.scoring.scorer import Scorer
from offgraph.store import open_store
from offgraph.streaming.deltas import read as read_delta_bytes
from offgraph.testing.harness import free_port, wait_ready
from offgraph.testing.tansu import tansu_broker

REPO = Path(__file__).resolve().parents[2]
P = 4


def _start(args, log: Path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, "-m", "offgraph.cli", *args],
        cwd=REPO,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def _apply_by_hand(messages, vdir: Path) -> int:
    """Decode every message and write the last-write-wins rows into ``vdir``'s store."""
    batches = [read_delta_bytes(value) for _, _, value, _ in messages]
    t = np.concatenate([b.table_ids for b in batches])
    r = np.concatenate([b.rows for b in batches])
    s = np.concatenate([b.seqs for b in batches])
    v = np.concatenate([b.vectors for b in batches])
    w = np.concatenate([b.first_order for b in batches])
    order = np.lexsort((s, r, t))  # seqs of one row are distinct: the highest wins
    t, r, s, v, w = t[order], r[order], s[order], v[order], w[order]
    last = np.append((t[1:] != t[:-1]) | (r[1:] != r[:-1]), True)
    with open_store(vdir / "store", mode="w") as st:
        st.write(t[last], r[last], v[last], w[last])
    return int(last.sum())


def test_stream_train_to_kafka_to_replica_scores_as_recomputed(small_run, movielens_table, tmp_path):
    run, _ = small_run
    models = tmp_path / "models"
    vdir = models / "ml" / "1"
    export_run(run, vdir, shards=2, quant="fp32", progress=False)
    ref = tmp_path / "reference"
    shutil.copytree(vdir, ref)  # the version as exported, to be updated by hand
    events = movielens_table.slice(30000, 400)
    pq.write_table(events, tmp_path / "events.parquet")
    with Scorer(vdir) as sc:
        spec = sc.spec
    first = events.slice(0, 5).to_pylist()
    request = {k: first[0][k] for k in spec.raw_inputs("request")}
    cands = [{k: e[k] for k in spec.raw_inputs("item")} for e in first]

    with tansu_broker(tmp_path / "tansu.log") as broker:
        url = f"kafka://{broker}/deltas"
        mport = free_port()
        server, base = serve_process(
            models, tmp_path / "serve.log", "--follow-seconds", "0.1", "--poll-seconds", "0.2", "--log-level", "warning"
        )
        port = int(base.rsplit(":", 1)[1])
        updater = None
        try:
            train = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "offgraph.cli",
                    "stream-train",
                    "--model",
                    str(vdir),
                    "--events",
                    str(tmp_path / "events.parquet"),
                    "--emit",
                    url,
                    "--every-events",
                    "100",
                    "--no-progress",
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            assert train.returncode == 0, train.stdout + train.stderr
            assert (vdir / "stream-start.json").exists()
            updater = _start(
                ["update", "--models", str(models), "--model", "ml", "--source", url, "--metrics-port", str(mport)],
                tmp_path / "update.log",
            )
            wait_ready(f"http://127.0.0.1:{port}", 120, server, log=str(tmp_path / "serve.log"))
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                before = client.post("/v1/models/ml:score", json={"request": request, "candidates": cands})
                assert before.status_code == 200, before.text
                messages = consume_all(broker, "deltas", P, expect=1)  # at least one; all below
                t_end = time.monotonic() + 30
                while time.monotonic() < t_end:  # the producer has finished: read the topic to its end
                    more = consume_all(broker, "deltas", P, expect=10**9, timeout=2)
                    if len(more) == len(messages):
                        break
                    messages = more
                changed = _apply_by_hand(messages, ref)
                assert changed > 100
                with Scorer(ref) as sc:
                    expected = sc.score(request, cands)
                assert not np.allclose(before.json()["scores"], expected, atol=1e-6)
                got, t_end = None, time.monotonic() + 90
                while time.monotonic() < t_end:
                    assert updater.poll() is None, (tmp_path / "update.log").read_text()[-3000:]
                    got = client.post("/v1/models/ml:score", json={"request": request, "candidates": cands})
                    if np.allclose(got.json()["scores"], expected, rtol=1e-6, atol=1e-7):
                        break
                    time.sleep(0.1)
                np.testing.assert_allclose(got.json()["scores"], expected, rtol=1e-6, atol=1e-7)
                # the server reports the updater's lag per partition (caught up: 0 messages behind)
                t_end = time.monotonic() + 30
                while time.monotonic() < t_end:
                    up = client.get("/v1/models/ml").json()["updater"]
                    if up and len(up["partitions"]) == P and all(d["messages"] == 0 for d in up["partitions"].values()):
                        break
                    time.sleep(0.2)
                # (the source shows as the server shows paths: redacted to its last part)
                assert up["source"].startswith("kafka:") and up["source"].endswith("/deltas")
                assert up["version"] == 1 and up["age_seconds"] < 10
                assert sorted(up["partitions"]) == [str(p) for p in range(P)]
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            for p in range(P):
                assert f'offgraph_update_consumer_lag_rows{{model="ml",partition="{p}"}} 0.0' in text
                assert f'offgraph_update_consumer_lag_seconds{{model="ml",partition="{p}"}}' in text
        finally:
            for proc in (updater, server):
                if proc is not None:
                    proc.terminate()
            for proc in (updater, server):
                if proc is None:
                    continue
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()

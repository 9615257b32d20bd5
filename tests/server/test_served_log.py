"""The served-request log (``offgraph.server.process.served_log``) behind a real server: every sampled request's
record, whatever the protocol, its features as the scorer saw them (re-scored by a library Scorer: the served
scores, fp32 exact); the spool sink through ``offgraph serve --served-log-rate 1 --served-log-dir``; a sink that
cannot be written, or a queue too small for the traffic, dropping records, counted on /metrics, with no request
failing or waiting; the CLI's refusals of a bad served-log configuration."""

import json
import shutil
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import xxhash
from polling import wait_for
from served_log_helpers import DROPPED, WRITTEN, check_logged, metric, score_every_protocol
from server_helpers import TOKEN, ThreadServer, copy_models, serve_process, server_config, stop_server, wait_ready

from offgraph.server.process.served_log import ServedLog, sampled
from offgraph.server.process.served_log_kafka import KafkaServedSink
from offgraph.server.process.served_log_spool import SpoolSink, read_served
from offgraph.testing.harness import free_port

pytestmark = pytest.mark.timeout(300)


def _app(models, log):
    from offgraph.server import create_app

    return create_app(server_config(models), served_log=log)


def test_sampling_is_by_the_request_ids_hash():
    ids = [f"req-{i}" for i in range(10_000)]
    expected = [xxhash.xxh64_intdigest(i.encode()) / 2.0**64 < 0.25 for i in ids]
    got = [sampled(i, 0.25) for i in ids]
    assert got == expected and abs(np.mean(got) - 0.25) < 0.015
    assert not any(sampled(i, 0.0) for i in ids[:100]) and all(sampled(i, 1.0) for i in ids[:100])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ServedLog(SpoolSink("/tmp/unused-served-log"), 1.5)


def test_every_protocols_requests_are_logged_by_offgraph_serve_as_the_scorer_saw_them(tiny_model, requests_, tmp_path):
    """``offgraph serve --served-log-rate 1 --served-log-dir``: a record per request of every protocol, HTTP and
    gRPC, each re-scored by the library to the answered scores."""
    models = copy_models(tiny_model[0], tmp_path / "models")
    grpc_port = free_port()
    flags = ("--grpc-port", str(grpc_port), "--served-log-rate", "1.0", "--served-log-dir", str(tmp_path / "served"))
    proc, url = serve_process(models, tmp_path / "serve.log", *flags)
    sent: dict = {}
    try:
        wait_ready(url, 120, proc, log=str(tmp_path / "serve.log"))
        with httpx.Client(base_url=url, timeout=30) as http:
            meta = http.get("/v2/models/ml").json()
            for i, (req, cands) in enumerate(requests_[:3]):
                sent |= score_every_protocol(http, f"127.0.0.1:{grpc_port}", meta, req, cands[:40], str(i))
            wait_for(lambda: metric(http.get("/metrics").text, WRITTEN) == len(sent), 30, "every record written")
            assert metric(http.get("/metrics").text, DROPPED) == 0
    finally:
        stop_server(proc, 60)
    assert len(sent) == 3 * 6
    check_logged(read_served(tmp_path / "served"), sent, models / "ml" / "1")


def test_the_prior_arm_is_logged_with_the_candidates_as_sent(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    log = ServedLog(SpoolSink(tmp_path / "served"), 1.0, flush_s=0.05)
    srv = ThreadServer(None, app=_app(models, log))
    started = time.time_ns()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            admin = {"Authorization": f"Bearer {TOKEN}"}
            exp = {"arms": [{"prior": True, "weight": 1}], "sticky_key": "user_id"}
            assert c.put("/v1/models/ml/experiment", json=exp, headers=admin).status_code == 200
            req, cands = requests_[0]
            r = c.post("/v1/models/ml:score", json={"request": req, "candidates": cands}, headers={"x-request-id": "p"})
            assert r.json()["arm"] == "prior"
    finally:
        srv.stop()  # closes the log: what is queued is written
    logged = read_served(tmp_path / "served")
    times = logged.column("time").cast("int64").to_numpy()
    assert np.all((times >= started) & (times <= time.time_ns()))
    (row,) = logged.drop_columns(["time"]).to_pylist()
    assert (row["request_id"], row["arm"], row["version"]) == ("p", "prior", None)
    assert [json.loads(x) for x in row["candidates"]] == cands and json.loads(row["request"]) == req
    assert row["order"] == list(range(len(cands)))


def test_a_sink_that_cannot_be_written_drops_and_counts_never_failing_a_request(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    log = ServedLog(SpoolSink(tmp_path / "served"), 1.0, flush_s=0.05)
    shutil.rmtree(tmp_path / "served")
    (tmp_path / "served").write_text("not a directory: every batch fails")
    srv = ThreadServer(None, app=_app(models, log))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            req, cands = requests_[0]
            for _ in range(20):
                assert c.post("/v1/models/ml:score", json={"request": req, "candidates": cands}).status_code == 200
            wait_for(lambda: metric(c.get("/metrics").text, DROPPED) == 20, 30, "20 records dropped and counted")
    finally:
        srv.stop()
    assert log.dropped == 20 and log.written == 0


def test_a_full_queue_drops_and_counts_and_no_request_waits_for_a_slow_sink(tiny_model, requests_, tmp_path):
    """A broker that accepts connections and never answers (a listening socket nobody reads): each batch waits the
    sink's whole timeout (1 s here) in the writer thread; with a queue of 2, the requests meanwhile are dropped
    at once. No request takes anywhere near the sink's timeout, none fails, and every record is counted."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # the kernel completes the handshakes; nothing reads or answers
    sink = KafkaServedSink(f"kafka://127.0.0.1:{hole.getsockname()[1]}/served", timeout_s=1.0)
    log = ServedLog(sink, 1.0, queue_size=2, batch_rows=1)
    models = copy_models(tiny_model[0], tmp_path / "models")
    srv = ThreadServer(None, app=_app(models, log))
    n, slowest = 40, 0.0
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            req, cands = requests_[0]
            for _ in range(n):
                t0 = time.perf_counter()
                assert c.post("/v1/models/ml:score", json={"request": req, "candidates": cands}).status_code == 200
                slowest = max(slowest, time.perf_counter() - t0)
            # the queue (2) and the one record in the writer's hands (batch_rows=1): the rest were dropped on arrival
            assert metric(c.get("/metrics").text, DROPPED) >= n - 3
            wait_for(lambda: metric(c.get("/metrics").text, DROPPED) == n, 30, "every record dropped and counted")
            assert metric(c.get("/metrics").text, WRITTEN) == 0
    finally:
        srv.stop()
        hole.close()
    assert slowest < 0.5, f"a request waited {slowest:.2f}s: the sink's 1 s timeout reached the request path"
    assert (log.dropped, log.written) == (n, 0)


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--served-log-rate", "1.5", "--served-log-dir", "x"], "--served-log-rate) must be less than or equal to 1"),
        (["--served-log-rate", "-0.1", "--served-log-dir", "x"], "--served-log-rate) must be greater than or equal"),
        (["--served-log-rate", "0.5"], "--served-log-rate needs a sink"),
        (
            ["--served-log-rate", "1", "--served-log-dir", "x", "--served-log-kafka", "kafka://127.0.0.1:9/t"],
            "one sink: --served-log-dir or --served-log-kafka, not both",
        ),
        (["--served-log-rate", "1", "--served-log-kafka", "127.0.0.1:9/t"], "expected kafka://HOST:PORT/TOPIC"),
        (["--served-log-rate", "1", "--served-log-dir", "x", "--served-log-queue", "0"], "--served-log-queue)"),
    ],
)
def test_offgraph_serve_refuses_a_bad_served_log_configuration(tiny_model, flags, words):
    cmd = [sys.executable, "-m", "offgraph.cli", "serve", "--models", str(tiny_model[0]), "--port", "0", *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("offgraph serve: error: ") and words in r.stderr, r.stderr

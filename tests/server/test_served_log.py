"""The served-request log (``offgraph.server.process.served_log``) behind a real server: every sampled :score
request's record, its features as FG saw them (re-scored by a library Scorer: the served scores, fp32 exact), and
a sink that cannot be written dropping records, counted on /metrics, with no request failing."""

import json
import re
import shutil
import time

import httpx
import numpy as np
import pytest
import xxhash
from polling import wait_for
from server_helpers import TOKEN, ThreadServer, copy_models, server_config

from offgraph.server.process.served_log import ServedLog, read_served, sampled


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
        ServedLog("/tmp/unused-served-log", 1.5)


def test_every_request_is_logged_at_rate_1_as_fg_saw_it(tiny_model, requests_, tmp_path):
    from offgraph.scoring.scorer import Scorer

    models = copy_models(tiny_model[0], tmp_path / "models")
    log = ServedLog(tmp_path / "served", 1.0, flush_s=0.05)
    srv = ThreadServer(None, app=_app(models, log))
    started = time.time_ns()
    sent = {}
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i, (req, cands) in enumerate(requests_[:12]):
                rid = f"rid-{i}"
                r = c.post(
                    "/v1/models/ml:score", json={"request": req, "candidates": cands}, headers={"x-request-id": rid}
                )
                assert r.status_code == 200 and r.headers["x-request-id"] == rid
                sent[rid] = r.json()["scores"]
            # the prior arm of an experiment: logged with its arm, no version, the candidates as sent
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
    table = logged.drop_columns(["time"]).to_pylist()
    prior = [row for row in table if row["request_id"] == "p"]
    assert len(prior) == 1 and prior[0]["arm"] == "prior" and prior[0]["version"] is None
    assert [json.loads(x) for x in prior[0]["candidates"]] == cands and json.loads(prior[0]["request"]) == req
    assert prior[0]["order"] == list(range(len(cands)))
    table = [row for row in table if row["request_id"] != "p"]
    assert sorted(row["request_id"] for row in table) == sorted(sent)
    with Scorer(models / "ml" / "1") as lib:
        for row in table:
            assert row["model"] == "ml" and row["version"] == 1 and row["arm"] == "none"
            served = np.asarray(sent[row["request_id"]], dtype=np.float32)
            np.testing.assert_array_equal(np.asarray(row["scores"], dtype=np.float32), served)
            assert row["order"] == list(np.argsort(-served, kind="stable"))
            request = json.loads(row["request"])
            candidates = [json.loads(c) for c in row["candidates"]]
            rescored = np.asarray(lib.score(request, candidates), dtype=np.float32)
            np.testing.assert_array_equal(rescored, served)


def test_a_sink_that_cannot_be_written_drops_and_counts_never_failing_a_request(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    log = ServedLog(tmp_path / "served", 1.0, flush_s=0.05)
    shutil.rmtree(tmp_path / "served")
    (tmp_path / "served").write_text("not a directory: every batch fails")
    srv = ThreadServer(None, app=_app(models, log))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            req, cands = requests_[0]
            for _ in range(20):
                assert c.post("/v1/models/ml:score", json={"request": req, "candidates": cands}).status_code == 200

            def dropped() -> float:
                text = c.get("/metrics").text
                return sum(
                    map(float, re.findall(r'^offgraph_served_log_dropped_total\{model="ml"\} (\S+)$', text, re.M))
                )

            wait_for(lambda: dropped() == 20, 30, "20 records dropped and counted", interval=0.05)
    finally:
        srv.stop()
    assert log.dropped == 20 and log.written == 0

"""The HTTP scoring server, through a real uvicorn on 127.0.0.1 and a real HTTP client (httpx).

A tiny DeepFM (MovieLens spec with small tables, conftest's ``tiny_model``) is trained on a
MovieLens slice and exported once per session; each server gets its own copy of MODELS.
"""

import gc
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import (
    TOKEN,
    ScoreHammer,
    ThreadServer,
    copy_models,
    copy_version,
    score,
    serve_process,
    server_config,
    stop_server,
    wait_for,
    wait_ready,
)

MAX_CANDIDATES = 300
MAX_BODY = 1 << 20


# -- fixtures -----------------------------------------------------------------------------------
def _config(models: Path, **kw):
    return server_config(models, **{"max_candidates": MAX_CANDIDATES, "max_body_bytes": MAX_BODY, **kw})


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("srv") / "models")
    srv = ThreadServer(_config(models))
    srv.models = models
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def library(server):
    from offgraph.scoring.scorer import load

    s = load(server.models / "ml")
    yield s
    s.close()


# -- scoring --------------------------------------------------------------------------------------
def test_served_scores_equal_the_library_scorer(client, requests_, library):
    assert client.get("/healthz").json() == {"status": "ok"}
    for req, cands in requests_[:20]:
        r = score(client, {"request": req, "candidates": cands})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "ml" and body["version"] == 1
        want = library.score(req, cands)
        np.testing.assert_array_equal(np.asarray(body["scores"], np.float32), want)
    # unknown keys are ignored; candidate order is kept
    req, cands = requests_[0]
    noisy = {"request": {**req, "not_a_feature": [1, 2]}, "candidates": [{**c, "x": "y"} for c in cands[::-1]]}
    got = score(client, noisy).json()["scores"]
    np.testing.assert_array_equal(np.asarray(got, np.float32), library.score(req, cands[::-1]))
    # a pinned version that is the served one
    assert score(client, {"request": req, "candidates": cands, "version": 1}).status_code == 200


def test_colon_routes_really_route(client):
    r = client.get("/openapi.json").json()
    assert {
        "/v1/models/{name}:score",
        "/v1/models/{name}:load",
        "/v1/models/{name}:unload",
        "/v1/models/{name}:rollback",
        "/v1/models/{name}",
        "/v1/models",
    } <= set(r["paths"])
    assert "ignored" in r["paths"]["/v1/models/{name}:score"]["post"]["description"]
    assert client.get("/docs").status_code == 200
    assert client.get("/v1/models/ml:score").status_code in (400, 405)  # GET on a POST route
    assert client.post("/v1/models/ml:frobnicate", json={}).status_code in (404, 405)
    m = client.get("/v1/models/ml").json()
    assert m["name"] == "ml" and m["state"] == "serving" and m["versions_on_disk"] == [1]
    assert m["loaded"]["version"] == 1 and m["loaded"]["quantization"] == "fp32"
    assert m["loaded"]["total_rows"] > 0 and "auc" in m["loaded"]["training"]["held_out"]
    assert m["inputs"]["item"] == ["movie_id", "genres", "title_words", "release_year"]
    assert "store_rows_read" in m["loaded"]["store"] and "last_catch_up_unix" in m["loaded"]["store"]
    assert [x["name"] for x in client.get("/v1/models").json()["models"]] == ["ml"]


def test_concurrent_requests_all_succeed(server, requests_, library):
    def one(i):
        req, cands = requests_[i % len(requests_)]
        with httpx.Client(base_url=server.url, timeout=30) as c:
            r = score(c, {"request": req, "candidates": cands})
        return r.status_code, r.json().get("scores"), library.score(req, cands)

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(50)))
    assert [s for s, _, _ in results] == [200] * 50
    for _, got, want in results:
        np.testing.assert_array_equal(np.asarray(got, np.float32), want)


# -- bad input: 4xx naming the problem, never a 5xx ---------------------------------------------------
CAND = {"movie_id": 1, "genres": ["Comedy"]}
BAD_BODIES = [
    (b'{"candidates": [{"movie_id": NaN}]}', 422, "NaN and Infinity"),
    (b'{"candidates": [{"movie_id": Infinity}]}', 422, "NaN and Infinity"),
    (b'{"candidates": [{"genres": ["a", -Infinity]}]}', 422, "candidates[0].genres[1]"),
    (b'{"candidates": [{"release_year": 1e999}]}', 422, "finite"),
    (b'{"request": {"age": NaN}, "candidates": [{}]}', 422, "request.age"),
    (b'{"candidates": [{"movie_id": {"nested": 1}}]}', 422, "no nested objects"),
    (b'{"candidates": [{"genres": [["a"]]}]}', 422, "no nested lists"),
    (b'{"candidates": []}', 422, "candidates: List should have at least 1 item"),
    (b'{"request": {}}', 422, "candidates: Field required"),
    (b'{"candidates": {"movie_id": 1}}', 422, "candidates"),
    (b'{"candidates": [1, 2]}', 422, "candidates[0]"),
    (b'{"request": [1], "candidates": [{}]}', 422, "request"),
    (b'{"request": {"user_id": {"id": 1}}, "candidates": [{}]}', 422, "request.user_id"),
    (b'{"candidates": [{"genres": ["a", {"b": 1}]}]}', 422, "candidates[0].genres[1]"),
    (b"[1, 2]", 422, "invalid score body"),
    (b'{"candidates": [{"movie_id": 1}], "canddiates": []}', 422, "canddiates: unknown field 'canddiates'"),
    (b'{"candidates": [{"movie_id": 1}], "version": "two"}', 422, "version"),
    (b'{"candidates": [{"movie_id": 1}], "version": -1}', 422, "version"),
    (b'{"candidates": [{"movie_id": 1}', 422, "not valid JSON"),
    (b"", 422, "Field required"),
    (b'{"candidates": [{"release_year": "not a year"}]}', 422, "field 'release_year', candidates[0]"),
    (json.dumps({"candidates": [{}] * (MAX_CANDIDATES + 1)}).encode(), 422, f"at most {MAX_CANDIDATES}"),
    (json.dumps({"candidates": [{"title_words": "x" * (MAX_BODY + 10)}]}).encode(), 413, "larger than the limit"),
]


@pytest.mark.parametrize("body,status,words", BAD_BODIES, ids=[f"bad{i}" for i in range(len(BAD_BODIES))])
def test_bad_bodies_are_4xx_naming_the_problem(client, body, status, words):
    r = score(client, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert words in r.json()["detail"], r.json()


def test_bad_paths_and_versions(client, server, tiny_model):
    # a real model just outside MODELS must never be reachable through the name
    outside = server.models.parent / "outside"
    if not outside.exists():
        shutil.copytree(tiny_model[0] / "ml", outside)
    body = json.dumps({"candidates": [CAND]}).encode()
    cases = [
        ("/v1/models/nope:score", 404, "unknown model 'nope'"),
        ("/v1/models/%2e%2e:score", 400, "invalid model name"),
        ("/v1/models/..:score", 400, "invalid model name"),
        ("/v1/models/ml%2F..%2F..%2Foutside:score", 404, "no route"),
        ("/v1/models/..%2Foutside:score", 404, "no route"),
        ("/v1/models/%2E%2E%2Foutside:score", 404, "no route"),
        ("/v1/models/outside:score", 404, "unknown model 'outside'"),
        ("/v1/models/ml:x:score", 400, "invalid model name"),
        ("/v1/models/.hidden:score", 400, "invalid model name"),
        ("/v1/models/%00:score", 400, "invalid model name"),
    ]
    for path, status, words in cases:
        r = client.post(httpx.URL(server.url + path), content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (path, r.text)
        assert words in r.json()["detail"], (path, r.json())
    r = score(client, {"candidates": [CAND], "version": 7})
    assert r.status_code == 404 and "version 7" in r.json()["detail"]
    assert client.get("/v1/models/nope").status_code == 404
    assert client.get("/v1/models/%2e%2e").status_code == 400


def test_body_limit_streamed_and_by_content_length(server):
    big = json.dumps({"candidates": [{"title_words": "x" * (MAX_BODY + 10)}]}).encode()

    def chunks():  # no Content-Length: the streamed size is what trips the limit
        for i in range(0, len(big), 64 << 10):
            yield big[i : i + (64 << 10)]

    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/models/ml:score", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "streamed" in r.json()["detail"], r.text
        r = c.post("/v1/models/ml:score", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "Content-Length" in r.json()["detail"], r.text
        # the same keep-alive connection still serves
        assert score(c, {"candidates": [CAND]}).status_code == 200


def test_metrics_and_no_5xx_after_bad_input(client, requests_):
    assert score(client, {"candidates": []}).status_code == 422  # its own bad input: no state of other tests
    big = b'{"candidates": [{"title_words": "' + b"x" * MAX_BODY + b'"}]}'
    assert (
        client.post("/v1/models/ml:score", content=big, headers={"content-type": "application/json"}).status_code == 413
    )
    req, cands = requests_[0]
    assert score(client, {"request": req, "candidates": cands}).status_code == 200  # still serving
    text = client.get("/metrics").text
    for name in (
        "offgraph_request_latency_seconds_bucket",
        "offgraph_candidates_per_request_bucket",
        "offgraph_store_rows_read_total",
        "offgraph_row_cache_hit_ratio",
        "offgraph_row_cache_hits_total",
        "offgraph_http_errors_total",
        "offgraph_model_loaded_version",
        "offgraph_store_freshness_seconds",
    ):
        assert name in text, name
    assert 'offgraph_model_loaded_version{model="ml"} 1.0' in text
    score_route = 'model="ml",route="/v1/models/{name}:score"'
    assert f'offgraph_http_errors_total{{code="422",{score_route}}}' in text, text
    assert f'offgraph_http_errors_total{{code="413",{score_route}}}' in text, text  # refused before routing
    assert 'code="5' not in text, [ln for ln in text.splitlines() if 'code="5' in ln]


def _error_count(client, code: str, route: str, model: str) -> float:
    labels = f'code="{code}",model="{model}",route="{route}"'  # prometheus_client writes them sorted
    m = re.search(rf"^offgraph_http_errors_total\{{{re.escape(labels)}\}} (\S+)$", client.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_error_labels_are_route_templates_and_served_models(client):
    cases = [  # (method, path, code, route label, model label)
        ("POST", "/v1/models/made-up-1:score", "404", "/v1/models/{name}:score", "unknown"),
        ("POST", "/v1/models/made-up-2:score", "404", "/v1/models/{name}:score", "unknown"),
        ("GET", "/v1/models/ml:score", "405", "/v1/models/{name}:score", "ml"),
        ("GET", "/v1/models/made-up-3", "404", "/v1/models/{name:no_colon}", "unknown"),
        ("GET", "/scanner/probe-1", "404", "unmatched", ""),
        ("GET", "/scanner/probe-2", "404", "unmatched", ""),
    ]
    before = {c[2:]: _error_count(client, *c[2:]) for c in cases}
    for method, path, code, *_ in cases:
        r = client.request(method, path, json={"candidates": [{}]})
        assert r.status_code == int(code), (path, r.text)
    for key, n in before.items():
        assert _error_count(client, *key) == n + sum(c[2:] == key for c in cases), key
    text = client.get("/metrics").text
    assert "made-up" not in text and "scanner" not in text, [
        ln for ln in text.splitlines() if "http_errors" in ln
    ]  # raw paths and names never become label values


def test_process_and_python_series_are_on_metrics(client):
    text = client.get("/metrics").text
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert re.search(rf"^{name}(\{{.*\}})? \S+$", text, re.M), name


def test_gc_pauses_are_on_metrics(client):
    def count() -> float:
        m = re.search(r'^offgraph_gc_pause_seconds_count\{generation="2"\} (\S+)$', client.get("/metrics").text, re.M)
        return float(m.group(1)) if m else 0.0

    before = count()
    gc.collect()  # the server runs in this process: a full collection of it
    assert count() >= before + 1


def _ignored_keys(client) -> float:
    for ln in client.get("/metrics").text.splitlines():
        if ln.startswith('offgraph_ignored_keys_total{model="ml"}'):
            return float(ln.split()[-1])
    raise AssertionError('no offgraph_ignored_keys_total{model="ml"} on /metrics')


def test_inputs_in_the_wrong_scope_are_422_naming_the_key(client, requests_):
    """The issue's case: request-scope fields sent inside each candidate with an empty request used to score
    200 (the request fields were no value); now a 422 naming the key and where it belongs."""
    req, cands = requests_[0]
    flat = [{**req, **c} for c in cands]
    r = score(client, {"request": {}, "candidates": flat})
    assert r.status_code == 422, r.text
    assert "input 'age' sent in candidates[0]" in r.json()["detail"] and "'request'" in r.json()["detail"]
    r = score(client, {"request": {**req, "genres": ["Drama"]}, "candidates": cands})
    assert r.status_code == 422, r.text
    assert "input 'genres' sent in request" in r.json()["detail"] and "each of 'candidates'" in r.json()["detail"]


def test_ignored_keys_are_counted(client, requests_):
    req, cands = requests_[1]
    before = _ignored_keys(client)
    r = score(client, {"request": {**req, "usr_id": 1}, "candidates": [{**c, "genre": "x"} for c in cands[:3]]})
    assert r.status_code == 200, r.text
    assert _ignored_keys(client) == before + 4


def test_model_status_lists_inputs_by_scope(client):
    inputs = client.get("/v1/models/ml").json()["inputs"]
    assert inputs["request"] == ["user_id", "age", "gender", "occupation", "zip_prefix"]
    assert inputs["item"] == ["movie_id", "genres", "title_words", "release_year"]


def test_admin_needs_the_token(client):
    r = client.post("/v1/models/ml:rollback")
    assert r.status_code == 401 and "Bearer" in r.json()["detail"]
    r = client.post("/v1/models/ml:unload", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "wrong admin token" in r.json()["detail"]
    r = client.post("/v1/models/ml:rollback", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 409 and "no previous version" in r.json()["detail"]
    r = client.post("/v1/models/ml:load", json={"version": 5}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 404 and "no complete version 5" in r.json()["detail"]


# -- hot swap, refusals, rollback ---------------------------------------------------------------------
def test_hot_swap_under_load_refusals_and_rollback(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    srv = ThreadServer(_config(models))
    admin = {"Authorization": f"Bearer {TOKEN}"}
    hammer = ScoreHammer(srv.url, requests_, threads=2)
    seen = hammer.seen
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            hammer.start()
            copy_version(models / "ml" / "1", models / "ml" / "2")
            wait_for(lambda: c.get("/v1/models/ml").json()["loaded"]["version"] == 2, 30, "version 2 served")
            n_swap = len(seen)
            wait_for(lambda: len(seen) > n_swap + 10, 20, "requests after the swap")
            hammer.stop()
            assert {s for s, _ in seen} == {200}, [x for x in seen if x[0] != 200][:5]
            assert {v for _, v in seen} == {1, 2} and seen[-1][1] == 2
            st = c.get("/v1/models/ml").json()
            assert st["previous_version"] == 1 and st["loaded"]["in_flight"] == 0

            # corrupt versions are refused with a reason; version 2 keeps serving
            def tamper_dense(d):
                pb = d / "dense" / "saved_model.pb"
                pb.write_bytes(pb.read_bytes() + b"\0")

            copy_version(models / "ml" / "1", models / "ml" / "3", tamper=tamper_dense)
            copy_version(
                models / "ml" / "1", models / "ml" / "4", tamper=lambda d: shutil.rmtree(d / "store" / "shard-001")
            )
            copy_version(
                models / "ml" / "1", models / "ml" / "5", manifest_edit=lambda m: m.update(fg_version="offgraph-fg-0")
            )
            st = wait_for(
                lambda: (lambda s: s if len(s["refused"]) == 3 else None)(c.get("/v1/models/ml").json()),
                30,
                "versions 3, 4 and 5 refused",
            )
            reasons = {x["version"]: x["reason"] for x in st["refused"]}
            assert "checksum mismatch" in reasons[3] and "missing store shard 1" in reasons[4], reasons
            assert "FG version 'offgraph-fg-0'" in reasons[5], reasons
            assert st["loaded"]["version"] == 2 and st["state"] == "serving"
            at = {x["version"]: x["at_unix"] for x in st["refused"]}
            later = _after_scans(c, 3)  # refused versions are not retried while their files are unchanged
            assert {x["version"]: x["at_unix"] for x in later["refused"]} == at
            req, cands = requests_[0]
            assert score(c, {"request": req, "candidates": cands}).json()["version"] == 2
            assert 'offgraph_model_load_failures_total{model="ml"} 3.0' in c.get("/metrics").text

            # admin: rollback to 1 (pinned: the poller does not move it back to 2)
            r = c.post("/v1/models/ml:rollback", headers=admin)
            assert r.status_code == 200, r.text
            assert r.json()["loaded"]["version"] == 1 and r.json()["policy"] == "pinned"
            assert _after_scans(c, 3)["loaded"]["version"] == 1  # the poller saw version 2 and kept the pin
            assert score(c, {"request": req, "candidates": cands}).json()["version"] == 1
            r = c.post("/v1/models/ml:load", json={"version": 3}, headers=admin)
            assert r.status_code == 409 and "checksum mismatch" in r.json()["detail"]
            assert score(c, {"request": req, "candidates": cands}).json()["version"] == 1
            r = c.post("/v1/models/ml:unload", headers=admin)
            assert r.status_code == 200 and r.json()["state"] == "unloaded"
            r = score(c, {"request": req, "candidates": cands})
            assert r.status_code == 404 and "no loaded version" in r.json()["detail"]
            assert c.get("/readyz").status_code == 200  # unloaded on purpose
            r = c.post("/v1/models/ml:load", json={}, headers=admin)  # back to the newest loadable version
            assert r.status_code == 200 and r.json()["loaded"]["version"] == 2 and r.json()["policy"] == "latest"
            assert 'code="5' not in c.get("/metrics").text
    finally:
        hammer.stop()
        srv.stop()


def _after_scans(c: httpx.Client, n: int) -> dict:
    """The model's status once ``n`` more scans of MODELS have run (an event to wait for, not a sleep)."""
    start = c.get("/v1/models/ml").json()["scans"]
    return wait_for(
        lambda: (lambda st: st if st["scans"] >= start + n else None)(c.get("/v1/models/ml").json()),
        30,
        f"{n} scans of MODELS",
    )


# -- the CLI -------------------------------------------------------------------------------------------------
def test_offgraph_serve_cli(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    log = tmp_path / "serve.log"
    flags = ["--intra-threads", "1", "--inter-threads", "1", "--cache-mb", "8", "--poll-seconds", "0.5"]
    proc, url = serve_process(models, log, *flags, env={"OFFGRAPH_ADMIN_TOKEN": None})
    try:
        wait_ready(url, 90, proc)
        with httpx.Client(base_url=url, timeout=30) as c:
            req, cands = requests_[0]
            r = score(c, {"request": req, "candidates": cands})
            assert r.status_code == 200 and len(r.json()["scores"]) == len(cands)
            r = c.post("/v1/models/ml:rollback", headers={"Authorization": "Bearer x"})
            assert r.status_code == 403 and "admin actions are disabled" in r.json()["detail"]
    finally:
        stop_server(proc, 30)
    out = log.read_text()
    # a graceful stop (offgraph.server.process.graceful_stop): exit status 0
    assert proc.returncode == 0, out[-3000:]
    assert "Application shutdown complete" in out and "closed version 1 of ml" in out, out[-3000:]
    assert "TensorFlow threads: intra-op 1, inter-op 1" in out and "serving version 1" in out, out[-3000:]

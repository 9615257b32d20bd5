"""The TensorFlow Serving and KServe v2 endpoints and x-request-id, through a real uvicorn on 127.0.0.1 serving
the tiny real model (conftest's ``tiny_model``) and a real httpx client.

``:predict`` must give the scores ``:score`` gives for the same request and candidates, whichever way the
request-scope inputs come (``context``, whole rows, both); its errors and those of the other TF Serving and
KServe routes are ``{"error": ...}``.
"""

import json
import logging
import re

import httpx
import pytest
from server_helpers import ThreadServer, client, copy_models, copy_version, score, server_config, wait_for  # noqa: F401 - client: a fixture

MAX_CANDIDATES = 50
HEX32 = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """The tiny model, and a test-only route that raises (an error log line written during a request)."""
    from offgraph.server import create_app

    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("anchors") / "models")
    config = server_config(models, max_candidates=MAX_CANDIDATES)
    app = create_app(config)

    @app.get("/test-only/raise", include_in_schema=False)
    async def raise_unexpected() -> dict:
        raise RuntimeError("unexpected")

    srv = ThreadServer(config, app=app)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def broken(tiny_model, tmp_path_factory):
    """A server whose only version is refused (its dense model tampered with): nothing serves."""
    models = tmp_path_factory.mktemp("anchors-broken") / "models"
    (models / "ml").mkdir(parents=True)

    def tamper_dense(d):
        pb = d / "dense" / "saved_model.pb"
        pb.write_bytes(pb.read_bytes() + b"\0")

    copy_version(tiny_model[0] / "ml" / "1", models / "ml" / "1", tamper=tamper_dense)
    srv = ThreadServer(server_config(models), ready=False)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        wait_for(lambda: c.get("/v1/models/ml").json()["refused"], 60, "version 1 refused")
        yield c
    srv.stop()


def predict(client, body, path="/v1/models/ml:predict", **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"content-type": "application/json", **kw.pop("headers", {})})


def _error(r, status: int, *words: str) -> str:
    """The ``{"error": ...}`` message of an answer of that status, holding every word."""
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    for w in words:
        assert w in body["error"], (w, body)
    return body["error"]


# -- :predict ---------------------------------------------------------------------------------------------------
def test_predict_scores_equal_score_for_the_same_request_and_candidates(client, requests_):
    for req, cands in requests_[:12]:
        cands = cands[:MAX_CANDIDATES]
        r = score(client, {"request": req, "candidates": cands})
        assert r.status_code == 200, r.text
        want = r.json()["scores"]
        keys = sorted(req)
        half = {k: req[k] for k in keys[: len(keys) // 2]}
        rest = {k: req[k] for k in keys[len(keys) // 2 :]}
        bodies = [
            {"context": req, "instances": cands},  # request features once
            {"instances": [{**req, **c} for c in cands]},  # whole rows
            {"context": half, "instances": [{**rest, **c} for c in cands]},  # part in each place
            {"context": req, "instances": [{**req, **c} for c in cands], "signature_name": "serving_default"},
        ]
        for body in bodies:
            for path in ("/v1/models/ml:predict", "/v1/models/ml/versions/1:predict"):
                got = predict(client, body, path)
                assert got.status_code == 200, got.text
                assert list(got.json()) == ["predictions"]
                assert got.json()["predictions"] == want, (path, body)
    # keys the model does not read are ignored, as by :score; candidate order is kept
    req, cands = requests_[0]
    noisy = [{**c, "not_an_input": "x"} for c in cands[:5][::-1]]
    want = score(client, {"request": req, "candidates": cands[:5][::-1]}).json()["scores"]
    assert predict(client, {"context": {**req, "other": 1}, "instances": noisy}).json()["predictions"] == want


def test_a_request_scope_input_with_two_values_is_a_422_naming_it(client, requests_):
    req, cands = requests_[0]
    rows = [{**req, **c} for c in cands[:3]]
    other = dict(rows[2], user_id=req["user_id"] + 1)
    msg = _error(
        predict(client, {"instances": [rows[0], rows[1], other]}), 422, "'user_id'", "instances[0]", "instances[2]"
    )
    assert "context" in msg  # says where to send it
    missing = {k: v for k, v in rows[1].items() if k != "occupation"}
    _error(predict(client, {"instances": [rows[0], missing]}), 422, "'occupation'", "instances[1]", "does not send it")
    _error(
        predict(client, {"context": {"gender": "F"}, "instances": [dict(rows[0], gender="M")]}),
        422,
        "'gender'",
        "'context'",
        "instances[0]",
    )
    # 21 and 21.0 are two feature values (FG hashes them apart)
    _error(predict(client, {"instances": [dict(rows[0], age=21), dict(rows[1], age=21.0)]}), 422, "'age'")
    # an item-scope input in the shared request features
    _error(predict(client, {"context": {"movie_id": 1}, "instances": [{}]}), 422, "'movie_id'", "each instance")
    # a value the feature generation refuses names the instance, as :score names the candidate
    _error(predict(client, {"instances": [{}, {"release_year": True}]}), 422, "release_year", "instances[1]")


def test_predict_bad_bodies_are_4xx_with_an_error_key(client):
    cases = [
        (b"{not json", 422, "not valid JSON"),
        (b"", 422, "instances"),
        ({"instances": []}, 422, "instances"),
        ({"instances": [1, 2]}, 422, "instances[0]"),
        ({"instances": [{"movie_id": {"nested": 1}}]}, 422, "instances[0].movie_id"),
        (b'{"instances": [{"release_year": NaN}]}', 422, "NaN"),
        ({"instances": [{}], "inputs": {"movie_id": [1]}}, 422, "either 'instances'"),
        ({"instances": [{}] * (MAX_CANDIDATES + 1)}, 422, "instances"),
        ({"instances": [{}], "signature_name": "other"}, 422, "serving_default"),
    ]
    for body, status, word in cases:
        _error(predict(client, body), status, word)
    r = client.post("/v1/models/ml:predict", content=b'{"instances": [{}]}', headers={"content-type": "text/plain"})
    _error(r, 415, "application/json")


def test_unknown_models_and_versions_are_404_with_an_error_key(client):
    body = {"instances": [{}]}
    _error(predict(client, body, "/v1/models/nope:predict"), 404, "unknown model 'nope'")
    _error(predict(client, body, "/v1/models/ml/versions/7:predict"), 404, "version 7", "serves version 1")
    _error(predict(client, body, "/v1/models/ml/versions/x1:predict"), 400, "version")
    _error(predict(client, body, "/v1/models/a..b:predict"), 400)
    for path in ("/v1/models/nope/metadata", "/v1/models/nope/versions/1", "/v2/models/nope", "/v2/models/nope/ready"):
        _error(client.get(path), 404, "unknown model 'nope'")
    _error(client.get("/v1/models/ml/versions/9"), 404, "version 9")
    _error(client.get("/v1/models/ml/versions/9/metadata"), 404, "version 9")
    _error(client.get("/v2/models/ml/versions/9"), 404, "version 9")
    _error(client.get("/v2/models/ml/versions/9/ready"), 404, "version 9")
    # today's routes keep their own error shape
    r = client.get("/v1/models/nope")
    assert r.status_code == 404 and "detail" in r.json() and "error" not in r.json(), r.text
    assert client.get("/v1/models/ml/versions/1:predict").status_code == 405
    # unknown labels as unknown versions; a label outside the rule is a 400; a path no route takes (a ':' in
    # a label) belongs to neither API and carries both keys
    _error(predict(client, body, "/v1/models/ml/labels/canary:predict"), 404, "no label 'canary'")
    _error(client.get("/v1/models/ml/labels/canary"), 404, "no label 'canary'")
    _error(client.get("/v1/models/ml/labels/canary/metadata"), 404, "no label 'canary'")
    _error(client.get("/v1/models/ml/labels/Canary"), 400, "invalid label 'Canary'")
    r = client.get("/v1/models/ml/labels/a:b")
    assert r.status_code == 404 and r.json()["error"] == r.json()["detail"] == "no route GET /v1/models/ml/labels/a:b"


# -- model status and metadata ---------------------------------------------------------------------------------
AVAILABLE = {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}


def test_model_version_status_beside_the_model_status(client):
    m = client.get("/v1/models/ml").json()
    assert m["name"] == "ml" and m["state"] == "serving" and m["loaded"]["version"] == 1  # today's fields stay
    assert m["model_version_status"] == [AVAILABLE]
    assert client.get("/v1/models").json()["models"][0]["model_version_status"] == [AVAILABLE]
    r = client.get("/v1/models/ml/versions/1")
    assert r.status_code == 200 and r.json() == {"model_version_status": [AVAILABLE]}, r.text


def test_metadata_describes_the_inputs_by_scope_and_the_output(client):
    inputs = client.get("/v1/models/ml").json()["inputs"]
    for path in ("/v1/models/ml/metadata", "/v1/models/ml/versions/1/metadata"):
        r = client.get(path)
        assert r.status_code == 200, r.text
        meta = r.json()
        assert meta["model_spec"] == {"name": "ml", "signature_name": "serving_default", "version": "1"}
        sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sig["method_name"] == "tensorflow/serving/predict"
        for scope in ("request", "item"):
            assert [k for k, v in sig["inputs"].items() if v["scope"] == scope] == inputs[scope]
        assert sig["inputs"]["gender"]["dtype"] == "DT_STRING"
        assert sig["inputs"]["release_year"]["dtype"] == "DT_DOUBLE"  # bucketized: a number
        assert [d["size"] for d in sig["inputs"]["genres"]["tensor_shape"]["dim"]] == ["-1", "-1"]  # a list per item
        assert [d["size"] for d in sig["inputs"]["gender"]["tensor_shape"]["dim"]] == ["1", "-1"]  # once per request
        out = sig["outputs"]["predictions"]
        assert (
            out["dtype"] == "DT_FLOAT"
            and out["score_kind"] == client.get("/v1/models/ml").json()["loaded"]["score_kind"]
        )


# -- KServe v2 ---------------------------------------------------------------------------------------------------
def test_kserve_health_readiness_and_model_metadata(client):
    assert client.get("/v2/health/live").json() == {"live": True}
    r = client.get("/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}, r.text
    for path in ("/v2/models/ml/ready", "/v2/models/ml/versions/1/ready"):
        r = client.get(path)
        assert r.status_code == 200 and r.json() == {"name": "ml", "ready": True}, (path, r.text)
    meta = client.get("/v2/models/ml").json()
    assert meta["name"] == "ml" and meta["versions"] == ["1"] and meta["platform"] == "offgraph"
    inputs = client.get("/v1/models/ml").json()["inputs"]
    assert [i["name"] for i in meta["inputs"]] == inputs["request"] + inputs["item"]
    assert {i["name"]: i["datatype"] for i in meta["inputs"]}["release_year"] == "FP64"
    assert meta["outputs"][0]["name"] == "scores" and meta["outputs"][0]["datatype"] == "FP32"
    assert client.get("/v2/models/ml/versions/1").json() == meta
    server = client.get("/v2").json()
    assert server["name"] == "offgraph" and server["version"]


def test_nothing_serving_is_503_not_ready_and_the_refusal_in_the_version_status(broken):
    r = broken.get("/v2/health/ready")
    assert r.status_code == 503 and r.json() == {"ready": False}, r.text
    assert broken.get("/v2/health/live").status_code == 200
    _error(broken.get("/v2/models/ml/ready"), 404, "no loaded version")  # the protocol's 4xx: not ready
    _error(broken.get("/v2/models/ml/versions/1/ready"), 404, "no loaded version")  # on disk, not served
    _error(broken.get("/v2/models/ml"), 404, "no loaded version")
    _error(broken.get("/v1/models/ml/metadata"), 404, "no loaded version")
    _error(predict(broken, {"instances": [{}]}), 404, "no loaded version")
    (status,) = broken.get("/v1/models/ml/versions/1").json()["model_version_status"]
    assert status["version"] == "1" and status["state"] == "END", status
    assert status["status"]["error_code"] == "UNKNOWN" and "checksum" in status["status"]["error_message"], status
    assert "/" not in status["status"]["error_message"].split("ml/1")[0]  # paths redacted, as in the model status


# -- x-request-id ------------------------------------------------------------------------------------------------
def test_request_id_is_echoed_generated_and_never_a_hostile_one(client):
    for rid in ("abc-123", "0b7c4f1e-9d2a-4c1b-8e3f-5a6b7c8d9e0f", "Zm9vYmFy+/=", "a" * 128):
        for r in (
            client.get("/healthz", headers={"x-request-id": rid}),
            predict(client, b"{", headers={"x-request-id": rid}),
        ):
            assert r.headers["x-request-id"] == rid, (rid, r.status_code)
    seen = set()
    for _ in range(3):
        rid = client.get("/healthz").headers["x-request-id"]
        assert HEX32.fullmatch(rid), rid
        seen.add(rid)
    assert len(seen) == 3  # a fresh one each time
    for hostile in (
        "a" * 129,
        "two words",
        "<script>",
        "-leading-dash",
        "id;drop",
        "caf\u00e9".encode(),
        '"quoted"',
        "",
    ):
        r = client.get("/v1/models/ml", headers={"x-request-id": hostile})
        assert r.status_code == 200
        got = r.headers["x-request-id"]
        assert HEX32.fullmatch(got), (hostile, got)
    # on every answer: a 404 of no route, a 413, the anchors' errors
    assert HEX32.fullmatch(client.get("/no/such/route").headers["x-request-id"])
    big = client.post("/v1/models/ml:score", content=b"x" * (9 << 20), headers={"content-type": "application/json"})
    assert big.status_code == 413 and HEX32.fullmatch(big.headers["x-request-id"])


def test_request_id_is_in_the_log_lines_of_its_request(client, caplog):
    with caplog.at_level(logging.ERROR, logger="offgraph.server"):
        r = client.get("/test-only/raise", headers={"x-request-id": "trace-me-42"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "trace-me-42"
    lines = [rec.getMessage() for rec in caplog.records if "internal error" in rec.getMessage()]
    assert lines and all("[request_id=trace-me-42]" in ln for ln in lines), lines
    assert [rec.request_id for rec in caplog.records if "internal error" in rec.getMessage()] == ["trace-me-42"]
    logging.getLogger("offgraph.server").error("outside a request")  # no id there
    assert "request_id" not in caplog.records[-1].getMessage()


# -- OpenAPI -------------------------------------------------------------------------------------------------------
PREDICT = ("PredictResponse", "ColumnarPredictResponse")  # the row and the columnar format's answers
NEW_ROUTES = {
    "/v1/models/{name}:predict": ("post", PREDICT),
    "/v1/models/{name}/versions/{version}:predict": ("post", PREDICT),
    "/v1/models/{name}/versions/{version}": ("get", "VersionStatusList"),
    "/v1/models/{name}/metadata": ("get", "ModelMetadata"),
    "/v1/models/{name}/versions/{version}/metadata": ("get", "ModelMetadata"),
    "/v1/models/{name}/labels/{label}:predict": ("post", PREDICT),
    "/v1/models/{name}/labels/{label}": ("get", "VersionStatusList"),
    "/v1/models/{name}/labels/{label}/metadata": ("get", "ModelMetadata"),
    "/v2": ("get", "ServerMetadata"),
    "/v2/health/live": ("get", "ServerLive"),
    "/v2/health/ready": ("get", "ServerReady"),
    "/v2/models/{name}": ("get", "KServeModelMetadata"),
    "/v2/models/{name}/versions/{version}": ("get", "KServeModelMetadata"),
    "/v2/models/{name}/ready": ("get", "ModelReady"),
    "/v2/models/{name}/versions/{version}/ready": ("get", "ModelReady"),
    "/v2/models/{name}/infer": ("post", "InferResponse"),
    "/v2/models/{name}/versions/{version}/infer": ("post", "InferResponse"),
}


def test_the_new_routes_are_in_openapi_with_typed_answers(client):
    spec = client.get("/openapi.json").json()
    for path, (method, model) in NEW_ROUTES.items():
        op = spec["paths"][path][method]
        ok = op["responses"]["200"]["content"]["application/json"]["schema"]
        refs = [{"$ref": f"#/components/schemas/{m}"} for m in ((model,) if isinstance(model, str) else model)]
        assert (ok if len(refs) == 1 else ok["anyOf"]) == (refs[0] if len(refs) == 1 else refs), (path, ok)
        for code, answer in op["responses"].items():
            schema = answer["content"]["application/json"]["schema"]
            if code == "413":  # a Content-Length over the limit is refused before routing, as on every route
                assert {"$ref": "#/components/schemas/AnchorError"} in schema["anyOf"], schema
            elif code.startswith("4"):
                assert schema == {"$ref": "#/components/schemas/AnchorError"}, (path, code, schema)
    predict_body = spec["paths"]["/v1/models/{name}:predict"]["post"]["requestBody"]["content"]["application/json"]
    rows, columns = (predict_body["schema"]["properties"][k]["anyOf"] for k in ("instances", "inputs"))
    assert [b["maxItems"] for b in rows if b.get("type") == "array"] == [MAX_CANDIDATES]  # or null: the columns
    column = [b for b in columns if b.get("type") == "object"][0]["additionalProperties"]
    assert column["maxItems"] == MAX_CANDIDATES
    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):  # fuzzed by schemathesis
        infer_body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert infer_body["required"] == ["inputs"] and "InferInputTensor" in json.dumps(infer_body), infer_body
    assert "model_version_status" in spec["components"]["schemas"]["ModelStatus"]["properties"]

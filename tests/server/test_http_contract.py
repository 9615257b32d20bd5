"""The HTTP contract, through a real uvicorn on 127.0.0.1 and a real httpx client: numbers at and beyond the
float64 range are 4xx naming the field, an unexpected error is a clean 500 the keep-alive connection survives,
non-JSON bodies are 415, admin calls authenticate before they parse, the published OpenAPI schema describes what
the server accepts, and absolute paths are only shown to the admin.
"""

import json
import logging
import re
import shutil
import sys

import httpx
import numpy as np
import pytest
from server_helpers import TOKEN, ThreadServer, copy_models, copy_version, resolve_refs, score, server_config, wait_for

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "secret-text-of-the-exception"
MAX_FLOAT = sys.float_info.max


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """The tiny model, one broken version beside it (refused with a reason naming its directory), and two
    test-only routes: one that raises, one that answers the client's port (to see the connection kept)."""
    from fastapi import Request

    from offgraph.server import create_app

    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("contract") / "models")

    def tamper_dense(d):
        pb = d / "dense" / "saved_model.pb"
        pb.write_bytes(pb.read_bytes() + b"\0")

    copy_version(models / "ml" / "1", models / "ml" / "2", tamper=tamper_dense)
    config = server_config(models, max_candidates=50)
    app = create_app(config)

    @app.get("/test-only/raise", include_in_schema=False)
    async def raise_unexpected() -> dict:
        raise RuntimeError(f"{SECRET} in {models}/ml/1/store")

    @app.get("/test-only/port", include_in_schema=False)
    async def client_port(request: Request) -> dict:
        return {"port": request.client.port}

    srv = ThreadServer(config, app=app)
    srv.models = models
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        wait_for(lambda: c.get("/v1/models/ml").json()["refused"], 30, "version 2 refused")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _scores_ok(r: httpx.Response, n: int) -> None:
    assert r.status_code == 200, r.text
    scores = np.asarray(r.json()["scores"])
    assert scores.shape == (n,) and np.all((scores >= 0) & (scores <= 1)), scores


# -- item 3: big numbers ----------------------------------------------------------------------------------------
BIG = [
    (b'{"candidates": [{"release_year": 9' + b"0" * 399 + b"}]}", "candidates[0].release_year"),
    (json.dumps({"request": {"age": 2**1024}, "candidates": [{}]}).encode(), "request.age"),
    (json.dumps({"request": {"age": -(2**1024)}, "candidates": [{}]}).encode(), "request.age"),
    (json.dumps({"request": {"user_id": 10**400}, "candidates": [{}]}).encode(), "request.user_id"),
    (
        json.dumps({"candidates": [{"movie_id": 1}, {"genres": ["Comedy", 2**1100]}]}).encode(),
        "candidates[1].genres[1]",
    ),
    (json.dumps({"candidates": [{"release_year": int(MAX_FLOAT) + 1}]}).encode(), "candidates[0].release_year"),
]


@pytest.mark.parametrize("body,where", BIG, ids=[f"big{i}" for i in range(len(BIG))])
def test_numbers_beyond_float64_are_422_naming_the_field(client, body, where):
    r = score(client, body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert where in detail and "float64" in detail, detail
    assert len(detail) < 1000, detail  # the 400-digit number is not echoed back


def test_an_integer_literal_too_long_to_parse_is_422(client):
    r = score(client, b'{"candidates": [{"release_year": ' + b"7" * 5000 + b"}]}")
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"], r.text


@pytest.mark.parametrize(
    "cand",
    [
        {"release_year": 1e308},
        {"release_year": -1e308},
        {"release_year": MAX_FLOAT},
        {"release_year": -0.0},
        {"release_year": int(MAX_FLOAT)},
        {"release_year": -(2**1000)},
        {"movie_id": 2**64},
        {"movie_id": -(2**63) - 1},
        {"movie_id": 10**300},
        {"movie_id": 5e-324},
        {"genres": [2**70, 1e300]},
        {"movie_id": True},
        {"genres": [False, None, -0.0]},
        {"movie_id": -17976931348623157 * 10**292 - 1},
    ],
    ids=lambda c: "-".join(f"{k}={str(v)[:12]}" for k, v in c.items()),
)
def test_numbers_within_float64_are_scored(client, cand):
    _scores_ok(score(client, {"request": {"age": 1e308, "user_id": 2**100}, "candidates": [cand, {}]}), 2)


def _json_values():
    from hypothesis import strategies as st

    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(2**1100), max_value=2**1100),
        st.sampled_from([int(MAX_FLOAT), -int(MAX_FLOAT), int(MAX_FLOAT) + 1, 2**63, -(2**63) - 1, 0]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([MAX_FLOAT, -MAX_FLOAT, 5e-324, -0.0]),
        st.text(max_size=12),
        st.sampled_from(["1e999", "inf", "-inf", "nan", "1990", "", " ", "-0"]),
    )
    return st.one_of(scalar, st.lists(scalar, max_size=4))


def _too_big(v) -> bool:
    if isinstance(v, list):
        return any(_too_big(x) for x in v)
    return type(v) is int and abs(v) > MAX_FLOAT


def test_random_values_of_the_real_inputs_are_200_or_a_422_naming_them(server):
    """Property: any JSON value under the model's own input names is scored or refused by name, never a 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    inputs = [
        "user_id",
        "age",
        "gender",
        "occupation",
        "zip_prefix",
        "movie_id",
        "genres",
        "title_words",
        "release_year",
    ]
    features = st.dictionaries(st.sampled_from(inputs), _json_values(), max_size=len(inputs))

    with httpx.Client(base_url=server.url, timeout=30, limits=httpx.Limits(max_connections=1)) as c:

        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(request=features, candidates=st.lists(features, min_size=1, max_size=4))
        def check(request, candidates):
            r = score(c, {"request": request, "candidates": candidates})
            too_big = [k for k, v in request.items() if _too_big(v)] + [
                k for cand in candidates for k, v in cand.items() if _too_big(v)
            ]
            if too_big:
                assert r.status_code == 422 and "beyond the float64 range" in r.json()["detail"], r.text
                assert any(k in r.json()["detail"] for k in too_big), r.text
            elif r.status_code == 422:
                detail = r.json()["detail"]
                if detail.startswith("bad feature value: input '"):  # sent in the other scope's place
                    assert any(f"input '{k}' sent in request: " in detail for k in request) or any(
                        f"input '{k}' sent in candidates[{i}]: " in detail
                        for i, cand in enumerate(candidates)
                        for k in cand
                    ), detail
                else:
                    assert detail.startswith("bad feature value: field '"), detail
                    assert ", request:" in detail or ", candidates[" in detail, detail
            else:
                _scores_ok(r, len(candidates))

        check()


def test_a_boolean_where_a_number_is_bucketized_is_422(client):
    for body, where in [
        ({"request": {"age": True}, "candidates": [{}]}, "age_bucket"),
        ({"candidates": [{"release_year": False}]}, "release_year"),
    ]:
        r = score(client, body)
        assert r.status_code == 422 and f"field '{where}'" in r.json()["detail"], r.text


def test_version_may_be_an_integral_float(client):
    _scores_ok(score(client, {"candidates": [{}], "version": 1.0}), 1)
    for v, status in [(1.5, 422), (2.0, 404), (-1.0, 422), (True, 422), ("1", 422)]:
        assert score(client, {"candidates": [{}], "version": v}).status_code == status, v


# -- item 3: a 500 is clean and the connection survives ---------------------------------------------------------
def test_unexpected_error_is_a_generic_500_on_a_connection_that_survives(server, caplog):
    # one connection at most: the client's port before and after shows the connection was kept
    with httpx.Client(base_url=server.url, timeout=30, limits=httpx.Limits(max_connections=1)) as c:
        port = c.get("/test-only/port").json()["port"]
        with caplog.at_level(logging.ERROR, logger="offgraph.server"):
            r = c.get("/test-only/raise")
        assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
        assert SECRET not in r.text and str(server.models) not in r.text and "RuntimeError" not in r.text, r.text
        assert "internal error" in r.json()["detail"]
        assert r.headers.get("connection", "").lower() != "close"
        assert c.get("/test-only/port").json()["port"] == port  # the same keep-alive connection
        assert score(c, {"candidates": [{}]}).status_code == 200
        assert c.get("/test-only/port").json()["port"] == port
        metrics = c.get("/metrics").text
    assert SECRET in caplog.text and "Traceback" in caplog.text  # the traceback goes to the log
    assert re.search(r'offgraph_http_errors_total\{code="500",model="",route="/test-only/raise"\} 1\.0', metrics), [
        ln for ln in metrics.splitlines() if "code=" in ln
    ]


# -- item 10: content types ---------------------------------------------------------------------------------------
def test_score_needs_a_json_content_type(client):
    body = json.dumps({"candidates": [{"movie_id": 1}]}).encode()
    for ctype in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
    ):
        r = client.post("/v1/models/ml:score", content=body, headers={"content-type": ctype})
        assert r.status_code == 415, (ctype, r.text)
        assert ctype.split(";")[0] in r.json()["detail"] and "application/json" in r.json()["detail"]
    for ctype in ("application/json", "application/json; charset=utf-8", "application/problem+json"):
        _scores_ok(client.post("/v1/models/ml:score", content=body, headers={"content-type": ctype}), 1)
    # no Content-Type at all: read as JSON (as FastAPI does)
    _scores_ok(client.post("/v1/models/ml:score", content=body, headers={"content-type": ""}), 1)


# -- item 9: admin authenticates before it parses ------------------------------------------------------------------
@pytest.mark.parametrize(
    "content,ctype",
    [
        (b'{"version": ', "application/json"),
        (b"\xff\xfe", "application/json"),
        (b'{"version": "x"}', "application/json"),
        (b"version=1", "application/x-www-form-urlencoded"),
        (b"[]", "application/json"),
    ],
)
def test_admin_load_authenticates_before_parsing(client, content, ctype):
    for headers, status in [({}, 401), ({"Authorization": "Bearer wrong"}, 401)]:
        r = client.post("/v1/models/ml:load", content=content, headers={"content-type": ctype, **headers})
        assert r.status_code == status, (headers, r.text)
    r = client.post("/v1/models/ml:load", content=content, headers={"content-type": ctype, **ADMIN})
    assert r.status_code in (415, 422), r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"], r.json()
    if ctype == "application/json":
        assert r.status_code == 422 and r.json()["detail"].startswith("invalid load body"), r.text


def test_admin_load_without_a_body_follows_the_newest_version(client):
    r = client.post("/v1/models/ml:load", headers=ADMIN)
    assert r.status_code == 200 and r.json()["policy"] == "latest" and r.json()["loaded"]["version"] == 1, r.text


# -- each body's own wording; one model-name rule on every route -------------------------------------------------
@pytest.mark.parametrize(
    "path,body,headers,words",
    [
        (
            "/v1/models/ml:load",
            {"versoin": 2},
            ADMIN,
            "versoin: unknown field 'versoin' in the load body; expected 'version'",
        ),
        (
            "/v1/models/ml:score",
            {"candidates": [{}], "canddiates": []},
            {},
            "canddiates: unknown field 'canddiates' in the score body; expected 'request', 'candidates', 'version' or 'label'",
        ),
    ],
)
def test_validation_errors_speak_of_the_routes_own_body(client, path, body, headers, words):
    r = client.post(path, json=body, headers=headers)
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    if path.endswith(":load"):  # nothing of the score body's wording
        assert r.json()["detail"].startswith("invalid load body: ") and "candidates" not in r.text, r.text
        assert "'request'" not in r.text, r.text


BAD_NAMES = [
    "ml%0a",
    "ml%0A",
    "ml%0d",
    "ml%0d%0a",
    "%0aml",
    "ml%00",
    "ml%09",
    "ml%20",
    "ml%0b",
    "ml%0c",
    "ml%7f",
    "ml%c2%85",
    "ml%e2%80%a8",
    "m%0al",
]
NAME_ROUTES = [
    ("GET", "/v1/models/{}", None),
    ("POST", "/v1/models/{}:score", {"candidates": [{}]}),
    ("POST", "/v1/models/{}:load", {}),
    ("POST", "/v1/models/{}:unload", None),
    ("POST", "/v1/models/{}:rollback", None),
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_model_name_with_whitespace_or_a_control_character_is_400_naming_the_rule(client, name):
    for method, path, body in NAME_ROUTES:
        r = client.request(method, path.format(name), json=body, headers=ADMIN)
        assert r.status_code == 400, (method, path, name, r.status_code, r.text)
        detail = r.json()["detail"]
        assert "invalid model name" in detail and "no whitespace or control characters" in detail, detail
    assert client.get("/v1/models/ml").json()["loaded"]["version"] == 1  # nothing was unloaded


def test_a_method_a_route_does_not_take_is_405_with_allow(client):
    for method, path, allow in [
        ("GET", "/v1/models/ml:score", "POST"),
        ("PUT", "/v1/models/ml", "GET"),
        ("GET", "/v1/models/ml:load", "POST"),
        ("DELETE", "/v1/models", "GET"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 405 and allow in r.headers["allow"], (method, path, r.status_code, r.text)
    assert client.get("/v1/models/a:b").status_code == 404  # a name with ':' is no model's


# -- item 9: the published schema ---------------------------------------------------------------------------------
def test_openapi_score_body_accepts_the_documented_example_and_integers(client):
    import jsonschema_rs  # schemathesis' validator

    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/models/{name}:score"]["post"]
    schema = resolve_refs(op["requestBody"]["content"]["application/json"]["schema"], spec)
    validator = jsonschema_rs.Draft202012Validator(schema)
    example = schema["examples"][0]
    assert list(validator.iter_errors(example)) == []
    _scores_ok(score(client, example), len(example["candidates"]))
    for ok in (
        {"candidates": [{"m": 1}]},
        {"candidates": [{"m": [1, 2.5, "a", None, True]}], "version": 3},
        {"candidates": [{"m": MAX_FLOAT, "n": -MAX_FLOAT}]},
    ):
        assert list(validator.iter_errors(ok)) == [], ok
    for bad in (
        {"candidates": [{"m": 2**1024}]},
        {"candidates": [{"m": [[1]]}]},
        {"candidates": []},
        {"candidates": [{"m": {"x": 1}}]},
        {"candidates": [{}], "version": -1},
    ):
        assert list(validator.iter_errors(bad)) != [], bad


def test_openapi_documents_the_error_bodies_the_server_sends(client):
    spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    readiness = {("/readyz", "503"): "/Readiness", ("/v2/health/ready", "503"): "/ServerReady"}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            # the TF Serving and KServe routes answer {"error": ...}; a Content-Length over the limit is refused
            # before any route, with {"detail": ...}
            anchor = bool({"tensorflow serving", "kserve v2"} & set(op.get("tags", ())))
            for code, resp in op["responses"].items():
                if code[0] in "45":
                    schema = resp["content"]["application/json"]["schema"]
                    refs = {s["$ref"].rsplit("/", 1)[1] for s in schema.get("anyOf", [schema])}
                    if (path, code) in readiness:
                        want = {readiness[path, code][1:]}
                    elif anchor:
                        want = {"AnchorError", "ErrorResponse"} if code == "413" else {"AnchorError"}
                    else:
                        want = {"ErrorResponse"}
                    assert refs == want, (path, method, code, refs)
    score_op = spec["paths"]["/v1/models/{name}:score"]["post"]
    assert {"400", "404", "413", "415", "422"} <= set(score_op["responses"])
    assert {"401", "403", "413", "415", "422"} <= set(spec["paths"]["/v1/models/{name}:load"]["post"]["responses"])
    # :load's 422 is a string detail, as sent
    detail = resolve_refs(
        spec["paths"]["/v1/models/{name}:load"]["post"]["responses"]["422"]["content"]["application/json"]["schema"],
        spec,
    )["properties"]["detail"]
    assert detail["type"] == "string"


@pytest.mark.parametrize(
    "name",
    [
        "ml",
        "a",
        "A.b_c-9",
        "x" * 128,
        "a.b.",
        "a..b",
        ".a",
        "-a",
        "a/b",
        "a:b",
        "",
        "x" * 129,
        "é",
        "a b",
        "a\n",
        "a\r\n",
        "a\x00",
        "\na",
        "a\t",
        "a\u2028",
    ],
)
def test_openapi_model_name_pattern_is_the_servers_rule(client, name):
    import jsonschema_rs  # schemathesis' validator: the pattern as a JSON Schema reads it

    from offgraph.modeldir.manifest import ModelDirError, check_model_name

    spec = client.get("/openapi.json").json()
    for path in (
        "/v1/models/{name}",
        "/v1/models/{name}:score",
        "/v1/models/{name}:load",
        "/v1/models/{name}:unload",
        "/v1/models/{name}:rollback",
    ):
        op = next(iter(spec["paths"][path].values()))
        param = next(p for p in op["parameters"] if p["name"] == "name")["schema"]
        documented = jsonschema_rs.Draft202012Validator(param).is_valid(name)
        try:
            check_model_name(name)
            valid = True
        except ModelDirError:
            valid = False
        assert documented == valid, (path, name, param)


# -- item 10: no absolute paths without the admin token -----------------------------------------------------------
def _abs_paths(text: str, server) -> list[str]:
    roots = {
        str(server.models),
        str(server.models.resolve()),
        str(server.models.parent.parent),
    }
    return [r for r in roots if r in text]


def test_model_status_shows_paths_relative_to_models_without_the_token(client, server):
    for path in ("/v1/models", "/v1/models/ml"):
        r = client.get(path)
        assert r.status_code == 200 and _abs_paths(r.text, server) == [], r.text
        ml = r.json()["models"][0] if path == "/v1/models" else r.json()
        reason = ml["refused"][0]["reason"]
        assert "ml/2: dense model checksum mismatch" in reason, reason
        assert ml["loaded"]["training"]["run"] == ".../run", ml["loaded"]["training"]
        # the admin sees the full detail
        full = client.get(path, headers=ADMIN)
        assert str(server.models.resolve()) in full.text or str(server.models) in full.text, full.text
        wrong = client.get(path, headers={"Authorization": "Bearer wrong"})
        assert _abs_paths(wrong.text, server) == []


def test_readiness_and_errors_show_no_absolute_paths(tiny_model, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    shutil.copytree(models / "ml", models / "broken")
    pb = models / "broken" / "1" / "dense" / "saved_model.pb"
    pb.write_bytes(pb.read_bytes() + b"\0")
    srv = ThreadServer(server_config(models), ready=False)  # never ready: 'broken' does not load
    srv.models = models
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            wait_for(lambda: "broken (failed" in c.get("/readyz").json()["detail"], 60, "model 'broken' refused")
            r = c.get("/readyz")
            assert r.status_code == 503 and "broken/1: dense model checksum mismatch" in r.json()["detail"], r.text
            assert _abs_paths(r.text, srv) == [], r.text
            r = c.post("/v1/models/broken:load", json={"version": 1}, headers=ADMIN)
            assert r.status_code == 409 and "checksum mismatch" in r.json()["detail"], r.text
            r = score(c, {"candidates": [{}]}, name="broken")
            assert r.status_code == 404 and _abs_paths(r.text, srv) == [], r.text
    finally:
        srv.stop()

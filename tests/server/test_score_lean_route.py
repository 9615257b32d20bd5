"""The score route's lean path (``offgraph.server.api.routers.score.lean_route``) answers exactly as the documented FastAPI route.

Two real uvicorn servers on the same model: the app as built (its POSTs to the score path taken by the lean
route) and the same app with the lean route removed (every request through FastAPI's route, as before the
lean route). The same requests, valid and hostile, must get the same status, body and content type from both,
and the lean route must be the one that answered them.
"""

import json

import httpx
import pytest
from server_helpers import ThreadServer, copy_models, server_config

PATH = "/v1/models/{name}:score"


@pytest.fixture(scope="module")
def servers(tiny_model, requests_, tmp_path_factory):
    from offgraph.server import create_app
    from offgraph.server.api.routers.score import lean_route

    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("lean") / "models")
    config = server_config(models, max_candidates=20)
    lean_app, plain_app = create_app(config), create_app(config)
    lean = lean_app.router.routes[0]
    assert type(lean) is type(lean_route(config)), "the lean route is the app's first"
    plain_app.router.routes.pop(0)
    calls = []
    handle = lean.handle

    async def counted(scope, receive, send):
        calls.append(scope["path"])
        await handle(scope, receive, send)

    lean.handle = counted
    a, b = ThreadServer(config, app=lean_app), ThreadServer(config, app=plain_app)
    yield a, b, calls
    a.stop()
    b.stop()


def _cases(requests_):
    req, cands = requests_[0]
    ok = json.dumps({"request": req, "candidates": cands[:5]}).encode()
    json_ct = {"content-type": "application/json"}
    return [
        ("ml", ok, json_ct),  # valid
        ("ml", json.dumps({"request": req, "candidates": cands[:1], "version": 1}).encode(), json_ct),
        ("ml", ok, {}),  # no content type: read as JSON
        ("ml", ok, {"content-type": "text/plain"}),  # 415
        ("ml", b'{"candidates": [', json_ct),  # invalid JSON
        ("ml", b'{"candidates": []}', json_ct),  # no candidates
        ("ml", json.dumps({"candidates": [{}] * 21}).encode(), json_ct),  # too many
        ("ml", b'{"candidates": [{"movie_id": NaN}]}', json_ct),
        ("ml", json.dumps({"candidates": [{"movie_id": {"x": 1}}]}).encode(), json_ct),  # nested
        ("ml", json.dumps({"candidates": [{"age": 30}]}).encode(), json_ct),  # request input in a candidate
        ("ml", json.dumps({"request": req, "candidates": cands[:2], "version": 99}).encode(), json_ct),  # 404
        ("ml", json.dumps({"request": req, "candidates": cands[:2], "label": "nope"}).encode(), json_ct),
        ("ml", json.dumps({"candidates": [{}], "extra": 1}).encode(), json_ct),  # unknown top-level key
        ("nosuch", ok, json_ct),  # unknown model: 404
        ("a%20b", ok, json_ct),  # invalid name: 400
        ("nosuch", b"{", json_ct),  # a bad body is refused before the model is looked up, on both
    ]


def test_lean_route_answers_as_the_documented_route(servers, requests_):
    a, b, calls = servers
    statuses = []
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url, timeout=30) as cb:
        for name, body, headers in _cases(requests_):
            before = len(calls)
            ra = ca.post(f"/v1/models/{name}:score", content=body, headers=headers)
            rb = cb.post(f"/v1/models/{name}:score", content=body, headers=headers)
            assert len(calls) == before + 1, "the lean route answered"
            assert (ra.status_code, ra.headers.get("content-type")) == (rb.status_code, rb.headers.get("content-type"))
            assert ra.json() == rb.json(), (name, body[:80])
            assert ra.headers.get("x-request-id") and rb.headers.get("x-request-id")
            statuses.append(ra.status_code)
    # the cases reach every answer the route gives
    assert {200, 400, 404, 415, 422} <= set(statuses), statuses


def test_other_methods_fall_through_to_the_documented_route(servers):
    a, b, calls = servers
    before = len(calls)
    for method in ("GET", "PUT", "DELETE"):
        ra = httpx.request(method, f"{a.url}/v1/models/ml:score", timeout=30)
        rb = httpx.request(method, f"{b.url}/v1/models/ml:score", timeout=30)
        assert ra.status_code == rb.status_code == 405
        assert ra.headers["allow"] == rb.headers["allow"] == "POST"
        assert ra.json() == rb.json()
    assert len(calls) == before


def test_lean_route_counts_errors_by_the_route_template(servers):
    a, _, _ = servers
    with httpx.Client(base_url=a.url, timeout=30) as c:
        assert c.post("/v1/models/ml:score", content=b"{", headers={"content-type": "application/json"}).status_code
        text = c.get("/metrics").text
    line = f'offgraph_http_errors_total{{code="422",model="ml",route="{PATH}"}}'
    assert any(row.startswith(line) and float(row.split()[-1]) >= 1 for row in text.splitlines()), text[-2000:]


def test_lean_route_is_not_published(servers):
    a, _, _ = servers
    paths = httpx.get(f"{a.url}/openapi.json", timeout=30).json()["paths"]
    assert list(paths[PATH]) == ["post"]
    assert paths[PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]

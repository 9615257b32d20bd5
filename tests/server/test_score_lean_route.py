"""The score route is one route (``offgraph.server.api.routers.score.build_route``): documented in OpenAPI and
answering without FastAPI's dependency solving (``_ScoreRoute.answer``).

A real uvicorn server: valid and hostile requests get the documented statuses and error bodies from that one
route, another method its 405 naming the allowed one, its errors are counted under the route template, and
OpenAPI publishes its POST with the pydantic body schema.
"""

import json

import httpx
import pytest
from server_helpers import ThreadServer, copy_models, server_config

PATH = "/v1/models/{name}:score"


@pytest.fixture(scope="module")
def server(tiny_model, requests_, tmp_path_factory):
    from offgraph.server import create_app
    from offgraph.server.api.routers.score import _ScoreRoute

    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("lean") / "models")
    config = server_config(models, max_candidates=20)
    app = create_app(config)
    routes = [r for r in app.router.routes if getattr(r, "path", None) == PATH]
    assert len(routes) == 1 and isinstance(routes[0], _ScoreRoute), routes
    route = routes[0]
    calls = []
    answer = route.answer

    async def counted(request):
        calls.append(request.url.path)
        return await answer(request)

    route.answer = counted
    from starlette.routing import request_response

    route.app = request_response(counted)
    a = ThreadServer(config, app=app)
    yield a, calls
    a.stop()


def _cases(requests_):
    req, cands = requests_[0]
    ok = json.dumps({"request": req, "candidates": cands[:5]}).encode()
    json_ct = {"content-type": "application/json"}
    return [
        ("ml", ok, json_ct, 200, None),  # valid
        ("ml", json.dumps({"request": req, "candidates": cands[:1], "version": 1}).encode(), json_ct, 200, None),
        ("ml", ok, {}, 200, None),  # no content type: read as JSON
        ("ml", ok, {"content-type": "text/plain"}, 415, "Content-Type 'text/plain' is not supported"),
        ("ml", b'{"candidates": [', json_ct, 422, "score body"),  # invalid JSON
        ("ml", b'{"candidates": []}', json_ct, 422, "candidates"),  # no candidates
        ("ml", json.dumps({"candidates": [{}] * 21}).encode(), json_ct, 422, "at most 20"),  # too many
        ("ml", b'{"candidates": [{"movie_id": NaN}]}', json_ct, 422, "score body"),
        ("ml", json.dumps({"candidates": [{"movie_id": {"x": 1}}]}).encode(), json_ct, 422, "candidates"),  # nested
        (
            "ml",
            json.dumps({"candidates": [{"age": 30}]}).encode(),
            json_ct,
            422,
            "'age'",
        ),  # request input in a candidate
        ("ml", json.dumps({"request": req, "candidates": cands[:2], "version": 99}).encode(), json_ct, 404, "99"),
        ("ml", json.dumps({"request": req, "candidates": cands[:2], "label": "nope"}).encode(), json_ct, 404, "nope"),
        ("ml", json.dumps({"candidates": [{}], "extra": 1}).encode(), json_ct, 422, "extra"),  # unknown top-level key
        ("nosuch", ok, json_ct, 404, "nosuch"),  # unknown model
        ("a%20b", ok, json_ct, 400, None),  # invalid name
        ("nosuch", b"{", json_ct, 422, None),  # a bad body is refused before the model is looked up
        ("nosuch", b'{"candidates": [[1]]}', json_ct, 422, "candidates"),  # its candidates too (left as sent)
        ("a%20b", b'{"candidates": [{"m": {"x": 1}}]}', json_ct, 422, "candidates"),
        ("ml", b'{"candidates": [{"m": [[1]]}], "version": 99}', json_ct, 422, "candidates"),
    ]


def test_the_one_route_answers_every_case(server, requests_):
    a, calls = server
    with httpx.Client(base_url=a.url, timeout=30) as c:
        for name, body, headers, status, words in _cases(requests_):
            before = len(calls)
            r = c.post(f"/v1/models/{name}:score", content=body, headers=headers)
            assert len(calls) == before + 1, "the route's lean answer answered"
            assert r.status_code == status, (name, body[:80], r.text)
            assert r.headers.get("content-type") == "application/json" and r.headers.get("x-request-id")
            if status == 200:
                assert len(r.json()["scores"]) == len(json.loads(body)["candidates"])
            else:
                assert words is None or words in r.text, (words, r.text)


def test_other_methods_are_the_routes_405(server):
    a, calls = server
    before = len(calls)
    for method in ("GET", "PUT", "DELETE"):
        r = httpx.request(method, f"{a.url}/v1/models/ml:score", timeout=30)
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        msg = f"method {method} is not allowed on /v1/models/ml:score"
        assert r.json() == {"error": msg, "detail": msg}
    assert len(calls) == before


def test_the_route_counts_errors_by_its_template(server):
    a, _ = server
    with httpx.Client(base_url=a.url, timeout=30) as c:
        assert c.post("/v1/models/ml:score", content=b"{", headers={"content-type": "application/json"}).status_code
        text = c.get("/metrics").text
    line = f'offgraph_http_errors_total{{code="422",model="ml",route="{PATH}"}}'
    assert any(row.startswith(line) and float(row.split()[-1]) >= 1 for row in text.splitlines()), text[-2000:]


def test_the_route_is_published_once(server):
    a, _ = server
    paths = httpx.get(f"{a.url}/openapi.json", timeout=30).json()["paths"]
    assert list(paths[PATH]) == ["post"]
    op = paths[PATH]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["properties"]["candidates"]["maxItems"] == 20
    assert [p["name"] for p in op["parameters"]] == ["name"] and "Ids-only requests" in op["description"]

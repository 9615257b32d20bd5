"""The client's results and errors: the same fields as the server's published models, answers read
into typed errors, and ``import offgraph.client`` light."""

import dataclasses
import email.utils
import subprocess
import sys
import time

import httpx
import pytest

import offgraph
from offgraph import client
from offgraph.client import results
from offgraph.client.errors import error_for, retry_after_seconds
from offgraph.client.routes import Call
from offgraph.server.api import schemas

PAIRS = [
    (results.ScoreResult, schemas.ScoreResponse),
    (results.ModelStatus, schemas.ModelStatus),
    (results.LoadedVersion, schemas.LoadedVersion),
    (results.RefusedVersion, schemas.RefusedVersion),
    (results.FeatureTable, schemas.FeatureTableStatus),
    (results.ModelVersionStatus, schemas.ModelVersionStatus),
    (results.VersionStatusDetail, schemas.VersionStatusDetail),
    (results.Readiness, schemas.Readiness),
]


@pytest.mark.parametrize("ours,server", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_results_have_the_fields_of_the_servers_models(ours, server):
    mine = {f.name for f in dataclasses.fields(ours)}
    theirs = set(server.model_fields)
    assert mine == theirs, f"add {sorted(theirs - mine)} to / remove {sorted(mine - theirs)} from {ours.__qualname__}"
    required = {n for n, f in server.model_fields.items() if f.is_required()}
    defaulted = {f.name for f in dataclasses.fields(ours) if f.default is not dataclasses.MISSING} | {
        f.name for f in dataclasses.fields(ours) if f.default_factory is not dataclasses.MISSING
    }
    assert not (required & defaulted), "a field the server always sends needs no default"


def _response(status: int, body, headers=None) -> httpx.Response:
    kw = {"json": body} if not isinstance(body, str) else {"text": body}
    return httpx.Response(status, headers=headers, request=httpx.Request("GET", "http://h/x"), **kw)


@pytest.mark.parametrize(
    "status,kind",
    [
        (400, client.InvalidRequest),
        (401, client.Unauthorized),
        (403, client.Unauthorized),
        (404, client.NotFound),
        (409, client.ApiError),
        (413, client.TooLarge),
        (422, client.InvalidRequest),
        (500, client.ApiError),
        (503, client.Unavailable),
    ],
)
def test_each_status_has_its_error_with_the_servers_message(status, kind):
    err = error_for(_response(status, {"detail": "what is wrong"}))
    assert type(err) is kind and (err.status, err.message, err.body) == (
        status,
        "what is wrong",
        {"detail": "what is wrong"},
    )


def test_messages_of_other_bodies():
    assert error_for(_response(404, {"error": "tf-serving style"})).message == "tf-serving style"
    assert error_for(_response(503, "Service Unavailable")).message == "Service Unavailable"  # uvicorn's plain text
    assert error_for(_response(500, {"x": 1})).message == "Internal Server Error"
    assert error_for(_response(503, {}, {"retry-after": "2"})).retry_after == 2.0


def test_retry_after_as_seconds_or_date():
    assert retry_after_seconds("0") == 0 and retry_after_seconds("1.5") == 1.5 and retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None and retry_after_seconds("-3") == 0
    later = retry_after_seconds(email.utils.formatdate(time.time() + 30, usegmt=True))
    assert later is not None and 25 < later <= 30


def test_a_success_the_client_cannot_read_is_an_api_error():
    call = Call("GET", "/v1/models", lambda d: d["models"])
    with pytest.raises(client.ApiError, match="unexpected answer to GET /v1/models") as e:
        call.result(_response(200, "# HELP not json"))
    assert e.value.status == 200 and e.value.body == "# HELP not json"
    with pytest.raises(client.ApiError, match="KeyError"):
        call.result(_response(200, {"other": []}))


def test_offgraph_exposes_the_clients():
    assert offgraph.Client is client.Client and offgraph.AsyncClient is client.AsyncClient
    with pytest.raises(AttributeError, match="no attribute 'Clients'"):
        _ = offgraph.Clients  # type: ignore[attr-defined]


def test_importing_the_client_loads_no_heavy_module():
    code = (
        "import sys, offgraph\n"
        "before = 'httpx' in sys.modules\n"
        "offgraph.Client\n"
        "heavy = sorted(m for m in ('tensorflow', 'numpy', 'pyarrow', 'rocksdict', 'fastapi', 'pydantic',"
        " 'offgraph.server', 'offgraph.scoring') if m in sys.modules)\n"
        "print(before, heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False []"

"""/docs and /redoc render in a real headless Chromium from the server's own assets, with no other host reachable:
a real uvicorn on 127.0.0.1 serving the tiny real model (conftest's ``tiny_model``).

Chromium resolves no host but 127.0.0.1 (``--host-resolver-rules``), so a page that needs a CDN stays blank;
the DOM it dumps after the page's JavaScript ran must hold the score operation, and with the operation
opened (Swagger UI's deep link) or in ReDoc's samples, the served model's own example body. The served
HTML must name no http(s) URL of another host. Chromium is Debian's ``chromium`` (``make test`` installs it:
tests/parts.py); without it the browser tests fail, unless OFFGRAPH_TEST_WITHOUT=chromium asks to run without.
"""

import re
import shutil
import subprocess

import httpx
import pytest
from parts import need
from server_helpers import client, model_server  # noqa: F401 - client: a fixture

SCORE_PATH = "/v1/models/{name}:score"
SCORE_SUMMARY = "Score candidates"
ML_EXAMPLE_ID = "movie_id-1"
"""A value of the tiny model's own example body (``offgraph.server.api.body_examples``), in no other example."""
BROWSER_TIMEOUT_S = 120
URL = re.compile(r"https?://[^\s\"'<>()]+")


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with model_server(tiny_model[0], tmp_path_factory.mktemp("docs"), max_candidates=20) as srv:
        yield srv


@pytest.fixture(scope="module")
def chromium() -> str:
    need("chromium")  # `make test` installs it (tests/parts.py)
    path = shutil.which("chromium")
    assert path is not None
    return path


def _rendered(chromium: str, url: str, profile) -> str:
    """The DOM of ``url`` once its scripts ran (10 s of the page's virtual time), every host but 127.0.0.1
    unresolvable; zero-width spaces (Swagger UI's break points in paths) removed."""
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-proxy-server",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.replace("\u200b", "")


def test_docs_pages_name_no_other_host(server, client):
    for page in ("/docs", "/redoc"):
        r = client.get(page)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"], (page, r.text[:300])
        assets = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert assets, r.text  # the page loads its script from somewhere
        for asset in assets:
            assert not URL.match(asset), (page, asset)  # a path on this server, never a CDN
            assert client.get(asset).status_code == 200, (page, asset)
        foreign = [u for u in URL.findall(r.text) if not u.startswith(server.url)]
        assert foreign == [], (page, foreign)
    assert client.get("/docs/oauth2-redirect").status_code == 200


def test_swagger_ui_renders_the_score_operation_offline(chromium, server, tmp_path):
    dom = _rendered(chromium, f"{server.url}/docs", tmp_path / "profile")
    assert f'data-path="{SCORE_PATH}"' in dom, dom[-3000:]
    assert SCORE_SUMMARY in dom, dom[-3000:]
    # the operation opened by its deep link: the request body's example is the served model's own
    op = httpx.get(f"{server.url}/openapi.json").json()["paths"][SCORE_PATH]["post"]
    dom = _rendered(chromium, f"{server.url}/docs#/scoring/{op['operationId']}", tmp_path / "profile")
    assert SCORE_SUMMARY in dom and ML_EXAMPLE_ID in dom, dom[-3000:]


def test_redoc_renders_the_score_operation_offline(chromium, server, tmp_path):
    dom = _rendered(chromium, f"{server.url}/redoc", tmp_path / "profile")
    assert SCORE_SUMMARY in dom, dom[-3000:]
    assert f">{SCORE_PATH}<" in dom, dom[-3000:]
    assert ML_EXAMPLE_ID in dom, dom[-3000:]  # the request sample: the served model's example body

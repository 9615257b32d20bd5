"""``offgraph.Client`` and ``AsyncClient`` against a real ``offgraph serve`` on 127.0.0.1 serving a real exported
model (two versions): the same scores as the raw HTTP answer, typed model status, the server's messages in
typed errors, admin calls with and without the token."""

import asyncio

import httpx
import pytest
from server_helpers import TOKEN, copy_models, copy_version, serve_process, stop_server, wait_for, wait_ready

import offgraph
from offgraph.client import InvalidRequest, NotFound, Readiness, Retries, ScoreResult, TooLarge, Unauthorized

ONE_TRY = Retries(attempts=1)


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """(base URL, MODELS) of `offgraph serve` with the admin token, on ml versions 1 and 2 (2 served)."""
    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("client") / "models")
    copy_version(models / "ml" / "1", models / "ml" / "2")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, url = serve_process(
        models, log, "--admin-token", TOKEN, "--poll-seconds", "0.2", "--memory-mb", "64", "--warmup-rows", "1000"
    )
    try:
        wait_ready(url, 120, proc, log=str(log))
        yield url, models
    finally:
        stop_server(proc, 60)


@pytest.fixture(scope="module")
def raw(served):
    with httpx.Client(base_url=served[0], timeout=30) as c:
        yield c


def test_scores_are_the_raw_answers(served, raw, requests_):
    with offgraph.Client(served[0]) as c:
        for request, candidates in requests_[:5]:
            got = c.score("ml", request, candidates)
            want = raw.post("/v1/models/ml:score", json={"request": request, "candidates": candidates}).json()
            assert isinstance(got, ScoreResult)
            assert got.scores == want["scores"] and len(got.scores) == len(candidates)
            assert (got.model, got.version, got.score_kind) == ("ml", 2, want["score_kind"])
            assert (got.unknown_candidates, got.unknown_request) == (
                want["unknown_candidates"],
                want["unknown_request"],
            )
        assert c.score("ml", request, candidates, version=2).scores == want["scores"]


def test_models_and_model_are_the_raw_status(served, raw):
    with offgraph.Client(served[0]) as c:
        (listed,) = c.models()
        one = c.model("ml")
    want = raw.get("/v1/models/ml").json()
    for m in (listed, one):
        assert (m.name, m.state, m.policy, m.versions_on_disk) == ("ml", "serving", "latest", [1, 2])
        assert m.loaded is not None and m.loaded.version == 2 and m.loaded.total_rows == want["loaded"]["total_rows"]
        assert m.loaded.row_counts == want["loaded"]["row_counts"] and m.inputs == want["inputs"]
        assert m.loaded.store["cache_hits"] is not None and m.refused == []
        assert (m.model_version_status[0].version, m.model_version_status[0].state) == ("2", "AVAILABLE")
        assert [(v.version, v.state, v.status.error_code) for v in m.model_version_status] == [
            (v["version"], v["state"], v["status"]["error_code"]) for v in want["model_version_status"]
        ]


def test_errors_carry_the_servers_message(served, raw, requests_):
    request, candidates = requests_[0]
    with offgraph.Client(served[0], retries=ONE_TRY) as c:
        with pytest.raises(NotFound) as e:
            c.score("nope", request, candidates)
        want = raw.post("/v1/models/nope:score", json={"request": request, "candidates": candidates}).json()
        assert e.value.status == 404 and e.value.message == want["detail"] and "unknown model 'nope'" in str(e.value)
        with pytest.raises(NotFound, match="version 7 of model 'ml' is not loaded"):
            c.score("ml", request, candidates, version=7)
        with pytest.raises(NotFound):
            c.model("nope")

        with pytest.raises(InvalidRequest) as e:
            c.score("ml", {**request, "age": float("nan")}, candidates)
        assert e.value.status == 422 and "request.age" in e.value.message and "NaN" in e.value.message
        assert [x["loc"] for x in e.value.errors] == ["request.age"]
        with pytest.raises(InvalidRequest, match="candidates"):
            c.score("ml", request, [])
        with pytest.raises(InvalidRequest) as e:
            c.model("a b")  # not a model name: 400 naming the rule
        assert e.value.status == 400
        with pytest.raises(TooLarge) as e:
            c.score("ml", request, [{"title_words": ["x" * (9 << 20)]}])  # over the default --max-body-mb 8
        assert e.value.status == 413 and "8" in e.value.message


def test_admin_calls_need_the_token(served):
    url, _ = served
    with offgraph.Client(url) as c:
        for call in (lambda: c.load("ml", 1), lambda: c.rollback("ml"), lambda: c.unload("ml")):
            with pytest.raises(Unauthorized) as e:
                call()
            assert e.value.status == 401 and "Authorization: Bearer" in e.value.message
        with pytest.raises(Unauthorized, match="wrong admin token"):
            c.rollback("ml", token="not-" + TOKEN)
        assert c.model("ml").loaded.version == 2  # nothing changed

        pinned = c.load("ml", 1, token=TOKEN)
        assert (pinned.policy, pinned.loaded.version, pinned.previous_version) == ("pinned", 1, 2)
        back = c.rollback("ml", token=TOKEN)
        assert (back.policy, back.loaded.version) == ("pinned", 2)
        with pytest.raises(NotFound, match="9"):
            c.load("ml", 9, token=TOKEN)

    with offgraph.Client(url, admin_token=TOKEN) as c:  # the client's token
        assert c.unload("ml").policy == "unloaded"
        assert c.load("ml").policy == "latest"  # follow the newest again
        wait_for(lambda: c.ready().ready, 60, "ml served again")
        assert c.model("ml").loaded.version == 2


def test_probes(served):
    with offgraph.Client(served[0]) as c:
        assert c.healthy()
        ready = c.ready()
    assert ready == Readiness(ready=True, models={"ml": "serving"}, detail="every model is serving")


def test_async_client_scores_and_raises_as_the_sync_one(served, requests_):
    request, candidates = requests_[1]

    async def run():
        async with offgraph.AsyncClient(served[0], retries=ONE_TRY) as c:
            got = await asyncio.gather(*(c.score("ml", request, candidates) for _ in range(4)))
            with pytest.raises(NotFound) as e:
                await c.model("nope")
            return got, await c.ready(), e.value

    got, ready, err = asyncio.run(run())
    with offgraph.Client(served[0]) as c:
        want = c.score("ml", request, candidates)
    assert all(g == want for g in got) and ready.ready and err.status == 404 and "nope" in err.message

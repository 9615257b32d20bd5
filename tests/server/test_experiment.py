"""Experiments through a real server: ``PUT``/``GET``/``DELETE /v1/models/{name}/experiment`` and ``:score``.

The tiny model serves ml/1, also labelled ``canary``; the experiment splits users over three arms: version 1
(0.8), the canary label (0.1) and the prior arm (0.1). Each user's expected arm is computed here from the hash
(xxhash64 of salt and key, top 53 bits) and the ranges [0, .8), [.8, .9), [.9, 1). With two workers, every user
stays in one arm over 20 requests on fresh connections (spread by the kernel over both workers), a weight change
0.1 -> 0.2 of the prior arm moves users only out of the first arm, and the experiment survives a restart.
"""

import json
import re

import httpx
import pytest
import xxhash
from server_helpers import (
    TOKEN,
    ThreadServer,
    copy_models,
    free_port,
    serve_process,
    server_config,
    stop_server,
    wait_ready,
)

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
EXP = "/v1/models/ml/experiment"
SALT = "exp-test"
ARMS = [{"version": 1, "weight": 0.8}, {"label": "canary", "weight": 0.1}, {"prior": True, "weight": 0.1}]


def _point(user: str) -> float:
    return (xxhash.xxh64_intdigest(f"{SALT}\x1f{user}".encode()) >> 11) / 2.0**53


def _expected(user: str, cuts=(0.8, 0.9)) -> str:
    p = _point(user)
    return "v1" if p < cuts[0] else "canary" if p < cuts[1] else "prior"


def _body(requests_, user):
    req, cands = requests_[0]
    return {"request": {**req, "user_id": user}, "candidates": cands[:3]}


def _series(text: str, name: str, **labels) -> float:
    """The value of one series of the exposition ``text`` (labels in any order); 0 when absent."""
    total = 0.0
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("experiment") / "models")
    srv = ThreadServer(server_config(models))
    with httpx.Client(base_url=srv.url, timeout=30, headers=ADMIN) as c:
        assert c.put("/v1/models/ml/labels/canary", json={"version": 1}).status_code == 200
    yield srv
    srv.stop()


def test_requests_are_split_by_user_and_named_by_arm(server, requests_):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get(EXP, headers=ADMIN).status_code == 404
        r = c.put(EXP, json={"arms": ARMS, "sticky_key": "user_id", "salt": SALT}, headers=ADMIN)
        assert r.status_code == 200, r.text
        st = r.json()
        assert [a["arm"] for a in st["arms"]] == ["v1", "canary", "prior"] and st["salt"] == SALT
        assert st["arms"][0]["ranges"] == [[0.0, 0.8]] and st["arms"][2]["ranges"][0][1] == 1.0
        assert c.get(EXP, headers=ADMIN).json() == st

        before = c.get("/metrics").text
        seen = {}
        for i in range(120):
            user = f"user-{i}"
            out = c.post("/v1/models/ml:score", json=_body(requests_, user)).json()
            assert out["arm"] == _expected(user), (user, out)
            seen[out["arm"]] = seen.get(out["arm"], 0) + 1
            if out["arm"] == "prior":
                assert out["version"] is None and out["score_kind"] == "ranking"
                assert out["scores"] == [1.0, 2 / 3, 1 / 3]
            else:
                assert out["version"] == 1
        assert set(seen) == {"v1", "canary", "prior"}, seen

        # a body naming a version or label bypasses the split: no arm in the answer, arm "none" in metrics
        explicit = c.post("/v1/models/ml:score", json={**_body(requests_, "user-1"), "label": "canary"}).json()
        assert "arm" not in explicit and explicit["version"] == 1
        # no sticky key: the first arm, counted
        req, cands = requests_[0]
        keyless = {"request": {k: v for k, v in req.items() if k != "user_id"}, "candidates": cands[:3]}
        assert c.post("/v1/models/ml:score", json=keyless).json()["arm"] == "v1"

        after = c.get("/metrics").text
        for arm, n in seen.items():
            version = "" if arm == "prior" else "1"
            delta = _series(after, "offgraph_arm_requests_total", model="ml", version=version, arm=arm) - _series(
                before, "offgraph_arm_requests_total", model="ml", version=version, arm=arm
            )
            assert delta == n + (arm == "v1"), (arm, delta, n)
            scored = _series(after, "offgraph_arm_scores_count", model="ml", version=version, arm=arm) - _series(
                before, "offgraph_arm_scores_count", model="ml", version=version, arm=arm
            )
            assert scored == 3 * (n + (arm == "v1"))
            assert _series(after, "offgraph_arm_latency_seconds_count", model="ml", version=version, arm=arm) > 0
        # the prior arm's scores 1, 2/3 and 1/3: all in the buckets le=1.0, none at or below 0.3
        prior = dict(model="ml", version="", arm="prior")
        assert _series(after, "offgraph_arm_scores_bucket", le="1.0", **prior) == 3 * seen["prior"]
        assert _series(after, "offgraph_arm_scores_bucket", le="0.5", **prior) == seen["prior"]
        assert _series(after, "offgraph_arm_scores_bucket", le="0.3", **prior) == 0
        assert _series(after, "offgraph_arm_scores_sum", **prior) == pytest.approx(2.0 * seen["prior"])
        assert _series(after, "offgraph_arm_requests_total", model="ml", version="1", arm="none") >= 1
        assert _series(after, "offgraph_experiment_unassigned_total", model="ml") == 1

        r = c.delete(EXP, headers=ADMIN)
        assert r.status_code == 200 and r.json()["salt"] == SALT
        assert "arm" not in c.post("/v1/models/ml:score", json=_body(requests_, "user-1")).json()
        assert c.delete(EXP, headers=ADMIN).status_code == 404


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"arms": [{"version": 1, "weight": 0.5}, {"prior": True, "weight": 0.4}], "sticky_key": "u"}, 422, "sum to 1"),
        ({"arms": [{"version": 1, "weight": 0.5}, {"version": 1, "weight": 0.5}], "sticky_key": "u"}, 422, "twice"),
        ({"arms": [{"version": 1, "label": "canary", "weight": 1}], "sticky_key": "u"}, 422, "exactly one of"),
        ({"arms": [{"version": 1, "weight": 0}], "sticky_key": "u"}, 422, "greater than 0"),
        ({"arms": [{"prior": True, "weight": 1 / 7}] * 7, "sticky_key": "u"}, 422, "at most 6"),
        ({"arms": [{"version": 1, "weight": 1}]}, 422, "sticky_key"),
        ({"arms": [{"version": 1, "weight": 1}], "sticky_key": "u", "extra": 1}, 422, "extra"),
        ({"arms": [{"label": "nope", "weight": 1}], "sticky_key": "u"}, 409, "label 'nope'"),
        ({"arms": [{"version": 7, "weight": 1}], "sticky_key": "u"}, 409, "version 7 of model 'ml' does not serve"),
    ],
)
def test_bad_bodies_are_4xx_naming_the_problem(server, body, status, words):
    r = httpx.put(server.url + EXP, json=body, headers=ADMIN, timeout=30)
    assert r.status_code == status and words in r.text, r.text


def test_the_experiment_needs_the_admin_token(server):
    body = {"arms": [{"version": 1, "weight": 1}], "sticky_key": "u"}
    assert httpx.put(server.url + EXP, json=body, timeout=30).status_code == 401
    assert httpx.get(server.url + EXP, timeout=30).status_code == 401
    assert httpx.put(server.url + "/v1/models/nope/experiment", json=body, headers=ADMIN).status_code == 404


def _arms_of(url: str, requests_, users, times: int) -> dict[str, set[str]]:
    """Each user's arms over ``times`` requests, each on a fresh connection (both workers answer)."""
    out: dict[str, set[str]] = {}
    for _ in range(times):
        for u in users:
            r = httpx.post(url + "/v1/models/ml:score", json=_body(requests_, u), timeout=30)
            assert r.status_code == 200, r.text
            out.setdefault(u, set()).add(r.json()["arm"])
    return out


def test_two_workers_and_a_restart_keep_every_user_in_one_arm(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = ["--workers", "2", "--cache-mb", "16", "--poll-seconds", "0.3", "--log-level", "warning"]
    env = {"OFFGRAPH_ADMIN_TOKEN": TOKEN}
    users = [f"user-{i}" for i in range(60)]
    proc, _ = serve_process(models, tmp_path / "serve.log", *flags, port=port, env=env)
    try:
        wait_ready(url, 120, proc)
        assert httpx.put(url + "/v1/models/ml/labels/canary", json={"version": 1}, headers=ADMIN, timeout=60).is_success
        r = httpx.put(url + EXP, json={"arms": ARMS, "sticky_key": "user_id", "salt": SALT}, headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        arms = _arms_of(url, requests_, users, 20)
        assert all(arms[u] == {_expected(u)} for u in users), arms
        # per-arm series summed over both workers
        text = httpx.get(url + "/metrics", timeout=30).text
        total = sum(_series(text, "offgraph_arm_requests_total", model="ml", arm=a) for a in ("v1", "canary", "prior"))
        assert total == 20 * len(users)

        # the prior arm 0.1 -> 0.2, the same salt: only users of v1 move, to prior ([.7, .8))
        raised = [{"version": 1, "weight": 0.7}, {"label": "canary", "weight": 0.1}, {"prior": True, "weight": 0.2}]
        r = httpx.put(url + EXP, json={"arms": raised, "sticky_key": "user_id"}, headers=ADMIN, timeout=30)
        assert r.status_code == 200 and r.json()["salt"] == SALT, r.text
        moved = _arms_of(url, requests_, users, 2)
        for u in users:
            p = _point(u)
            want = "prior" if 0.7 <= p < 0.8 else _expected(u)
            assert moved[u] == {want}, (u, p, moved[u])
    finally:
        stop_server(proc)
    proc, _ = serve_process(models, tmp_path / "serve.log", *flags, port=port, env=env, append=True)
    try:
        wait_ready(url, 120, proc)
        assert httpx.get(url + EXP, headers=ADMIN, timeout=30).json()["arms"][2]["weight"] == 0.2
        assert _arms_of(url, requests_, users, 3) == moved
    finally:
        stop_server(proc)


def test_the_cli_sets_shows_and_clears_the_experiment(server, requests_, capsys):
    from offgraph.cli import main

    common = ["--url", server.url, "--model", "ml", "--admin-token", TOKEN]
    argv = ["experiment", "set", *common, "--arm", "prior:0.25", "--arm", "label=canary:0.75"]
    assert main([*argv, "--sticky-key", "user_id", "--salt", SALT]) == 0
    st = json.loads(capsys.readouterr().out)
    assert [(a["arm"], a["weight"]) for a in st["arms"]] == [("prior", 0.25), ("canary", 0.75)]
    for user in ("user-1", "user-2", "user-3", "user-4", "user-5"):
        got = httpx.post(server.url + "/v1/models/ml:score", json=_body(requests_, user), timeout=30).json()["arm"]
        assert got == ("prior" if _point(user) < 0.25 else "canary"), user
    assert main(["experiment", "show", *common]) == 0
    assert json.loads(capsys.readouterr().out) == st
    assert main(["experiment", "clear", *common]) == 0
    capsys.readouterr()
    assert main(["experiment", "show", *common]) == 2
    assert "404: model 'ml' has no experiment" in capsys.readouterr().err
    # a bad body's 4xx is printed, naming the problem
    assert main(["experiment", "set", *common, "--arm", "prior:0.5", "--sticky-key", "user_id"]) == 2
    assert "sum to 1" in capsys.readouterr().err

"""Version labels (``stable``, ``canary``): two versions of one model served at once, through a real uvicorn on
127.0.0.1 and a real httpx client (``offgraph.Client``).

The model has two versions that score differently: ml/1 is the tiny model in fp32, ml/2 the same run exported
in int8. A label loads its version beside the default one; a request with the label (``:score``,
``/labels/{label}:predict``) is scored by it, and scores exactly as a library ``Scorer`` of that version
directory does; the others go to the default version (the newest). The versions that serve share the model's
memory budget; labels survive a restart; bad labels are 4xx naming the problem.
"""

import httpx
import numpy as np
import pytest
from server_helpers import TOKEN, ScoreHammer, ThreadServer, copy_models, copy_version, score, server_config, wait_for

from offgraph import Client
from offgraph.client import InvalidRequest, NotFound

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MEMORY_MB = 96.0


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory):
    """MODELS with ml/1 (fp32) and ml/2 (int8, the same training run)."""
    from offgraph.export.export import export_run

    pristine = tiny_model[0]
    models = copy_models(pristine, tmp_path_factory.mktemp("labels") / "models")
    export_run(pristine.parent / "run", models / "ml" / "2", shards=2, quant="int8", progress=False)
    return models


@pytest.fixture(scope="module")
def library(models):
    """Scores of each version by a library Scorer of its directory."""
    from offgraph.scoring.scorer import Scorer

    scorers = {v: Scorer(models / "ml" / str(v)) for v in (1, 2)}
    yield lambda v, req, cands: np.asarray(scorers[v].score(req, cands), dtype=np.float64)
    for s in scorers.values():
        s.close()


def _config(models, **kw):
    # no --cache-mb: the whole budget is split, so that the shares can be checked against it
    return server_config(models, cache_mb=None, memory_mb=MEMORY_MB, **kw)


def _parts(split: dict) -> float:
    """MiB a version's share holds, its parts together (as the server reports them)."""
    return split["model_mb"]


def test_a_label_serves_its_version_beside_the_default_one(models, requests_, library):
    srv = ThreadServer(_config(models))
    hammer = ScoreHammer(srv.url, requests_)  # default requests all along: labels come and go, none fails
    req, cands = requests_[0]
    try:
        with Client(srv.url, admin_token=TOKEN) as c:
            st = c.model("ml")
            assert st.loaded.version == 2 and st.served_versions == [2] and st.labels == {}
            alone = st.loaded.memory["split"]
            assert alone["versions"] == 1 and _parts(alone) <= MEMORY_MB
            hammer.start()

            st = c.set_label("ml", "stable", 1)
            assert st.labels == {"stable": 1} and st.served_versions == [2, 1]
            assert st.loaded.version == 2  # the default stays the newest version
            split = st.loaded.memory["split"]
            assert split["versions"] == 2 and _parts(split) <= MEMORY_MB / 2 + 1e-6
            assert split["row_cache_mb"] < alone["row_cache_mb"]

            # by label, by version and by default: each version scores as its own directory does
            by_label = c.score("ml", req, cands, label="stable")
            assert by_label.version == 1
            np.testing.assert_array_equal(np.asarray(by_label.scores), library(1, req, cands).astype(np.float32))
            default = c.score("ml", req, cands)
            assert default.version == 2
            np.testing.assert_array_equal(np.asarray(default.scores), library(2, req, cands).astype(np.float32))
            assert not np.array_equal(by_label.scores, default.scores)  # the check can tell them apart
            assert c.score("ml", req, cands, 1).scores == by_label.scores

            # TF Serving's label routes
            with httpx.Client(base_url=srv.url, timeout=30) as h:
                r = h.post("/v1/models/ml/labels/stable:predict", json={"instances": cands, "context": req})
                assert r.status_code == 200, r.text
                assert r.json()["predictions"] == by_label.scores
                r = h.get("/v1/models/ml/labels/stable")
                assert r.json() == {
                    "model_version_status": [
                        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
                    ]
                }
                assert h.get("/v1/models/ml/labels/stable/metadata").json()["model_spec"]["version"] == "1"
                assert {s["version"]: s["state"] for s in h.get("/v1/models/ml").json()["model_version_status"]} == {
                    "2": "AVAILABLE",
                    "1": "AVAILABLE",
                }
                r = h.post("/v1/models/ml/labels/nope:predict", json={"instances": cands, "context": req})
                assert r.status_code == 404 and "no label 'nope'" in r.json()["error"]
                assert 'offgraph_model_label_version{label="stable",model="ml"} 1.0' in h.get("/metrics").text

            # a label on the default version needs no second load; moving it retires nothing that serves
            st = c.set_label("ml", "canary", 2)
            assert st.labels == {"stable": 1, "canary": 2} and st.served_versions == [2, 1]
            assert c.score("ml", req, cands, label="canary").scores == default.scores

            # a new version: the default moves on, the labelled ones serve on, three shares
            copy_version(models / "ml" / "1", models / "ml" / "3")
            wait_for(lambda: c.model("ml").loaded.version == 3, 60, "version 3 served by default")
            st = c.model("ml")
            assert st.served_versions == [3, 1, 2]
            assert st.loaded.memory["split"]["versions"] == 3
            assert c.score("ml", req, cands, label="canary").version == 2
            assert c.score("ml", req, cands).version == 3

            # removing labels retires their versions and gives the memory back
            st = c.remove_label("ml", "canary")
            assert st.served_versions == [3, 1] and st.loaded.memory["split"]["versions"] == 2
            with pytest.raises(NotFound, match="no label 'canary'"):
                c.score("ml", req, cands, label="canary")
            with pytest.raises(NotFound, match="version 2 of model 'ml' is not loaded"):
                c.score("ml", req, cands, 2)

            seen = hammer.stop()
            assert {s for s, _ in seen} == {200}, [x for x in seen if x[0] != 200][:5]
            assert {v for _, v in seen} >= {2, 3}
    finally:
        hammer.stop()
        srv.stop()

    # the labels survive a restart: stable's version loads beside the default one again
    srv = ThreadServer(_config(models))
    try:
        with Client(srv.url, admin_token=TOKEN) as c:
            st = wait_for(
                lambda: (lambda s: s if s.served_versions == [3, 1] else None)(c.model("ml")),
                60,
                "version 1 serving beside 3 after the restart",
            )
            assert st.labels == {"stable": 1}
            np.testing.assert_array_equal(
                np.asarray(c.score("ml", req, cands, label="stable").scores), library(1, req, cands).astype(np.float32)
            )
            st = c.remove_label("ml", "stable")
            assert st.labels == {} and st.served_versions == [3]
            assert st.loaded.memory["split"]["versions"] == 1
    finally:
        srv.stop()


def test_bad_labels_are_4xx_naming_the_problem(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    srv = ThreadServer(server_config(models))
    req, cands = requests_[0]
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as h:

            def put(label, body, headers=ADMIN):
                return h.put(f"/v1/models/ml/labels/{label}", json=body, headers=headers)

            assert put("stable", {"version": 1}, headers={}).status_code == 401
            r = put("Stable", {"version": 1})
            assert r.status_code == 400 and "invalid label 'Stable'" in r.json()["detail"]
            r = put("stable", {"version": 9})
            assert r.status_code == 404 and "no complete version 9" in r.json()["detail"]
            r = put("stable", {"version": -1})
            assert r.status_code == 422
            r = put("stable", {})
            assert r.status_code == 422 and "version" in r.text
            r = h.delete("/v1/models/ml/labels/stable", headers=ADMIN)
            assert r.status_code == 404 and "no label 'stable'" in r.json()["detail"]
            for i in range(4):
                assert put(f"l{i}", {"version": 1}).status_code == 200
            r = put("l4", {"version": 1})
            assert r.status_code == 409 and "4 labels already" in r.json()["detail"]
            assert h.get("/v1/models/ml").json()["served_versions"] == [1]  # four labels, one version
            assert score(h, {"request": req, "candidates": cands, "version": 1, "label": "l0"}).status_code == 200
            r = score(h, {"request": req, "candidates": cands, "version": 2, "label": "l0"})
            assert r.status_code == 404 and "label 'l0' of model 'ml' names version 1, not 2" in r.json()["detail"]
            r = h.options("/v1/models/ml/labels/l0")
            assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET, PUT"
            r = score(h, {"request": req, "candidates": cands, "label": "Bad Label"})
            assert r.status_code == 422 and "label" in r.text
            assert score(h, {"request": req, "candidates": cands, "label": "l0"}).json()["version"] == 1
            assert h.post("/v1/models/ml:unload", headers=ADMIN).json()["labels"] == {}
            r = put("stable", {"version": 1})
            assert r.status_code == 409 and "serves no version" in r.json()["detail"]
            assert 'code="5' not in h.get("/metrics").text
        with Client(srv.url, admin_token=TOKEN) as c, pytest.raises(InvalidRequest, match="label"):
            c.score("ml", req, cands, label="Stable")
    finally:
        srv.stop()

"""An experiment splits every protocol's traffic as it splits ``:score``'s: TF Serving's REST ``:predict`` (rows and
columns), KServe v2 REST ``/infer``, gRPC ``Predict`` and ``ModelInfer``, each through a real ``offgraph serve`` and
the real client libraries where a user would use them (tritonclient for ModelInfer, the tensorflow-serving-api stub
for Predict).

ml/1 (fp32) and ml/2 (int8, the same run) are arms beside the prior arm, so the arms' scores differ. For each
user, every protocol names the arm that the hash assigns (computed here: xxhash64 of salt and key, top 53 bits,
over the ranges [0, .4), [.4, .8), [.8, 1)), answers with that arm's version, and its scores equal ``:score``'s for
the same user; a request naming a version bypasses the split; the per-arm series count every protocol."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import xxhash
from grpc_helpers import predict_request, tensors
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import TOKEN, copy_models, serve_process, stop_server, wait_ready
from tensorflow_serving.apis import prediction_service_pb2_grpc

from offgraph.testing.harness import free_port

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SALT = "protocols"
ARMS = [{"version": 1, "weight": 0.4}, {"version": 2, "weight": 0.4}, {"prior": True, "weight": 0.2}]
USERS = [f"user-{i}" for i in range(24)]
PROTOCOLS = ("predict rows", "predict columns", "kserve rest", "grpc predict", "grpc modelinfer")


def _expected(user: str) -> str:
    p = (xxhash.xxh64_intdigest(f"{SALT}\x1f{user}".encode()) >> 11) / 2.0**53
    return "v1" if p < 0.4 else "v2" if p < 0.8 else "prior"


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """(HTTP url, gRPC address): ml/1 fp32 and ml/2 int8, with the experiment set."""
    from offgraph.export.export import export_run

    pristine = tiny_model[0]
    models = copy_models(pristine, tmp_path_factory.mktemp("exp-protocols") / "models")
    export_run(pristine.parent / "run", models / "ml" / "2", shards=2, quant="int8", progress=False)
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("exp-protocols-log") / "serve.log"
    proc, url = serve_process(models, log, "--grpc-port", str(grpc_port), "--admin-token", TOKEN)
    try:
        wait_ready(url, 120, proc, log=str(log))
        # version 1 serves beside the latest (2) through a label: an arm may name it by its version
        r = httpx.put(f"{url}/v1/models/ml/labels/stable", json={"version": 1}, headers=ADMIN, timeout=60)
        assert r.status_code == 200, r.text
        body = {"arms": ARMS, "sticky_key": "user_id", "salt": SALT}
        r = httpx.put(f"{url}/v1/models/ml/experiment", json=body, headers=ADMIN, timeout=60)
        assert r.status_code == 200, r.text
        yield url, f"127.0.0.1:{grpc_port}"
    finally:
        stop_server(proc, 30)


def _arm_requests(text: str) -> dict[tuple[str, str], float]:
    """offgraph_arm_requests_total of model ml by (version, arm), from /metrics (prometheus_client's parser)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "offgraph_arm_requests_total" and s.labels.get("model") == "ml":
                out[(s.labels["version"], s.labels["arm"])] = s.value
    return out


def _answers(http: httpx.Client, address: str, meta: dict, req: dict, cands: list[dict]) -> dict[str, tuple]:
    """(arm, version, scores) of each protocol for one request, as its answer names them."""
    out = {}
    rows = http.post("/v1/models/ml:predict", json={"context": req, "instances": cands})
    assert rows.status_code == 200, rows.text
    j = rows.json()
    out["predict rows"] = (j.get("arm"), j.get("version"), j["predictions"])
    cols = {k: [v] for k, v in req.items()} | {k: [c.get(k) for c in cands] for k in cands[0]}
    columns = http.post("/v1/models/ml:predict", json={"inputs": cols})
    assert columns.status_code == 200, columns.text
    j = columns.json()
    out["predict columns"] = (j.get("arm"), j.get("version"), j["outputs"])
    inputs = [
        {
            "name": n,
            "datatype": d,
            "shape": list(a.shape),
            "data": [x.decode() if isinstance(x, bytes) else x for x in a.flatten().tolist()],
        }
        for n, d, a in tensors(meta, req, cands)
    ]
    kserve = http.post("/v2/models/ml/infer", json={"inputs": inputs})
    assert kserve.status_code == 200, kserve.text
    j = kserve.json()
    version = j.get("model_version")
    out["kserve rest"] = (
        (j.get("parameters") or {}).get("arm"),
        None if version is None else int(version),
        j["outputs"][0]["data"],
    )
    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer, call = stub.Predict.with_call(predict_request(req, cands), timeout=30)
    metadata = dict(call.initial_metadata())
    t = answer.outputs["predictions"]
    version = answer.model_spec.version.value if answer.model_spec.HasField("version") else None
    out["grpc predict"] = (metadata.get("offgraph-arm"), version, np.frombuffer(t.tensor_content, "<f4").tolist())
    client = tgrpc.InferenceServerClient(address)
    grpc_inputs = []
    for n, d, a in tensors(meta, req, cands, once=False):  # request scope repeated per candidate, this time
        x = tgrpc.InferInput(n, list(a.shape), d)
        x.set_data_from_numpy(a)
        grpc_inputs.append(x)
    res = client.infer("ml", grpc_inputs)
    r = res.get_response()
    arm = r.parameters["arm"].string_param if "arm" in r.parameters else None
    out["grpc modelinfer"] = (arm, int(r.model_version) if r.model_version else None, res.as_numpy("scores").tolist())
    client.close()
    return out


def test_every_protocol_is_split_as_score_is(server, requests_):
    url, address = server
    req0, cands0 = requests_[0]
    cands = cands0[:4]
    with httpx.Client(base_url=url, timeout=30) as http:
        meta = http.get("/v2/models/ml").json()
        before = _arm_requests(http.get("/metrics").text)
        seen: dict[str, int] = {}
        for user in USERS:
            req = {**req0, "user_id": user}
            s = http.post("/v1/models/ml:score", json={"request": req, "candidates": cands})
            assert s.status_code == 200, s.text
            arm, version, want = s.json()["arm"], s.json()["version"], s.json()["scores"]
            assert arm == _expected(user), (user, arm)
            if arm == "prior":  # the items' order as sent: (n - i) / n
                assert version is None and want == [1.0, 0.75, 0.5, 0.25]
            else:
                assert version == int(arm[1:])
            seen[arm] = seen.get(arm, 0) + 1
            for protocol, (got_arm, got_version, scores) in _answers(http, address, meta, req, cands).items():
                assert (got_arm, got_version) == (arm, version), (protocol, user)
                # the same arm's version scores the same candidates: :score's scores (float32 on the wire)
                assert np.abs(np.asarray(scores) - np.asarray(want)).max() <= 1e-6, (protocol, user, scores, want)
        assert set(seen) == {"v1", "v2", "prior"}, seen
        after = _arm_requests(http.get("/metrics").text)
        for arm, n in seen.items():
            key = ("" if arm == "prior" else arm[1:], arm)
            # :score and each of the five protocols, once per user of the arm
            assert after.get(key, 0) - before.get(key, 0) == n * (1 + len(PROTOCOLS)), (arm, before, after)


def test_a_request_naming_a_version_bypasses_the_split(server, requests_):
    url, address = server
    req0, cands0 = requests_[0]
    user = next(u for u in USERS if _expected(u) == "prior")  # the split would give it no version at all
    req, cands = {**req0, "user_id": user}, cands0[:3]
    with httpx.Client(base_url=url, timeout=30) as http:
        rows = http.post("/v1/models/ml/versions/2:predict", json={"context": req, "instances": cands}).json()
        assert "arm" not in rows and "version" not in rows and len(rows["predictions"]) == 3
        labelled = http.post(
            "/v1/models/ml/versions/1:predict",
            json={"inputs": {k: [v] for k, v in req.items()} | {k: [c.get(k) for c in cands] for k in cands[0]}},
        ).json()
        assert "arm" not in labelled and len(labelled["outputs"]) == 3
        meta = http.get("/v2/models/ml").json()
        inputs = [
            {
                "name": n,
                "datatype": d,
                "shape": list(a.shape),
                "data": [x.decode() if isinstance(x, bytes) else x for x in a.flatten().tolist()],
            }
            for n, d, a in tensors(meta, req, cands)
        ]
        k = http.post("/v2/models/ml/versions/2/infer", json={"inputs": inputs}).json()
        assert "parameters" not in k and k["model_version"] == "2"
    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer, call = stub.Predict.with_call(predict_request(req, cands, version=1), timeout=30)
    assert "offgraph-arm" not in dict(call.initial_metadata()) and answer.model_spec.version.value == 1

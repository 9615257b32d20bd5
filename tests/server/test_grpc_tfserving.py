"""TF Serving's gRPC API and gRPC health on a real `offgraph serve --grpc-port` process, driven by the
tensorflow-serving-api stubs: Predict's scores against REST `:score`'s for the same candidates (fp32 version 1,
int8 version 2 of the same run; by version and by label), metadata, status, health from start to the drain,
and a hostile-input suite (right codes, never INTERNAL, a valid client's p99 bounded meanwhile)."""

from __future__ import annotations

import shutil
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
from grpc_helpers import NOT_SERVING, SERVING, health, predict, predict_request, rest_scores, tensor, value_tensor
from server_helpers import TOKEN, free_port, serve_process, stop_server, wait_ready
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

pytestmark = pytest.mark.slow
C = grpc.StatusCode
REQ_IN = ("user_id", "age", "gender", "occupation", "zip_prefix")
ITEM_IN = ("movie_id", "genres", "title_words", "release_year")


@pytest.fixture(scope="module")
def versions(tiny_model, tmp_path_factory):
    """MODELS with ml/1 (fp32) and ml/2 (int8: the same run exported again)."""
    from offgraph.export.export import export_run

    pristine, _ = tiny_model
    models = tmp_path_factory.mktemp("grpc") / "models"
    shutil.copytree(pristine, models)
    export_run(pristine.parent / "run", models / "ml" / "2", shards=2, quant="int8", progress=False)
    return models


@pytest.fixture(scope="module")
def server(versions, tmp_path_factory):
    """(base url, gRPC channel, health statuses seen from the process's start until ready)."""
    gport = free_port()
    log = tmp_path_factory.mktemp("grpc_log") / "server.log"
    proc, url = serve_process(versions, log, "--grpc-port", str(gport), "--admin-token", TOKEN)
    # reconnects every 10 ms while the port is not up yet (gRPC's default backoff is a second or more)
    fast = [
        ("grpc.initial_reconnect_backoff_ms", 10),
        ("grpc.min_reconnect_backoff_ms", 10),
        ("grpc.max_reconnect_backoff_ms", 20),
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{gport}", options=fast)
    seen = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # poll from the start: loading, then ready
            status = health(channel)
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == SERVING:
                break
            time.sleep(0.02)
        wait_ready(url, 60, proc, log=str(log))
        yield url, channel, seen
    finally:
        channel.close()
        stop_server(proc)


def test_health_not_serving_while_loading_then_serving(server):
    _, channel, seen = server
    assert seen[-1] == SERVING, seen
    assert NOT_SERVING in seen[: seen.index(SERVING)], seen  # before the models were ready
    assert health(channel, "tensorflow.serving.PredictionService") == SERVING
    assert health(channel, "ml") == SERVING
    assert health(channel, "no-such-model") == C.NOT_FOUND


def test_predict_equals_score_fp32_int8_by_version_and_label(server, requests_):
    url, channel, _ = server
    r = httpx.put(
        f"{url}/v1/models/ml/labels/canary",
        json={"version": 1},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    for request, candidates in requests_[:6]:
        for pick, grpc_pick in (({}, {}), ({"version": 1}, {"version": 1}), ({"label": "canary"}, {"label": "canary"})):
            want = rest_scores(url, request, candidates, **pick)
            out, got = predict(channel, predict_request(request, candidates, **grpc_pick))
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
            assert out.model_spec.version.value == (1 if pick else 2)
    # int8 and fp32 differ: the two versions were really both scored
    request, candidates = requests_[0]
    _, v1 = predict(channel, predict_request(request, candidates, version=1))
    _, v2 = predict(channel, predict_request(request, candidates, version=2))
    assert not np.array_equal(v1, v2)


def test_metadata_and_status(server):
    url, channel, _ = server
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name = "ml"
    out = stub.GetModelMetadata(req, timeout=10)
    sigs = get_model_metadata_pb2.SignatureDefMap()
    assert out.metadata["signature_def"].Unpack(sigs)
    rest = httpx.get(f"{url}/v1/models/ml/metadata", timeout=10).json()
    rest_sig = rest["metadata"]["signature_def"]["signature_def"]["serving_default"]
    sig = sigs.signature_def["serving_default"]
    assert {k: types_pb2.DataType.Name(v.dtype) for k, v in sig.inputs.items()} == {
        k: v["dtype"] for k, v in rest_sig["inputs"].items()
    }
    assert set(sig.inputs) >= set(REQ_IN + ITEM_IN) and list(sig.outputs) == ["predictions"]
    assert out.model_spec.version.value == int(rest["model_spec"]["version"]) == 2

    status_req = get_model_status_pb2.GetModelStatusRequest()
    status_req.model_spec.name = "ml"
    st = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_req, timeout=10)
    rest_st = httpx.get(f"{url}/v1/models/ml", timeout=10).json()["model_version_status"]
    got = [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state)) for s in st.model_version_status]
    assert got == [(int(s["version"]), s["state"]) for s in rest_st]
    assert (2, "AVAILABLE") in got


def _code(channel, req, timeout=30):
    try:
        predict(channel, req, timeout)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return C.OK, ""


def _hostile(requests_) -> list[tuple[str, object, C, str]]:
    request, candidates = requests_[0]
    out = []
    r = predict_request(request, candidates)
    r.inputs["age"].CopyFrom(tensor(["old"], types_pb2.DT_STRING))  # a number input sent as a string
    out.append(("wrong dtype", r, C.INVALID_ARGUMENT, "age"))
    r = predict_request(request, candidates)
    r.inputs["movie_id"].dtype = types_pb2.DT_COMPLEX64
    out.append(("unsupported dtype", r, C.INVALID_ARGUMENT, "movie_id"))
    out.append(("missing inputs", predict_request({}, [{}]), C.INVALID_ARGUMENT, "input"))
    r = predict_request(request, candidates)
    r.inputs["movie_id"].CopyFrom(value_tensor([c["movie_id"] for c in candidates][:-1] or [1, 2]))
    out.append(("shapes disagree", r, C.INVALID_ARGUMENT, "movie_id"))
    r = predict_request(request, candidates)
    r.inputs["movie_id"].tensor_shape.dim[0].size += 3  # shape says more than the values hold
    out.append(("count disagrees", r, C.INVALID_ARGUMENT, "movie_id"))
    big = predict_request(request, [{"movie_id": i} for i in range(100_000)])
    out.append(("100k candidates", big, C.INVALID_ARGUMENT, "at most"))
    r = predict_request(request, candidates)
    r.inputs["title_words"].string_val[0] = b"\xff\xfe"
    out.append(("bad utf-8 list", r, C.INVALID_ARGUMENT, "title_words"))
    r = predict_request(request, candidates)
    r.model_spec.name = "nope"
    out.append(("unknown model", r, C.NOT_FOUND, "unknown model 'nope'"))
    out.append(("unknown version", predict_request(request, candidates, version=99), C.NOT_FOUND, "99"))
    out.append(("unknown label", predict_request(request, candidates, label="nolabel"), C.NOT_FOUND, "nolabel"))
    out.append(("invalid label", predict_request(request, candidates, label="Bad Label!"), C.INVALID_ARGUMENT, "label"))
    r = predict_request(request, candidates)
    r.model_spec.signature_name = "other"
    out.append(("signature", r, C.INVALID_ARGUMENT, "signature"))
    r = predict_request(request, candidates)
    r.inputs["user_id"].CopyFrom(value_tensor([1, 2, *([3] * (len(candidates) - 2))]))  # two values, request scope
    out.append(("request scope conflict", r, C.INVALID_ARGUMENT, "user_id"))
    return out


def test_hostile_inputs_right_codes_never_internal(server, requests_):
    _, channel, _ = server
    for what, req, code, word in _hostile(requests_):
        got, details = _code(channel, req)
        assert got == code, (what, got, details)
        assert word in details, (what, details)
    # 64 MiB: over --max-body-mb (8), refused by gRPC before decoding
    request, candidates = requests_[0]
    r = predict_request(request, candidates)
    r.inputs["pad"].CopyFrom(tensor(["x" * (1 << 20)] * 64, types_pb2.DT_STRING))
    assert _code(channel, r)[0] == C.RESOURCE_EXHAUSTED
    # an expired deadline: never scored, DEADLINE_EXCEEDED (also when it passes while queued)
    assert _code(channel, predict_request(request, candidates), timeout=0.0001)[0] == C.DEADLINE_EXCEEDED


def test_valid_client_p99_under_hostile_load(server, requests_):
    _, channel, _ = server
    request, candidates = requests_[1]
    req = predict_request(request, candidates)

    def p99(n=150):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            predict(channel, req)
            times.append(time.perf_counter() - t)
        return float(np.percentile(times, 99))

    alone = p99()
    hostile = _hostile(requests_)
    stop = threading.Event()
    codes: list = []

    def attack():
        ch = grpc.insecure_channel(channel._channel.target().decode())
        while not stop.is_set():
            for _, r, _, _ in hostile:
                codes.append(_code(ch, r)[0])
        ch.close()

    threads = [threading.Thread(target=attack) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        loaded = p99()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    print(f"valid client p99: alone {alone * 1000:.1f} ms, under 2 hostile clients {loaded * 1000:.1f} ms")
    assert C.INTERNAL not in codes and codes
    assert loaded <= max(4 * alone, alone + 0.05), (alone, loaded)  # 2 cores shared with the hostile clients


def test_drain_health_not_serving_calls_still_answer(versions, requests_, tmp_path):
    gport = free_port()
    proc, url = serve_process(versions, tmp_path / "log", "--grpc-port", str(gport), "--drain-seconds", "4")
    channel = grpc.insecure_channel(f"127.0.0.1:{gport}")
    try:
        wait_ready(url, 120, proc, log=str(tmp_path / "log"))
        t_end = time.monotonic() + 10
        while health(channel) != SERVING and time.monotonic() < t_end:
            time.sleep(0.05)
        assert health(channel) == SERVING
        proc.send_signal(15)
        t_end = time.monotonic() + 3
        while health(channel) != NOT_SERVING and time.monotonic() < t_end:
            time.sleep(0.05)
        assert health(channel) == NOT_SERVING and health(channel, "ml") == NOT_SERVING
        request, candidates = requests_[2]
        _, scores = predict(channel, predict_request(request, candidates))  # still answered during the drain
        assert len(scores) == len(candidates)
        assert proc.wait(30) == 0
    finally:
        channel.close()
        stop_server(proc)


def test_reflection_resolves_every_service_and_a_json_request(server, requests_):
    """What grpcurl does: list the services by reflection, fetch each one's file, build a PredictRequest from JSON
    (protobuf's JSON mapping: int64 as strings, bytes as base64) with the reflected descriptors only, call it."""
    import base64
    import json

    from google.protobuf import descriptor_pool, json_format, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    url, channel, _ = server
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"} <= services
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
    pool = descriptor_pool.DescriptorPool(db)
    for name in services:
        assert pool.FindServiceByName(name).methods, name  # its file is served, not only its name

    request, candidates = requests_[3]
    inputs = {
        "user_id": {
            "dtype": "DT_INT64",
            "tensorShape": {"dim": [{"size": "1"}]},
            "int64Val": [str(request["user_id"])],
        },
        "movie_id": {
            "dtype": "DT_INT64",
            "tensorShape": {"dim": [{"size": str(len(candidates))}]},
            "int64Val": [str(c["movie_id"]) for c in candidates],
        },
        "gender": {
            "dtype": "DT_STRING",
            "tensorShape": {"dim": [{"size": "1"}]},
            "stringVal": [base64.b64encode(request["gender"].encode()).decode()],
        },
    }
    body = json.dumps({"modelSpec": {"name": "ml"}, "inputs": inputs})
    method = pool.FindServiceByName("tensorflow.serving.PredictionService").methods_by_name["Predict"]
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_type.FromString,
    )
    out = call(json_format.Parse(body, request_type()), timeout=10)
    got = np.frombuffer(out.outputs["predictions"].tensor_content, "<f4")
    subset = {"user_id": request["user_id"], "gender": request["gender"]}
    want = rest_scores(url, subset, [{"movie_id": c["movie_id"]} for c in candidates])
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)

"""KServe v2 inference (REST ``/v2/models/{name}[/versions/{v}]/infer`` and gRPC ``inference.GRPCInferenceService``)
and TensorFlow Serving's columnar ``:predict`` (``{"inputs": {...}}``), through a real ``offgraph serve`` process
(HTTP and ``--grpc-port``) with the real clients: ``tritonclient.http`` (``binary_data`` True, its default, and
False), ``tritonclient.grpc`` (``raw_input_contents``, as it sends by default) and httpx.

MODELS holds ml/1 (the tiny model, fp32) and ml/2 (the same run in int8: the default), the label ``canary`` on 1.
The inputs are built from the model's v2 metadata, as a client of the protocol builds them. Every answer must equal
``:score``'s for the same candidates and version within 1e-6 (``:score`` is tested against Keras elsewhere), by
version and by label; bad requests must be 400 (REST), 422 (TF columnar) or INVALID_ARGUMENT / NOT_FOUND (gRPC)
with a message naming the input, never a 500 or INTERNAL.
"""

from __future__ import annotations

import json
import struct

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from grpc_helpers import tensors
from server_helpers import TOKEN, copy_models, score, serve_process, stop_server, wait_ready
from tritonclient.grpc import service_pb2, service_pb2_grpc

from offgraph.testing.harness import free_port

MAX_CANDIDATES = 50
TOL = 1e-6
SELECTIONS = [(None, None), ("1", None), ("2", None), (None, "canary"), ("1", "canary")]
"""(model_version, label) pairs: the default version, each version, the label, a version and the label naming it."""

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory):
    """MODELS with ml/1 (fp32) and ml/2 (int8, the same training run)."""
    from offgraph.export.export import export_run

    pristine = tiny_model[0]
    models = copy_models(pristine, tmp_path_factory.mktemp("kserve") / "models")
    export_run(pristine.parent / "run", models / "ml" / "2", shards=2, quant="int8", progress=False)
    return models


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    """(HTTP url, gRPC address) of ``offgraph serve`` with --grpc-port, the label canary on version 1."""
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("kserve-log") / "serve.log"
    flags = ("--grpc-port", str(grpc_port), "--admin-token", TOKEN, "--max-candidates", str(MAX_CANDIDATES))
    proc, url = serve_process(models, log, *flags)
    try:
        wait_ready(url, 120, proc, log=str(log))
        r = httpx.put(f"{url}/v1/models/ml/labels/canary", json={"version": 1}, headers=_admin(), timeout=60)
        assert r.status_code == 200, r.text
        yield url, f"127.0.0.1:{grpc_port}"
    finally:
        stop_server(proc, 30)


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[0], timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def meta(http):
    r = http.get("/v2/models/ml")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def cases(requests_):
    """Real requests of 3 to MAX_CANDIDATES candidates."""
    return [(req, cands[:MAX_CANDIDATES]) for req, cands in requests_[:4]]


def _data(arr: np.ndarray) -> list:
    """A tensor's elements as JSON ``data``: flat, BYTES as text."""
    return [x.decode() if isinstance(x, bytes) else x for x in arr.flatten().tolist()]


def expected(http, req, cands, version: str | None, label: str | None) -> tuple[np.ndarray, int]:
    body = {"request": req, "candidates": cands}
    if version is not None:
        body["version"] = int(version)
    if label is not None:
        body["label"] = label
    r = score(http, body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["scores"]), r.json()["version"]


# -- REST /infer with tritonclient.http -------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_rest_infer_with_tritonclient_http_equals_score(server, http, meta, cases, binary):
    client = thttp.InferenceServerClient(server[0].removeprefix("http://"))
    seen = set()
    for i, (req, cands) in enumerate(cases):
        for version, label in SELECTIONS:
            inputs = []
            for name, datatype, arr in tensors(meta, req, cands, once=i % 2 == 0):
                t = thttp.InferInput(name, list(arr.shape), datatype)
                t.set_data_from_numpy(arr, binary_data=binary)
                inputs.append(t)
            outputs = [thttp.InferRequestedOutput("scores", binary_data=binary)]
            res = client.infer(
                "ml",
                inputs,
                model_version=version or "",
                outputs=outputs,
                request_id=f"req-{i}",
                parameters={"label": label} if label else None,
            )
            want, served = expected(http, req, cands, version, label)
            got = res.as_numpy("scores")
            assert got.dtype == np.float32 and got.shape == (len(cands),)
            assert np.abs(got.astype(np.float64) - want).max() <= TOL, (version, label)
            answer = res.get_response()
            assert (answer["model_name"], answer["model_version"], answer["id"]) == ("ml", str(served), f"req-{i}")
            seen.add(served)
    assert seen == {1, 2}  # fp32 and int8 both scored


def test_rest_infer_without_outputs_answers_binary_scores_as_triton_asks(server, http, meta, cases):
    """tritonclient.http without ``outputs`` asks for every output as binary data (``binary_data_output``)."""
    req, cands = cases[0]
    client = thttp.InferenceServerClient(server[0].removeprefix("http://"))
    inputs = []
    for name, datatype, arr in tensors(meta, req, cands):
        t = thttp.InferInput(name, list(arr.shape), datatype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    res = client.infer("ml", inputs)
    assert "data" not in res.get_output("scores") and res.get_output("scores")["parameters"]["binary_data_size"]
    want = expected(http, req, cands, None, None)[0]
    assert np.abs(res.as_numpy("scores") - want).max() <= TOL
    # an output's own binary_data wins over the request's binary_data_output, which holds for the others
    body = {
        "inputs": [
            {"name": n, "datatype": d, "shape": list(a.shape), "data": _data(a)}
            for n, d, a in tensors(meta, req, cands)
        ],
        "parameters": {"binary_data_output": True},
    }
    r = http.post(
        "/v2/models/ml/infer", json={**body, "outputs": [{"name": "scores", "parameters": {"binary_data": False}}]}
    )
    assert r.status_code == 200 and np.abs(np.asarray(r.json()["outputs"][0]["data"]) - want).max() <= TOL, r.text
    r = http.post("/v2/models/ml/infer", json={**body, "outputs": [{"name": "scores"}]})
    head = int(r.headers["inference-header-content-length"])
    assert json.loads(r.content[:head])["outputs"][0]["parameters"] == {"binary_data_size": 4 * len(cands)}
    assert np.abs(np.frombuffer(r.content[head:], dtype="<f4") - want).max() <= TOL


# -- gRPC ModelInfer with tritonclient.grpc ------------------------------------------------------------------------
def test_grpc_model_infer_with_tritonclient_grpc_equals_score(server, http, meta, cases):
    client = tgrpc.InferenceServerClient(server[1])
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("ml") and client.is_model_ready("ml", "1") and not client.is_model_ready("ml", "9")
    got_meta = client.get_model_metadata("ml", as_json=True)
    assert [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in got_meta["inputs"]] == [
        (i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]
    ]
    assert got_meta["outputs"][0]["name"] == "scores" and got_meta["versions"] == meta["versions"]
    seen = set()
    for i, (req, cands) in enumerate(cases):
        for version, label in SELECTIONS:
            inputs = []
            for name, datatype, arr in tensors(meta, req, cands, once=i % 2 == 1):
                t = tgrpc.InferInput(name, list(arr.shape), datatype)
                t.set_data_from_numpy(arr)  # raw_input_contents: the client's default
                inputs.append(t)
            res = client.infer(
                "ml",
                inputs,
                model_version=version or "",
                request_id=f"g-{i}",
                parameters={"label": label} if label else None,
            )
            want, served = expected(http, req, cands, version, label)
            assert np.abs(res.as_numpy("scores").astype(np.float64) - want).max() <= TOL, (version, label)
            answer = res.get_response()
            assert (answer.model_name, answer.model_version, answer.id) == ("ml", str(served), f"g-{i}")
            seen.add(served)
    assert seen == {1, 2}


def test_grpc_typed_contents_equal_raw_contents(server, http, meta, cases):
    """A request with typed ``contents`` (bytes_contents, fp64_contents) instead of raw_input_contents."""
    req, cands = cases[1]
    request = service_pb2.ModelInferRequest(model_name="ml", model_version="1")
    for name, datatype, arr in tensors(meta, req, cands):
        t = request.inputs.add(name=name, datatype=datatype, shape=list(arr.shape))
        if datatype == "BYTES":
            t.contents.bytes_contents.extend(arr.flatten().tolist())
        else:
            t.contents.fp64_contents.extend(arr.flatten().tolist())
    with grpc.insecure_channel(server[1]) as channel:
        res = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    got = np.frombuffer(res.raw_output_contents[0], dtype="<f4")
    assert np.abs(got - expected(http, req, cands, "1", None)[0]).max() <= TOL


# -- TF Serving's columnar format ----------------------------------------------------------------------------------
def columns(req: dict, cands: list[dict], once: bool) -> dict[str, list]:
    cols = {k: [v] * (1 if once else len(cands)) for k, v in req.items()}
    for k in cands[0]:
        cols[k] = [c.get(k) for c in cands]
    return cols


@pytest.mark.parametrize(
    "path,version,label",
    [
        ("/v1/models/ml:predict", None, None),
        ("/v1/models/ml/versions/1:predict", "1", None),
        ("/v1/models/ml/labels/canary:predict", None, "canary"),
    ],
)
def test_columnar_predict_equals_the_row_format_and_score(http, cases, path, version, label):
    for i, (req, cands) in enumerate(cases):
        want, _ = expected(http, req, cands, version, label)
        rows = http.post(path, json={"context": req, "instances": cands})
        assert rows.status_code == 200, rows.text
        cols = http.post(
            path, json={"inputs": columns(req, cands, once=i % 2 == 0), "signature_name": "serving_default"}
        )
        assert cols.status_code == 200, cols.text
        assert list(cols.json()) == ["outputs"]
        assert np.abs(np.asarray(cols.json()["outputs"]) - want).max() <= TOL
        assert cols.json()["outputs"] == rows.json()["predictions"]


def test_columnar_bad_bodies_are_422_naming_the_problem(http, cases):
    req, cands = cases[0]
    good = columns(req, cands, once=True)
    bad = [
        ({"inputs": {**good, "nope": [1]}}, "unknown input 'nope'"),
        ({"inputs": {**good, "release_year": [1990]}}, "'release_year' has 1 elements"),  # an item input given once
        ({"inputs": {**good, "user_id": [1, 2]}}, "'user_id' has 2 elements"),
        ({"inputs": {**good, "user_id": [req["user_id"]] * (len(cands) - 1) + [-1]}}, "request-scope input 'user_id'"),
        ({"inputs": [[1, 2]]}, "unnamed columnar form"),
        ({"inputs": good, "context": req}, "'context' goes with 'instances'"),
        ({"inputs": good, "instances": cands}, "either 'instances'"),
        ({"inputs": {"movie_id": [1] * (MAX_CANDIDATES + 1)}}, str(MAX_CANDIDATES)),
        ({"inputs": {"movie_id": []}}, "movie_id"),
        ({"inputs": {}}, "inputs"),
        ({"inputs": {**good, "genres": [[{"a": 1}]] * len(cands)}}, "genres"),
    ]
    for body, words in bad:
        r = http.post("/v1/models/ml:predict", json=body)
        assert r.status_code == 422 and words in r.json()["error"], (body if len(str(body)) < 300 else words, r.text)


# -- bad requests ------------------------------------------------------------------------------------------------
def _json_infer(inputs: list[dict], **extra) -> dict:
    return {"inputs": inputs, **extra}


def _t(name: str, datatype: str, shape: list[int], data: list) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def test_rest_bad_requests_are_400_or_404_naming_the_problem(http):
    movies = _t("movie_id", "BYTES", [3], ["1", "2", "3"])
    bad_json = [
        ([_t("release_year", "BYTES", [1], ["1990"])], "'release_year' is a number"),
        ([movies, _t("release_year", "FP64", [2], [1990.0, 1991.0])], "'release_year' has 2 elements"),
        ([_t("movie_id", "BYTES", [3], ["1", "2"])], "'movie_id' has 2 elements in its data"),
        ([movies, _t("nope", "BYTES", [3], ["a", "b", "c"])], "unknown input 'nope'"),
        ([movies, movies], "'movie_id' is sent twice"),
        ([{"name": "movie_id", "datatype": "BYTES", "shape": [3]}], "'movie_id' has no data"),
        ([{"datatype": "BYTES", "shape": [1], "data": ["1"]}], "name"),
        ([_t("movie_id", "FOO", [1], ["1"])], "datatype"),
        ([_t("movie_id", "INT64", [2], [1, "2"])], "'movie_id' element 1"),
        ([_t("movie_id", "BOOL", [1], [1])], "'movie_id' element 0"),
        ([_t("release_year", "FP64", [1, 3], [1.0, 2.0, 3.0])], "'release_year' has shape [1, 3]"),
        ([_t("movie_id", "BYTES", [1, 1, 1], ["1"])], "'movie_id' has shape [1, 1, 1]"),
        ([_t("movie_id", "BYTES", [0], [])], "'movie_id' has shape [0]"),
        ([_t("movie_id", "INT64", [MAX_CANDIDATES + 1], list(range(MAX_CANDIDATES + 1)))], f"at most {MAX_CANDIDATES}"),
        ([movies, _t("user_id", "BYTES", [3], ["1", "2", "1"])], "request-scope input 'user_id'"),
        ([_t("genres", "BYTES", [1, 1001], ["g"] * 1001)], "genres"),  # the field's max_values: the score path's 422
        ([], "inputs"),
    ]
    for inputs, words in bad_json:
        for path in ("/v2/models/ml/infer", "/v2/models/ml/versions/1/infer"):
            r = http.post(path, json=_json_infer(inputs))
            assert r.status_code == 400 and words in r.json()["error"], (inputs[:2], r.status_code, r.text)
    not_found = [
        ("/v2/models/nope/infer", {}, "unknown model 'nope'"),
        ("/v2/models/ml/versions/9/infer", {}, "9"),
        ("/v2/models/ml/infer", {"parameters": {"label": "nope"}}, "no label 'nope'"),
        ("/v2/models/ml/versions/2/infer", {"parameters": {"label": "canary"}}, "canary"),
    ]
    for path, extra, words in not_found:
        r = http.post(path, json=_json_infer([movies], **extra))
        assert r.status_code == 404 and words in r.json()["error"], (path, r.text)
    for path, extra, words in [
        ("/v2/models/ml/versions/x/infer", {}, "invalid version"),
        ("/v2/models/ml/infer", {"parameters": {"label": "Bad label"}}, "not a label"),
        ("/v2/models/ml/infer", {"outputs": [{"name": "predictions"}]}, "scores"),
    ]:
        r = http.post(path, json=_json_infer([movies], **extra))
        assert r.status_code == 400 and words in r.json()["error"], (path, r.text)


def _binary_body(header: dict, raw: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + raw, len(head)


def test_rest_binary_extension_errors_are_400(http):
    ids = b"".join(struct.pack("<I", len(s)) + s for s in (b"1", b"2"))
    inp = {"name": "movie_id", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(ids)}}
    body, n = _binary_body({"inputs": [inp]}, ids)
    ok = http.post("/v2/models/ml/infer", content=body, headers={"Inference-Header-Content-Length": str(n)})
    assert ok.status_code == 200 and len(ok.json()["outputs"][0]["data"]) == 2, ok.text
    short = {**inp, "parameters": {"binary_data_size": len(ids) + 5}}
    years = {"name": "release_year", "datatype": "FP64", "shape": [2], "parameters": {"binary_data_size": 8}}
    cases = [
        (body, "abc", "Inference-Header-Content-Length"),
        (body, "0", "Inference-Header-Content-Length"),
        (body, str(len(body) + 1), "Inference-Header-Content-Length"),
        (body, str(n - 3), "JSON"),  # the JSON cut short
        (*_binary_body({"inputs": [short]}, ids), "'movie_id' takes 15 bytes"),
        (*_binary_body({"inputs": [inp]}, ids + b"extra"), "binary data"),
        (*_binary_body({"inputs": [inp, years]}, ids + b"\0" * 8), "'release_year' has 8 bytes"),
        (*_binary_body({"inputs": [{**inp, "data": ["1", "2"]}]}, ids), "both 'data' and binary data"),
        (*_binary_body({"inputs": [{**inp, "parameters": {"binary_data_size": 5}}]}, ids[:5]), "'movie_id'"),
        (
            *_binary_body(
                {"inputs": [{**inp, "shape": [1], "parameters": {"binary_data_size": 7}}]}, b"\3\0\0\0\xff\xfe\xfd"
            ),
            "not UTF-8",
        ),
    ]
    for raw, header, words in cases:
        r = http.post("/v2/models/ml/infer", content=raw, headers={"Inference-Header-Content-Length": str(header)})
        assert r.status_code == 400 and words in r.json()["error"], (header, words, r.text)


def test_grpc_bad_requests_are_invalid_argument_or_not_found(server):
    def call(**kw) -> grpc.RpcError:
        raw = kw.pop("raw", None)
        request = service_pb2.ModelInferRequest(**kw)
        if raw is not None:
            request.raw_input_contents.extend(raw)
        with grpc.insecure_channel(server[1]) as channel:
            with pytest.raises(grpc.RpcError) as e:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        return e.value

    def inp(name, datatype, shape, **contents):
        t = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
        for field, values in contents.items():
            getattr(t.contents, field).extend(values)
        return t

    movies = inp("movie_id", "BYTES", [2], bytes_contents=[b"1", b"2"])
    label = {"label": service_pb2.InferParameter(string_param="nope")}
    bad_label = {"label": service_pb2.InferParameter(int64_param=3)}
    C = grpc.StatusCode
    cases = [
        (
            dict(model_name="ml", inputs=[inp("release_year", "BYTES", [1], bytes_contents=[b"1"])]),
            C.INVALID_ARGUMENT,
            "'release_year' is a number",
        ),
        (
            dict(model_name="ml", inputs=[movies, inp("release_year", "FP64", [3], fp64_contents=[1, 2, 3])]),
            C.INVALID_ARGUMENT,
            "disagree",
        ),
        (
            dict(model_name="ml", inputs=[movies, inp("nope", "BYTES", [2], bytes_contents=[b"a", b"b"])]),
            C.INVALID_ARGUMENT,
            "unknown input 'nope'",
        ),
        (
            dict(model_name="ml", inputs=[inp("movie_id", "BYTES", [3], bytes_contents=[b"1"])]),
            C.INVALID_ARGUMENT,
            "'movie_id' has 1 elements",
        ),
        (
            dict(model_name="ml", inputs=[inp("movie_id", "INT64", [2])], raw=[b"\0" * 12]),
            C.INVALID_ARGUMENT,
            "'movie_id' has 12 bytes",
        ),
        (
            dict(model_name="ml", inputs=[inp("movie_id", "BYTES", [2])], raw=[b"\5\0\0\0ab"]),
            C.INVALID_ARGUMENT,
            "'movie_id'",
        ),
        (
            dict(model_name="ml", inputs=[movies, inp("release_year", "FP64", [2])], raw=[b"\0" * 16]),
            C.INVALID_ARGUMENT,
            "raw_input_contents has 1 entries",
        ),
        (
            dict(model_name="ml", inputs=[inp("movie_id", "FP16", [1], fp32_contents=[1.0])]),
            C.INVALID_ARGUMENT,
            "raw_input_contents",
        ),
        (
            dict(
                model_name="ml",
                inputs=[inp("movie_id", "INT64", [MAX_CANDIDATES + 1], int64_contents=range(MAX_CANDIDATES + 1))],
            ),
            C.INVALID_ARGUMENT,
            f"at most {MAX_CANDIDATES}",
        ),
        (
            dict(model_name="ml", inputs=[inp("movie_id", "INT64", [100_000])], raw=[b"\0" * 800_000]),
            C.INVALID_ARGUMENT,
            "100000 candidates",
        ),
        (dict(model_name="ml", inputs=[]), C.INVALID_ARGUMENT, "no inputs"),
        (dict(model_name="ml", model_version="x", inputs=[movies]), C.INVALID_ARGUMENT, "invalid version"),
        (dict(model_name="ml", inputs=[movies], parameters=bad_label), C.INVALID_ARGUMENT, "label"),
        (dict(model_name="ml/..", inputs=[movies]), C.INVALID_ARGUMENT, "ml/.."),
        (dict(model_name="nope", inputs=[movies]), C.NOT_FOUND, "unknown model 'nope'"),
        (dict(model_name="ml", model_version="9", inputs=[movies]), C.NOT_FOUND, "9"),
        (dict(model_name="ml", inputs=[movies], parameters=label), C.NOT_FOUND, "no label 'nope'"),
    ]
    for kw, code, words in cases:
        e = call(**kw)
        assert e.code() == code and words in e.details(), (kw.get("inputs", [])[:1], e.code(), e.details())
    with grpc.insecure_channel(server[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), timeout=30)
        assert e.value.code() == C.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelReady(service_pb2.ModelReadyRequest(name="nope"), timeout=30)
        assert e.value.code() == C.NOT_FOUND
        assert stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=30).name == "offgraph"

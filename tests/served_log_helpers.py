"""Helpers of the served-log tests: one scored request over every protocol a server answers (REST :score,
TF Serving :predict rows and columns, KServe v2 REST infer, gRPC Predict and ModelInfer), each with its own
request id, and the checks of a served log against what was answered (the library scorer re-scoring the
logged features)."""

from __future__ import annotations

import json
import re

import grpc
import httpx
import numpy as np
from grpc_helpers import predict_request, tensors
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

DROPPED, WRITTEN = "offgraph_served_log_dropped_total", "offgraph_served_log_records_total"
"""The served log's /metrics counters: records dropped (a full queue, a sink down), records written."""


def _data(arr: np.ndarray) -> list:
    """A tensor's elements as KServe JSON ``data``: flat, BYTES as text."""
    return [x.decode() if isinstance(x, bytes) else x for x in arr.flatten().tolist()]


def score_every_protocol(
    http: httpx.Client, grpc_addr: str | None, meta: dict, req: dict, cands: list[dict], tag: str
) -> dict[str, np.ndarray]:
    """{request id: the float32 scores answered} of ``req``/``cands`` sent once over each protocol (gRPC ones only
    with ``grpc_addr``); every answer must be a success."""
    out: dict[str, np.ndarray] = {}

    def post(rid: str, path: str, body: dict) -> dict:
        r = http.post(path, json=body, headers={"x-request-id": rid})
        assert r.status_code == 200 and r.headers["x-request-id"] == rid, r.text
        return r.json()

    out[f"score-{tag}"] = np.float32(
        post(f"score-{tag}", "/v1/models/ml:score", {"request": req, "candidates": cands})["scores"]
    )
    rows = post(f"rows-{tag}", "/v1/models/ml:predict", {"context": req, "instances": cands})
    out[f"rows-{tag}"] = np.float32(rows["predictions"])
    cols = {k: [v] for k, v in req.items()} | {k: [c.get(k) for c in cands] for k in cands[0]}
    out[f"cols-{tag}"] = np.float32(post(f"cols-{tag}", "/v1/models/ml:predict", {"inputs": cols})["outputs"])
    inputs = [
        {"name": n, "datatype": d, "shape": list(a.shape), "data": _data(a)} for n, d, a in tensors(meta, req, cands)
    ]
    infer = post(f"infer-{tag}", "/v2/models/ml/infer", {"inputs": inputs})
    out[f"infer-{tag}"] = np.float32(infer["outputs"][0]["data"])
    if grpc_addr is not None:
        with grpc.insecure_channel(grpc_addr) as channel:
            rid = f"gpredict-{tag}"
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            out[rid] = np.float32(predict_with_id(channel, predict_request(req, cands), rid))
            request = service_pb2.ModelInferRequest(model_name="ml")
            for name, datatype, arr in tensors(meta, req, cands):
                t = request.inputs.add(name=name, datatype=datatype, shape=list(arr.shape))
                if datatype == "BYTES":
                    t.contents.bytes_contents.extend(arr.flatten().tolist())
                else:
                    t.contents.fp64_contents.extend(arr.flatten().tolist())
            rid = f"ginfer-{tag}"
            res = stub.ModelInfer(request, timeout=30, metadata=(("x-request-id", rid),))
            out[rid] = np.frombuffer(res.raw_output_contents[0], dtype="<f4")
    return out


def predict_with_id(channel: grpc.Channel, request, rid: str) -> np.ndarray:
    """gRPC Predict's scores, the call carrying ``x-request-id`` ``rid`` in its metadata."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    out = stub.Predict(request, timeout=30, metadata=(("x-request-id", rid),))
    return np.frombuffer(out.outputs["predictions"].tensor_content, "<f4")


def metric(text: str, name: str) -> float:
    """The sum of a counter's series (every label) on a /metrics page."""
    return sum(map(float, re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)))


def check_logged(table, sent: dict[str, np.ndarray], version_dir) -> None:
    """``table`` (a served log read back) holds exactly one record per request of ``sent`` ({request id: scores
    answered}), each with the scores answered and their order, and the logged features re-scored by the library's
    Scorer give the answered scores, fp32 exact."""
    from offgraph.scoring.scorer import Scorer

    rows = table.drop_columns(["time"]).to_pylist()
    assert sorted(r["request_id"] for r in rows) == sorted(sent)
    with Scorer(version_dir) as lib:
        for row in rows:
            served = sent[row["request_id"]]
            assert (row["model"], row["version"], row["arm"]) == ("ml", 1, "none"), row["request_id"]
            np.testing.assert_array_equal(np.float32(row["scores"]), served, err_msg=row["request_id"])
            assert row["order"] == np.argsort(-served, kind="stable").tolist()
            request = json.loads(row["request"])
            candidates = [json.loads(c) for c in row["candidates"]]
            rescored = np.float32(lib.score(request, candidates))
            np.testing.assert_array_equal(rescored, served, err_msg=row["request_id"])

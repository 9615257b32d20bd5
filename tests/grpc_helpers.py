"""Helpers of the gRPC tests: TF Serving ``PredictRequest`` s built from a ``:score`` body as a client of the
tensorflow-serving-api stubs builds them, KServe v2 input tensors built from a model's v2 metadata (gRPC and REST),
Predict's scores, gRPC health, and the ``:score`` scores to compare."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def health(channel: grpc.Channel, service: str = "") -> object:
    """gRPC health's status of ``service`` ("": the server), or the call's status code when it fails."""
    try:
        return (
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
        )
    except grpc.RpcError as e:
        return e.code()


def tensor(values, dtype) -> tensor_pb2.TensorProto:
    t = tensor_pb2.TensorProto(dtype=dtype)
    t.tensor_shape.dim.add(size=len(values))
    if dtype == types_pb2.DT_STRING:
        t.string_val.extend(v.encode() for v in values)
    elif dtype == types_pb2.DT_INT64:
        t.int64_val.extend(values)
    else:
        t.double_val.extend(values)
    return t


def value_tensor(values) -> tensor_pb2.TensorProto:
    """One element per value: integers as DT_INT64, other numbers DT_DOUBLE, other values as DT_STRING; lists as
    DT_STRING [N, K], padded with "" (the documented convention of every named-tensor protocol)."""
    if any(isinstance(v, list) for v in values):
        lists = [v if isinstance(v, list) else [v] for v in values]
        k = max(1, max(len(v) for v in lists))
        t = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING)
        t.tensor_shape.dim.add(size=len(lists))
        t.tensor_shape.dim.add(size=k)
        t.string_val.extend(str(x).encode() for v in lists for x in v + [""] * (k - len(v)))
        return t
    if all(type(v) is int for v in values):  # ids hash as their decimal text: 196, never 196.0
        return tensor(values, types_pb2.DT_INT64)
    if all(type(v) in (int, float) for v in values):
        return tensor([float(v) for v in values], types_pb2.DT_DOUBLE)
    return tensor([str(v) for v in values], types_pb2.DT_STRING)


def predict_request(request: dict, candidates: list[dict], version=None, label=None) -> predict_pb2.PredictRequest:
    """The ``PredictRequest`` of model ``ml`` for a ``:score`` body: request scope given once (shape [1])."""
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "ml"
    if version is not None:
        req.model_spec.version.value = version
    if label is not None:
        req.model_spec.version_label = label
    for k, v in request.items():
        req.inputs[k].CopyFrom(value_tensor([v]))
    for k in candidates[0]:
        req.inputs[k].CopyFrom(value_tensor([c[k] for c in candidates]))
    return req


def rest_scores(url: str, request: dict, candidates: list[dict], **pick) -> list[float]:
    """``:score``'s scores of the same candidates (``pick``: ``version=``, ``label=``)."""
    r = httpx.post(f"{url}/v1/models/ml:score", json={"request": request, "candidates": candidates, **pick}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["scores"]


def predict(channel: grpc.Channel, req: predict_pb2.PredictRequest, timeout: float = 30):
    """(the ``PredictResponse``, its ``predictions`` as a float array)."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    out = stub.Predict(req, timeout=timeout)
    t = out.outputs["predictions"]
    assert t.dtype == types_pb2.DT_FLOAT
    return out, np.frombuffer(t.tensor_content, "<f4") if t.tensor_content else np.asarray(t.float_val)


def tensors(meta: dict, req: dict, cands: list[dict], once: bool = True) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, array) of each input the metadata lists, as a client builds them from it: one element per
    candidate, a request-scope input once (``once``) or repeated; a list input [N, K] padded with b""."""
    out = []
    n = len(cands)
    for m in meta["inputs"]:
        name, scope = m["name"], m["parameters"]["scope"]
        if scope == "request":
            values = [req.get(name)] * (1 if once else n)
        else:
            values = [c.get(name) for c in cands]
        if m["datatype"] == "FP64":
            arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        elif len(m["shape"]) == 2:  # a list of values per candidate
            rows = [v if isinstance(v, list) else ([] if v is None else [v]) for v in values]
            k = max(1, *map(len, rows))
            arr = np.array([[str(x).encode() for x in r] + [b""] * (k - len(r)) for r in rows], dtype=object)
        else:
            arr = np.array([b"" if v is None else str(v).encode() for v in values], dtype=object)
        out.append((name, m["datatype"], arr))
    return out

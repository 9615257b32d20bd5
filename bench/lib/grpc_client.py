"""gRPC clients of ``offgraph serve --grpc-port``: TF Serving's ``PredictionService/Predict`` (``tensorflow-serving-api``'s
protos) and KServe v2's ``GRPCInferenceService/ModelInfer`` (``tritonclient.grpc``'s protos, inputs in
``raw_input_contents`` as ``tritonclient`` sends them), each on the same score bodies as ``:score``.

A score body (``bench.lib.bodies``) becomes the named tensors of the model's KServe v2 metadata
(``GET /v2/models/{name}``): a request feature given once (``[1]``), an item feature one element per candidate
(``[N]``), a value list ``[N, K]`` padded with ``""``; a number input (``FP64``) as doubles (no value: NaN), an
id whose values are all integers as ``INT64``, anything else as UTF-8 ``BYTES`` (no value: ``""``). The messages are
serialized beforehand, as the HTTP bodies are, and sent as bytes on one channel per concurrent stream (its own
connection: ``grpc.use_local_subchannel_pool``, so that the streams spread over the server's workers as the HTTP
client's connections do); a cell is ``bench.lib.client.measure_calls``.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import numpy as np

TF_PREDICT = "/tensorflow.serving.PredictionService/Predict"
KSERVE_INFER = "/inference.GRPCInferenceService/ModelInfer"
PROTOCOLS = {"tfserving": TF_PREDICT, "kserve": KSERVE_INFER}

_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),  # a connection of its own per channel, as the HTTP client's streams
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


def model_inputs(port: int, model: str) -> list[dict]:
    """The model's inputs as its KServe v2 metadata lists them: ``{"name", "datatype", "shape"}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}", timeout=10) as r:
        return json.loads(r.read())["inputs"]


def _columns(body: dict, inputs: list[dict]) -> list[tuple[str, str, list[int], np.ndarray]]:
    """(name, KServe datatype, shape, values) of each model input the body sends."""
    request, cands = body["request"], body["candidates"]
    n = len(cands)
    out = []
    for info in inputs:
        name, lists, number = info["name"], len(info["shape"]) == 2, info["datatype"] == "FP64"
        if name in request:
            values, shape = [request[name]], [1]
        elif any(name in c for c in cands):
            values, shape = [c.get(name) for c in cands], [n]
        else:
            continue
        if lists:
            vs = [v if isinstance(v, list) else ([] if v is None else [v]) for v in values]
            k = max(1, max(map(len, vs)))
            flat = [str(x) for v in vs for x in [*v, *[""] * (k - len(v))]]
            out.append((name, "BYTES", [shape[0], k], np.array(flat, dtype=np.object_)))
        elif number:
            out.append((name, "FP64", shape, np.array([np.nan if v is None else v for v in values], np.float64)))
        elif all(type(v) is int for v in values):
            out.append((name, "INT64", shape, np.array(values, np.int64)))
        else:
            out.append((name, "BYTES", shape, np.array(["" if v is None else str(v) for v in values], np.object_)))
    return out


def kserve_request(model: str, body: dict, inputs: list[dict]) -> bytes:
    """A serialized ``ModelInferRequest``, its inputs in ``raw_input_contents`` as ``tritonclient.grpc`` sends them."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    req = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, values in _columns(body, inputs):
        req.inputs.add(name=name, datatype=datatype, shape=shape)
        if datatype == "BYTES":
            req.raw_input_contents.append(serialize_byte_tensor(values).item())  # as InferInput keeps it
        else:
            req.raw_input_contents.append(values.astype(values.dtype.newbyteorder("<")).tobytes())
    req.outputs.add(name="scores")
    return req.SerializeToString()


def tfserving_request(model: str, body: dict, inputs: list[dict]) -> bytes:
    """A serialized ``PredictRequest``: strings in ``string_val``, numbers in ``tensor_content`` (as
    ``tf.make_tensor_proto`` writes them)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    dtypes = {"BYTES": types_pb2.DT_STRING, "INT64": types_pb2.DT_INT64, "FP64": types_pb2.DT_DOUBLE}
    req = predict_pb2.PredictRequest()
    req.model_spec.name, req.model_spec.signature_name = model, "serving_default"
    for name, datatype, shape, values in _columns(body, inputs):
        t = req.inputs[name]
        t.dtype = dtypes[datatype]
        for d in shape:
            t.tensor_shape.dim.add(size=d)
        if datatype == "BYTES":
            t.string_val.extend(v.encode() for v in values)
        else:
            t.tensor_content = values.astype(values.dtype.newbyteorder("<")).tobytes()
    return req.SerializeToString()


def grpc_bodies(
    protocol: str, model: str, bodies: dict[int, list[bytes]], inputs: list[dict]
) -> dict[int, list[bytes]]:
    """The score bodies (per N) as serialized messages of ``protocol`` (``tfserving``, ``kserve``)."""
    make = tfserving_request if protocol == "tfserving" else kserve_request
    return {n: [make(model, json.loads(b), inputs) for b in bs] for n, bs in bodies.items()}


def scores_of(protocol: str, payload: bytes) -> np.ndarray:
    """The scores of a serialized answer (``Predict``'s ``predictions``, ``ModelInfer``'s ``scores``)."""
    if protocol == "tfserving":
        from tensorflow_serving.apis import predict_pb2

        p = predict_pb2.PredictResponse.FromString(payload)
        return np.frombuffer(p.outputs["predictions"].tensor_content, "<f4")
    from tritonclient.grpc import service_pb2

    k = service_pb2.ModelInferResponse.FromString(payload)
    return np.frombuffer(k.raw_output_contents[0], "<f4")


async def run_grpc_cell(
    protocol: str,
    port: int,
    bodies: list[bytes],
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    warmup: int,
    check_n: int,
    pid: int,
) -> dict:
    """One measured cell of ``protocol`` on 127.0.0.1:``port``: ``bench.lib.client.measure_calls``."""
    import grpc

    from bench.lib.client import measure_calls

    method = PROTOCOLS[protocol]
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_OPTIONS) for _ in range(concurrency)]
    calls = [ch.unary_unary(method) for ch in channels]  # bytes in, bytes out: serialized beforehand

    async def call(k: int, body: bytes) -> tuple[bool, Any, bytes]:
        try:
            return True, "OK", await calls[k](body, timeout=60)
        except grpc.aio.AioRpcError as e:
            return False, e.code().name, (e.details() or "").encode()

    try:
        return await measure_calls(
            list(range(concurrency)),
            call,
            lambda p: len(scores_of(protocol, p)),
            method,
            bodies,
            max_requests,
            max_seconds,
            warmup,
            check_n,
            pid,
        )
    finally:
        for ch in channels:
            await ch.close()


async def fetch_grpc_scores(protocol: str, port: int, body: bytes) -> np.ndarray:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_OPTIONS) as ch:
        return scores_of(protocol, await ch.unary_unary(PROTOCOLS[protocol])(body, timeout=60))

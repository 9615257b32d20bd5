"""TensorFlow Serving's gRPC API: ``tensorflow.serving.PredictionService`` (``Predict``, ``GetModelMetadata``) and
``tensorflow.serving.ModelService`` (``GetModelStatus``), with the ``tensorflow-serving-api`` package's protos.

A ``PredictRequest``'s ``inputs`` are named tensors, read by the one conversion every named-tensor protocol uses
(``offgraph.server.api.tensor_inputs``: its conventions, in KServe v2's datatypes: ``DT_STRING`` is ``BYTES``,
``DT_FLOAT`` ``FP32``, ``DT_DOUBLE`` ``FP64``, ``DT_INT64`` ``INT64``, ...) and scored by its score path
(``offgraph.server.api.predict_scoring.score_tensors`` in the scoring pool: REST ``:predict``'s split of request-scope inputs, the
``:score`` path, its errors and metrics):

* each input is one of the model's raw inputs (``GetModelMetadata`` lists them), one element per candidate:
  shape ``[N]`` or ``[N, 1]``;
* a request-scope input is given once (shape ``[1]``, or a scalar ``[]``) or N times with the same value (REST's
  rule: two values are INVALID_ARGUMENT naming the input);
* a value-list input (``genres``) is ``[N, K]``: K values per candidate, padded with no value (``""``) where a
  candidate has fewer (``[1, K]`` for a request-scope list given once), as every named-tensor protocol takes it;
* ``model_spec.version`` or ``model_spec.version_label`` picks a version (it must serve, as on REST);
  ``signature_name`` is ``serving_default`` or empty;
* the answer: ``outputs["predictions"]`` (``DT_FLOAT [N]``, in candidate order; REST ``:predict``'s key and the
  output ``GetModelMetadata`` names) and the ``model_spec`` that served.

Errors: ``offgraph.server.grpc.status`` (REST's words). No input is decoded before the candidate count is checked
against ``--max-candidates``; a message over ``--max-body-mb`` is refused by gRPC itself (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

# model_service_pb2 and prediction_service_pb2 are imported for their side effect: the package's *_pb2_grpc modules
# do not import them, so the services' files would never be in the descriptor pool, and reflection would list the
# services but answer "not found" for them (grpcurl could not call them)
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2,  # noqa: F401 (see above)
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2,  # noqa: F401 (see above)
    prediction_service_pb2_grpc,
)

from offgraph.server.api.deps import get_holder, label_name, model_name
from offgraph.server.api.predict_scoring import ArmChoice, Scored, score_tensors, scored
from offgraph.server.api.routers.tfserving import SIGNATURE, metadata
from offgraph.server.api.tensor_inputs import Tensor
from offgraph.server.api.version_status import version_status
from offgraph.server.api.wire_keys import field_contents
from offgraph.server.http.errors import ApiError, too_many_candidates
from offgraph.server.http.redact import redacted_view

if TYPE_CHECKING:
    import grpc

    from offgraph.server.grpc.context import GrpcContext

PREDICTION = "tensorflow.serving.PredictionService"
MODEL = "tensorflow.serving.ModelService"
SERVICE_NAMES = (PREDICTION, MODEL)
OUTPUT = "predictions"  # REST :predict's key, and the output GetModelMetadata names
ARM_METADATA = "offgraph-arm"  # Predict's answer in an experiment: the arm that answered (PredictResponse has no room)

DT = types_pb2.DataType
DATATYPES = {  # TensorProto dtype -> (KServe v2 datatype of offgraph.server.api.tensor_inputs, its typed field)
    DT.Value("DT_STRING"): ("BYTES", "string_val"),
    DT.Value("DT_BOOL"): ("BOOL", "bool_val"),
    DT.Value("DT_INT8"): ("INT8", "int_val"),
    DT.Value("DT_INT16"): ("INT16", "int_val"),
    DT.Value("DT_INT32"): ("INT32", "int_val"),
    DT.Value("DT_INT64"): ("INT64", "int64_val"),
    DT.Value("DT_UINT8"): ("UINT8", "int_val"),
    DT.Value("DT_UINT16"): ("UINT16", "int_val"),
    DT.Value("DT_UINT32"): ("UINT32", "uint32_val"),
    DT.Value("DT_UINT64"): ("UINT64", "uint64_val"),
    DT.Value("DT_FLOAT"): ("FP32", "float_val"),
    DT.Value("DT_DOUBLE"): ("FP64", "double_val"),
}
TAKEN = "DT_STRING, DT_BOOL, an integer type, DT_FLOAT or DT_DOUBLE"
# typed fields read as contents by the kernel (wire_keys.field_contents): field -> (its number, element width; 0:
# length-delimited). Integers are varints on the wire, not contents: they stay Python lists.
_CONTENTS = {
    name: (tensor_pb2.TensorProto.DESCRIPTOR.fields_by_name[name].number, width)
    for name, width in (("string_val", 0), ("float_val", 4), ("double_val", 8))
}


def _bad(message: str) -> ApiError:
    return ApiError(422, message)  # INVALID_ARGUMENT (offgraph.server.grpc.status), as REST's 422


def tensor_of(name: str, t: tensor_pb2.TensorProto) -> Tensor:
    """A ``TensorProto`` as the ``Tensor`` every named-tensor protocol is read from (shape ``[]``: ``[1]``)."""
    if t.dtype not in DATATYPES:
        kind = DT.Name(t.dtype) if t.dtype in DT.values() else str(t.dtype)
        raise _bad(f"input '{name[:60]}' has dtype {kind}: send {TAKEN}")
    if t.tensor_shape.unknown_rank:
        raise _bad(f"input '{name[:60]}': its tensor_shape has an unknown rank: give its dims")
    datatype, field_name = DATATYPES[t.dtype]
    shape = [d.size for d in t.tensor_shape.dim] or [1]
    if t.tensor_content and datatype != "BYTES":  # fixed-size elements in their (little-endian) bytes
        return Tensor(name, datatype, shape, raw=t.tensor_content)
    if field_contents is not None and field_name in _CONTENTS:
        # strings and floats as raw contents, as KServe's clients send them: no Python object per element (21k of
        # them for 1,000 candidates with two value lists). Where the count disagrees with the shape, the list, so
        # that the error is the one every protocol words the same way.
        raw, count = field_contents(t.SerializeToString(), *_CONTENTS[field_name])
        if count and count == math.prod(shape):
            return Tensor(name, datatype, shape, raw=raw)
    return Tensor(name, datatype, shape, data=list(getattr(t, field_name)))


def _selection(spec: model_pb2.ModelSpec) -> tuple[int | None, str | None]:
    """(version, label) a model spec asks for; each checked as REST checks it in a path."""
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        if spec.version.value < 0:
            raise ApiError(400, f"invalid version {spec.version.value}: a version is a non-negative integer")
        return spec.version.value, None
    if choice == "version_label":
        return None, spec.version_label
    return None, None


async def _label(spec: model_pb2.ModelSpec) -> tuple[int | None, str | None]:
    version, label = _selection(spec)
    return version, (await label_name(label) if label is not None else None)


def _check_signature(spec: model_pb2.ModelSpec) -> None:
    if spec.signature_name not in ("", SIGNATURE):
        raise _bad(f"signature_name {spec.signature_name[:60]!r}: the model's only signature is '{SIGNATURE}'")


def _score_inputs(
    holder: Any, inputs: Any, version: int | None, label: str | None, limit: int, experiment: ArmChoice | None = None
) -> Scored:
    """``score_tensors`` of a ``PredictRequest``'s inputs, read as ``Tensor`` s here, in the scoring thread: work
    the event loop need not do (with the kernel a ``string_val`` is copied out as raw contents; without it, it
    becomes a Python object per element)."""
    return score_tensors(holder, [tensor_of(k, t) for k, t in inputs.items()], version, label, limit, experiment)


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, ctx: GrpcContext):
        self.ctx = ctx

    async def Predict(self, request: predict_pb2.PredictRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        ctx, method, name = self.ctx, f"/{PREDICTION}/Predict", request.model_spec.name
        started = ctx.begin(context)
        try:
            holder = await get_holder(await model_name(name), ctx.state)
            version, label = await _label(request.model_spec)
            _check_signature(request.model_spec)
            n = max((d.size for t in request.inputs.values() for d in t.tensor_shape.dim[:1]), default=0)
            if n > ctx.state.config.max_candidates:  # before any input is decoded
                raise _bad(too_many_candidates(n, ctx.state.config.max_candidates))
            limit = ctx.state.config.max_candidates
            args = (request.inputs, version, label, limit)
            served, scores, arm = await scored(ctx.state, holder, started, version, label, _score_inputs, *args)
        except asyncio.CancelledError:
            ctx.count_cancelled(context, method, name)
            raise
        except Exception as e:
            await ctx.abort(context, method, name, e)
        out = predict_pb2.PredictResponse()
        out.model_spec.name, out.model_spec.signature_name = holder.name, SIGNATURE
        if served is not None:  # the prior arm of an experiment is no version
            out.model_spec.version.value = served
        if arm is not None:  # in an experiment: the arm that answered, in the response's metadata
            await context.send_initial_metadata(((ARM_METADATA, arm.name),))
        scores_out = out.outputs[OUTPUT]
        scores_out.dtype = DT.Value("DT_FLOAT")
        scores_out.tensor_shape.dim.add(size=len(scores))
        scores_out.tensor_content = np.asarray(scores, dtype="<f4").tobytes()
        return out

    async def GetModelMetadata(  # noqa: N802
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        method, ctx, name = f"/{PREDICTION}/GetModelMetadata", self.ctx, request.model_spec.name
        ctx.begin(context)
        try:
            holder = await get_holder(await model_name(name), ctx.state)
            version, label = await _label(request.model_spec)
            fields = list(request.metadata_field)
            if fields != ["signature_def"]:
                raise _bad(f"metadata_field {fields[:4]}: the metadata served is ['signature_def']")
            meta = metadata(holder, version, label)
        except Exception as e:
            await ctx.abort(context, method, name, e)
        return metadata_proto(meta)

    # the other methods (Classify, Regress, MultiInference) are the generated servicer's UNIMPLEMENTED


def metadata_proto(meta: Any) -> get_model_metadata_pb2.GetModelMetadataResponse:
    """REST's metadata (``offgraph.server.api.routers.tfserving.metadata``) as TF Serving's protos: one description."""
    out = get_model_metadata_pb2.GetModelMetadataResponse()
    out.model_spec.name, out.model_spec.signature_name = meta.model_spec.name, meta.model_spec.signature_name
    out.model_spec.version.value = int(meta.model_spec.version)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for sig_name, sig in meta.metadata.signature_def.signature_def.items():
        proto = sig_map.signature_def[sig_name]
        proto.method_name = "tensorflow/serving/predict"
        for where, tensors in ((proto.inputs, sig.inputs), (proto.outputs, sig.outputs)):
            for key, info in tensors.items():
                where[key].name = info.name
                where[key].dtype = DT.Value(info.dtype)
                where[key].tensor_shape.CopyFrom(
                    tensor_shape_pb2.TensorShapeProto(
                        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d.size)) for d in info.tensor_shape.dim]
                    )
                )
    out.metadata["signature_def"].Pack(sig_map)
    return out


_STATES = get_model_status_pb2.ModelVersionStatus.State


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, ctx: GrpcContext):
        self.ctx = ctx

    async def GetModelStatus(  # noqa: N802
        self, request: get_model_status_pb2.GetModelStatusRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        """REST's ``GET /v1/models/{name}[/versions/{v}|/labels/{l}]``: the versions' states (paths redacted)."""
        method, ctx, name = f"/{MODEL}/GetModelStatus", self.ctx, request.model_spec.name
        ctx.begin(context)
        try:
            holder = await get_holder(await model_name(name), ctx.state)
            version, label = await _label(request.model_spec)
            entries = redacted_view(ctx.state.config.models_dir)(version_status(holder))
            if label is not None:
                version = holder.labels.get(label)
                if version is None:
                    raise ApiError(
                        404, f"model '{holder.name}' has no label '{label[:40]}' (labels: {sorted(holder.labels)})"
                    )
            if version is not None:
                entries = [e for e in entries if e["version"] == str(version)]
                if not entries:
                    raise ApiError(404, f"version {version} of model '{holder.name}' is not known to the server")
        except Exception as e:
            await ctx.abort(context, method, name, e)
        out = get_model_status_pb2.GetModelStatusResponse()
        for entry in entries:
            st = out.model_version_status.add(version=int(entry["version"]), state=_STATES.Value(entry["state"]))
            st.status.error_code = 0 if entry["status"]["error_code"] == "OK" else 2  # tensorflow.error.Code UNKNOWN
            st.status.error_message = entry["status"]["error_message"]
        return out


def add_to_server(server: grpc.aio.Server, ctx: GrpcContext) -> None:
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(ctx), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(ctx), server)

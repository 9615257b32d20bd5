"""KServe v2 (the open inference protocol) over gRPC: ``inference.GRPCInferenceService`` (``ServerLive``,
``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``, ``ModelInfer``), with the protos shipped in
``tritonclient`` (``tritonclient.grpc.service_pb2``, ``service_pb2_grpc``).

Each call answers what its REST twin (``offgraph.server.api.routers.kserve``) answers, from the same code:

* ``ModelInfer``: the inputs become the ``Tensor`` s REST's body becomes (typed ``contents``, or
  ``raw_input_contents`` as clients send it by default: one entry per input, in order, fixed-size elements
  little-endian, BYTES elements each a 4-byte little-endian length and the bytes), scored by
  ``offgraph.server.api.predict_scoring.score_tensors`` (``tensor_inputs``' conventions, the ``:score`` path);
  ``model_version`` ("" for the default) or ``parameters["label"]`` (a string) picks the version; the answer holds
  the output ``scores`` (FP32 ``[N]``) in ``raw_output_contents``, and ``model_name``, ``model_version``, ``id``;
* ``ModelMetadata`` is REST's model metadata (``describe_model``) as the proto;
* ``ServerReady`` is ``/readyz``'s readiness; ``ModelReady`` is true while the model (that version) serves, false
  while it loads or does not serve (an unknown model is NOT_FOUND).

Errors are ``offgraph.server.grpc.status``'s: INVALID_ARGUMENT for a request the model cannot score (the words
REST's 400 gives), NOT_FOUND for an unknown model, version or label, UNAVAILABLE while loading; never INTERNAL for
bad input.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from offgraph import __version__
from offgraph.server.api.deps import get_holder, label_name, model_name, readiness, version_number
from offgraph.server.api.predict_scoring import score_tensors, scored
from offgraph.server.api.routers.kserve import OUTPUT, describe_model
from offgraph.server.api.tensor_inputs import Tensor
from offgraph.server.http.errors import ApiError
from offgraph.server.models.served import ModelLoading, NotServing

if TYPE_CHECKING:
    import grpc

    from offgraph.server.grpc.context import GrpcContext

SERVICE = "inference.GRPCInferenceService"
SERVICE_NAMES = (SERVICE,)

CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The ``InferTensorContents`` field of each datatype (FP16 has none: raw contents only)."""


def _bad(message: str) -> ApiError:
    return ApiError(422, message)  # INVALID_ARGUMENT, REST's 400


def tensors_of(request: service_pb2.ModelInferRequest) -> list[Tensor]:
    """The request's inputs as ``Tensor`` s: each from ``raw_input_contents`` (one per input, in order) when the
    request has them, else from its typed ``contents``."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise _bad(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: one per input, in order"
        )
    out = []
    for i, t in enumerate(request.inputs):
        if raw:
            if t.HasField("contents"):
                raise _bad(f"input '{t.name[:60]}' has both contents and raw_input_contents: one of the two")
            out.append(Tensor(t.name, t.datatype, list(t.shape), raw=raw[i]))
        else:
            field = CONTENTS.get(t.datatype)
            if field is None and t.datatype in ("FP16", "BF16"):
                raise _bad(f"input '{t.name[:60]}' is {t.datatype}: send it as raw_input_contents")
            data = list(getattr(t.contents, field)) if field is not None else []
            out.append(Tensor(t.name, t.datatype, list(t.shape), data=data))
    return out


async def _version(text: str) -> int | None:
    return None if text == "" else await version_number(text)


async def _label(request: service_pb2.ModelInferRequest) -> str | None:
    if "label" not in request.parameters:
        return None
    p = request.parameters["label"]
    if p.WhichOneof("parameter_choice") != "string_param":
        raise _bad("parameters['label'] is a version label: a string_param")
    return await label_name(p.string_param)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, ctx: GrpcContext):
        self.ctx = ctx

    def _method(self, name: str) -> str:
        return f"/{SERVICE}/{name}"

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=(await readiness(self.ctx.state, None)).ready)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerMetadataResponse(name="offgraph", version=__version__, extensions=[])

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        ctx = self.ctx
        try:
            holder = await get_holder(await model_name(request.name), ctx.state)
            version = await _version(request.version)
        except Exception as e:
            await ctx.abort(context, self._method("ModelReady"), request.name, e)
        try:
            holder.release(holder.acquire(version))
            ready = True
        except (NotServing, ModelLoading):  # loading, refused, unloaded, not that version
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        ctx = self.ctx
        try:
            holder = await get_holder(await model_name(request.name), ctx.state)
            meta = describe_model(holder, await _version(request.version))
        except Exception as e:
            await ctx.abort(context, self._method("ModelMetadata"), request.name, e)
        out = service_pb2.ModelMetadataResponse(name=meta.name, versions=meta.versions, platform=meta.platform)
        for tensors, proto in ((meta.inputs, out.inputs), (meta.outputs, out.outputs)):
            for t in tensors:
                proto.add(name=t.name, datatype=t.datatype, shape=t.shape)
        return out

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        ctx, name = self.ctx, request.model_name
        started = ctx.begin(context)
        try:
            holder = await get_holder(await model_name(name), ctx.state)
            version, label = await _version(request.model_version), await _label(request)
            for o in request.outputs:
                if o.name != OUTPUT:
                    raise _bad(f"output '{o.name[:60]}': the model's only output is '{OUTPUT}'")
            args = (tensors_of(request), version, label, ctx.state.config.max_candidates)
            served, scores, arm = await scored(ctx.state, holder, started, version, label, score_tensors, *args)
        except asyncio.CancelledError:
            ctx.count_cancelled(context, self._method("ModelInfer"), name)
            raise
        except Exception as e:
            await ctx.abort(context, self._method("ModelInfer"), name, e)
        out = service_pb2.ModelInferResponse(
            model_name=holder.name, model_version="" if served is None else str(served), id=request.id
        )
        if arm is not None:  # in an experiment: the arm that answered, as REST's parameters name it
            out.parameters["arm"].string_param = arm.name
        out.outputs.add(name=OUTPUT, datatype="FP32", shape=[len(scores)])
        out.raw_output_contents.append(np.asarray(scores, dtype="<f4").tobytes())
        return out


def add_to_server(server: grpc.aio.Server, ctx: GrpcContext) -> None:
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(ctx), server)

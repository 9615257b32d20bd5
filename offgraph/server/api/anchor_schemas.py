"""Response models of the TensorFlow Serving and KServe v2 routes (pydantic v2), in their JSON shapes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from offgraph.server.api.schemas import MODEL_VERSION_STATUS_DOC, ModelVersionStatus, ScoreKind

InputScope = Literal["request", "item", "both"]
SCOPE_DOC = (
    "`request`: one value per request (in `context`, or the same in every instance); `item`: one per instance; "
    "`both`: read at both scopes."
)


# -- TensorFlow Serving -----------------------------------------------------------------------------------------
class PredictResponse(BaseModel):
    predictions: list[float] = Field(
        description="One score per instance, in instance order: the same as `:score` gives for those candidates "
        "(calibrated CTRs, or ranking scores: `GET /v1/models/{name}` `loaded.score_kind`)."
    )


class VersionStatusList(BaseModel):
    model_version_status: list[ModelVersionStatus] = Field(description=MODEL_VERSION_STATUS_DOC)


class TensorDim(BaseModel):
    size: str = Field(description="The dimension's size (-1: any), as a string (TensorFlow Serving's int64 in JSON).")
    name: str = ""


class TensorShape(BaseModel):
    dim: list[TensorDim]
    unknown_rank: bool = False


class TensorInfo(BaseModel):
    dtype: Literal["DT_STRING", "DT_DOUBLE", "DT_FLOAT"] = Field(
        description="`DT_DOUBLE`: a number; `DT_STRING`: a string (an `id` input takes numbers too)."
    )
    tensor_shape: TensorShape
    name: str = Field(description="The raw input's name (the key in an instance or in `context`).")
    scope: InputScope | None = Field(default=None, description=SCOPE_DOC)
    score_kind: ScoreKind | None = Field(default=None, description="What the output's scores are (outputs only).")


class SignatureDef(BaseModel):
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    method_name: Literal["tensorflow/serving/predict"] = "tensorflow/serving/predict"


class SignatureDefMap(BaseModel):
    signature_def: dict[str, SignatureDef]


class MetadataBody(BaseModel):
    signature_def: SignatureDefMap


class ModelSpec(BaseModel):
    name: str
    signature_name: str = ""
    version: str


class ModelMetadata(BaseModel):
    """TensorFlow Serving's GetModelMetadata answer: the `serving_default` signature of the served version."""

    model_spec: ModelSpec
    metadata: MetadataBody


# -- KServe v2 (open inference protocol) --------------------------------------------------------------------------
class ServerLive(BaseModel):
    live: bool


class ServerReady(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class MetadataTensor(BaseModel):
    name: str
    datatype: Literal["BYTES", "FP64", "FP32"] = Field(description="`FP64`: a number; `BYTES`: a string.")
    shape: list[int] = Field(description="-1: any size; the first dimension is 1 for a request-scope input.")
    parameters: dict[str, str] | None = Field(default=None, description="`scope`: " + SCOPE_DOC)


class KServeModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(description="The served version.")
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]

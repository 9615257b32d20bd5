"""Response models of the TensorFlow Serving and KServe v2 routes (pydantic v2), in their JSON shapes."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, WithJsonSchema

from offgraph.server.api.schemas import MODEL_VERSION_STATUS_DOC, ModelVersionStatus, ScoreKind
from offgraph.server.api.tensor_inputs import DATATYPES

InputScope = Literal["request", "item", "both"]
SCOPE_DOC = (
    "`request`: one value per request (in `context`, or the same in every instance); `item`: one per instance; "
    "`both`: read at both scopes."
)


# -- TensorFlow Serving -----------------------------------------------------------------------------------------
ARM_DOC = (
    "Only in an experiment (`PUT /v1/models/{name}/experiment`) and when the request named no version or label: "
    "the arm that answered (the label, `v<version>`, or `prior`), as `:score` names it."
)
ARM_VERSION_DOC = "Only with `arm`: the version that answered (absent for the prior arm, which is no model)."


class PredictResponse(BaseModel):
    predictions: list[float] = Field(
        description="One score per instance, in instance order: the same as `:score` gives for those candidates "
        "(calibrated CTRs, or ranking scores: `GET /v1/models/{name}` `loaded.score_kind`)."
    )
    arm: str | None = Field(None, description=ARM_DOC)
    version: int | None = Field(None, description=ARM_VERSION_DOC)


class ColumnarPredictResponse(BaseModel):
    outputs: list[float] = Field(
        description="TensorFlow Serving's columnar answer (to `inputs`): one score per candidate, in the inputs' "
        "order, the same as `:score` gives for those candidates."
    )
    arm: str | None = Field(None, description=ARM_DOC)
    version: int | None = Field(None, description=ARM_VERSION_DOC)


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
    datatype: Literal["BYTES", "FP64", "FP32"] = Field(
        description="`FP64`: a number (`infer` takes any integer or floating datatype for it); `BYTES`: a string "
        "(an id may be sent as an integer datatype too)."
    )
    shape: list[int] = Field(
        description="-1: any size. The first dimension: one element per candidate (-1), or 1 for a request-scope "
        "input (given once, or one element per candidate, all equal); a second -1: a list of values per candidate "
        '(`[N, K]`, padded with "" where a candidate has fewer).'
    )
    parameters: dict[str, str] | None = Field(default=None, description="`scope`: " + SCOPE_DOC)


class KServeModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(description="The served version.")
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


# The KServe v2 inference request and answer (REST ``/v2/models/{name}[/versions/{v}]/infer``). ``data`` is any
# JSON array: its elements are checked against the datatype by offgraph.server.api.tensor_inputs, which words
# the 400s naming the input (a schema could not say which elements go with which datatype, nor the shape).
_DATA_SCHEMA = {
    "type": "array",
    "items": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "array"}]},
    "description": "The tensor's elements, flat in row-major order (or nested): strings for BYTES, booleans for "
    "BOOL, numbers otherwise. Absent when `parameters.binary_data_size` gives them as binary data after the JSON.",
}
InferParameter = Union[StrictBool, StrictInt, float, StrictStr]


class InferInputTensor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A raw input of the model (`GET /v2/models/{name}` lists them).")
    shape: list[Annotated[int, Field(ge=0)]] = Field(
        description="`[N]` or `[N, 1]`: one element per candidate; `[N, K]`: a list of K values per candidate "
        '(padded with ""); `[1]` (`[1, K]`) for a request-scope input given once.'
    )
    datatype: Literal[DATATYPES] = Field(  # type: ignore[valid-type]
        description="As the metadata says, or a compatible one: any integer or floating datatype for a number, "
        "BYTES (or an integer datatype) for an id or a string."
    )
    parameters: dict[str, InferParameter] | None = Field(
        default=None,
        description="`binary_data_size`: the byte size of this input's binary data (the binary tensor extension: "
        "the bytes follow the JSON, in input order, after `Inference-Header-Content-Length` bytes of JSON).",
    )
    data: Annotated[list[Any] | None, WithJsonSchema(_DATA_SCHEMA)] = None


class InferRequestedOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["scores"] = Field(description="The model's only output.")
    parameters: dict[str, InferParameter] | None = Field(
        default=None,
        description="`binary_data`: true for the scores as binary data (little-endian FP32) after the JSON.",
    )


class InferRequest(BaseModel):
    """A KServe v2 inference request: the candidates' raw features as named tensors."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="Echoed in the answer.")
    parameters: dict[str, InferParameter] | None = Field(
        default=None,
        description="`label`: a version label (`canary`): the version it names scores (404 for an unknown label; "
        "with `/versions/{v}` it must name v). `binary_data_output`: true for binary outputs. Others are ignored.",
    )
    inputs: list[InferInputTensor] = Field(min_length=1, description="The model's raw inputs, each at most once.")
    outputs: list[InferRequestedOutput] | None = Field(default=None, description="`scores`, the only output.")


class InferOutputTensor(BaseModel):
    name: Literal["scores"]
    datatype: Literal["FP32"]
    shape: list[int] = Field(description="`[N]`: one score per candidate.")
    data: list[float] | None = Field(
        default=None, description="The scores, in candidate order (absent when sent as binary data)."
    )
    parameters: dict[str, int] | None = Field(default=None, description="`binary_data_size` of binary scores.")


class InferResponse(BaseModel):
    """The scores the `:score` route gives for the same candidates, and the version that made them."""

    model_name: str
    model_version: str | None = Field(
        default=None, description="The version that made the scores (absent only for an experiment's prior arm)."
    )
    id: str | None = None
    parameters: dict[str, str] | None = Field(default=None, description="`arm`: " + ARM_DOC)
    outputs: list[InferOutputTensor]

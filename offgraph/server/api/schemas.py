"""Request and response models of the HTTP API (pydantic v2)."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from offgraph.calibration import SCORE_KINDS
from offgraph.model.train_config import LOSSES
from offgraph.server.models.control import LABEL_PATTERN
from offgraph.server.models.experiment import MAX_ARMS, WEIGHT_TOLERANCE, Arm, check_arms

MAX_NUMBER = sys.float_info.max
"""Largest magnitude of a numeric feature value: FG reads numbers as float64, so an integer must fit one."""

FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]

ScoreKind = Literal[SCORE_KINDS]  # type: ignore[valid-type] # a tuple of names: pydantic reads it, mypy cannot
SCORE_KIND_DOC = (
    "What the version's scores are: `ctr`, calibrated CTRs (probabilities of a positive: a pointwise "
    "model, or a listwise one with the calibration its training fitted); `ranking`, scores that "
    "order one request's candidates but are not probabilities (a listwise model without a fitted "
    "calibration, e.g. trained with --validation 0)."
)


def _fits_float64(v: int) -> int:
    if -MAX_NUMBER <= v <= MAX_NUMBER:  # int-float comparison is exact in Python
        return v
    raise PydanticCustomError(
        "number_too_large",
        "integer of {bits} bits is beyond the float64 range (numbers must be within +-1.7976931348623157e308)",
        {"bits": v.bit_length()},
    )


FeatureInt = Annotated[StrictInt, AfterValidator(_fits_float64)]


def _kind(v: Any) -> str | None:
    """Union branch of a raw feature value, by its JSON type (None: not a feature value)."""
    if v is None:
        return "null"
    t = type(v)
    if t is str:
        return "str"
    if t is bool:
        return "bool"
    if t is int:
        return "int"
    if t is float:
        return "float"
    if t is list:
        return "list"
    return None


_SCALARS = (
    Annotated[StrictStr, Tag("str")],
    Annotated[StrictBool, Tag("bool")],
    Annotated[FeatureInt, Tag("int")],
    Annotated[FiniteFloat, Tag("float")],
    Annotated[None, Tag("null")],
)

# The published schema: JSON types, not the validator's tagged union (whose oneOf of integer and number
# would make every integer match two branches, i.e. none). An integer literal is a number like any other.
# The bounds are float64's max as a JSON number (1.7976931348623157e+308), which JSON parsers read as that float.
# Read as an exact decimal it is a little below the integer the float is, so a validator doing exact arithmetic
# (jsonschema_rs) refuses the few 309-digit integers between the two, which the server takes: the published
# bound is at most that much stricter than the server, never looser.
_SCALAR_SCHEMA = [
    {"type": "string"},
    {"type": "number", "minimum": -MAX_NUMBER, "maximum": MAX_NUMBER},
    {"type": "boolean"},
    {"type": "null"},
]

Scalar = Annotated[
    Union[_SCALARS],  # type: ignore[valid-type]  # noqa: UP007 (a tuple of branches, built at import)
    Discriminator(
        _kind,
        custom_error_type="feature_value",
        custom_error_message="a list item must be a string, a finite number, a boolean or null (no nested lists "
        "or objects)",
    ),
]

FeatureValue = Annotated[
    Union[(*_SCALARS, Annotated[list[Scalar], Tag("list")])],  # type: ignore[valid-type,misc]  # noqa: UP007
    Discriminator(
        _kind,
        custom_error_type="feature_value",
        custom_error_message="a feature value must be a string, a finite number, a boolean, null or a list of "
        "those (no nested objects)",
    ),
    WithJsonSchema(
        {
            "anyOf": [*_SCALAR_SCHEMA, {"type": "array", "items": {"anyOf": _SCALAR_SCHEMA}}],
            "description": "A string, a number within the float64 range (no NaN or Infinity), a boolean, null, or a "
            "list of those.",
        }
    ),
]
"""One raw feature value: a scalar or a list of scalars. NaN, Infinity and integers beyond float64 are refused."""


def _version(v: Any) -> int:
    t = type(v)
    if t is float and v.is_integer():  # finite too: an integral float is neither NaN nor infinite
        v = int(v)
    elif t is not int:
        raise PydanticCustomError("int_type", "Input should be a non-negative integer")
    if v < 0:
        raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal to 0")
    return v


Version = Annotated[Any, PlainValidator(_version), WithJsonSchema({"type": "integer", "minimum": 0})]
"""A model version: a non-negative integer (JSON ``2.0`` is the integer 2, as JSON Schema reads it)."""

Label = Annotated[str, Field(pattern=LABEL_PATTERN)]
"""A version label (``offgraph.server.models.control.LABEL_PATTERN``)."""

Features = dict[str, FeatureValue]

_FEATURES_DOC = (
    "Raw features by input name (the feature spec's `input` columns, listed by "
    '`GET /v1/models/{name}` under `inputs`). A missing key, null, "" or [] is *no value* (a zero '
    "embedding); keys the model does not read are ignored (counted in `offgraph_ignored_keys_total`); "
    "an input sent in the other place (a request-scope input in a candidate, an item-scope input in "
    "the request) is a 422 naming it."
)


CANDIDATES_DOC = (
    "Candidates (item-scope raw features), scored in this order; at least one, at most the "
    "server's --max-candidates. " + _FEATURES_DOC
)


class ScoreRequest(BaseModel):
    """One request: its request-level features and the candidates to score."""

    model_config = ConfigDict(
        extra="forbid",
        # no model's inputs: a model's own examples are added to /openapi.json per served model
        # (offgraph.server.api.openapi_examples)
        json_schema_extra={
            "examples": [
                {
                    "request": {"user_id": "u-196", "hour": 14},
                    "candidates": [{"item_id": "i-242", "tags": ["a", "b"]}, {"item_id": "i-302", "tags": []}],
                }
            ]
        },
    )

    request: Features = Field(default_factory=dict, description="Request-scope raw features. " + _FEATURES_DOC)
    candidates: list[Features] = Field(min_length=1, description=CANDIDATES_DOC)
    version: Version | None = Field(
        default=None,
        description="Model version that must score the request (404 unless it serves: by default or "
        "labelled); omitted: the version `label` names, else the default one.",
    )
    label: Label | None = Field(
        default=None,
        description="Version label (`stable`, `canary`: `PUT /v1/models/{name}/labels/{label}`) whose version "
        "must score the request (404 for a label the model does not have; with `version` too, 404 unless the label "
        "names that version).",
    )


class ScoreResponse(BaseModel):
    model: str = Field(description="Model name.")
    version: int | None = Field(
        description="Model version that computed the scores (null only for an experiment's prior arm, which "
        "scores with no model)."
    )
    arm: str | None = Field(
        None,
        description="The experiment arm that answered (`PUT /v1/models/{name}/experiment`): its label, "
        "`v<version>` or `prior`; absent when the request was outside an experiment.",
    )
    scores: list[float] = Field(
        description="One per candidate, in candidate order: calibrated CTRs, or ranking scores (see `score_kind`)."
    )
    score_kind: ScoreKind = Field("ctr", description=SCORE_KIND_DOC)
    unknown_candidates: int = Field(
        0,
        description="Candidates whose key has no row in the model's item feature "
        "table (scored with no stored features); 0 for a model without tables.",
    )
    unknown_request: bool = Field(
        False, description="The request's key (e.g. user_id) has no row in its feature table."
    )


class ErrorItem(BaseModel):
    loc: str = Field(description="Where: `body`, `candidates[3].genres`, `request.age`, `version`...")
    msg: str = Field(description="What is wrong there.")
    type: str | None = Field(description="Kind of problem (pydantic's error type).")


class ErrorResponse(BaseModel):
    detail: str = Field(description="What is wrong, in words.")
    errors: list[ErrorItem] | None = Field(
        default=None, description="Validation errors (422): location and message of each problem."
    )


class LabelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Version = Field(
        description="The version the label names; loaded beside the default one if it does not serve."
    )


class ExperimentArm(BaseModel):
    """One arm: exactly one of `label`, `version` or `prior: true`, and its weight."""

    model_config = ConfigDict(extra="forbid")
    label: Label | None = Field(None, description="The label whose version serves this arm.")
    version: Version | None = Field(None, description="The version that serves this arm (it must serve).")
    prior: Literal[True] | None = Field(
        None,
        description="The rule-based arm: no model, the candidates answered in the order sent (scores "
        "`(n - i) / n`, `score_kind` ranking, `version` null).",
    )
    weight: float = Field(gt=0, le=1, allow_inf_nan=False, description="Share of the sticky keys this arm gets.")

    def arm(self) -> Arm:
        if self.prior:
            return Arm("prior", None, self.weight)
        return (
            Arm("label", self.label, self.weight)
            if self.label is not None
            else Arm("version", self.version, self.weight)
        )

    @model_validator(mode="after")
    def _one_kind(self) -> ExperimentArm:
        if sum(x is not None for x in (self.label, self.version, self.prior)) != 1:
            raise ValueError("an arm names exactly one of label, version or prior: true")
        return self


class ExperimentRequest(BaseModel):
    """A model's experiment: the arms, in order (the first is the control), and the sticky key."""

    model_config = ConfigDict(extra="forbid")
    arms: list[ExperimentArm] = Field(
        min_length=1,
        max_length=MAX_ARMS,
        description=f"The arms; their weights sum to 1 (within {WEIGHT_TOLERANCE:g}; not normalised). The "
        "first arm also serves the requests without a sticky key value.",
    )
    sticky_key: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$",
        description="The request feature whose value fixes the arm (`user_id`): a user stays in one arm.",
    )
    salt: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Hashed with the key; omitted: the current experiment's, or a new random one. A new salt "
        "lays the arms out afresh (every user may move); the same salt moves only the users a weight change must.",
    )

    @model_validator(mode="after")
    def _arms(self) -> ExperimentRequest:
        check_arms([a.arm() for a in self.arms])
        return self


class ExperimentArmStatus(BaseModel):
    arm: str = Field(description="The arm's name in metrics and responses: the label, `v<version>` or `prior`.")
    label: str | None = None
    version: int | None = None
    prior: bool | None = None
    weight: float
    ranges: list[list[float]] = Field(description="The ranges of [0, 1) the arm owns ([low, high)).")


class ExperimentStatus(BaseModel):
    model: str
    sticky_key: str
    salt: str
    generation: int = Field(description="When it was set (ns since the epoch).")
    arms: list[ExperimentArmStatus]


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Version | None = Field(
        default=None, description="Version to load and pin; omitted: follow the newest complete version again."
    )


class RefusedVersion(BaseModel):
    version: int
    reason: str
    at_unix: float


class StoreStatus(BaseModel):
    """Cumulative counters of the loaded version's scorer (``Scorer.stats()``) and its freshness."""

    model_config = ConfigDict(extra="allow")
    store_rows_read: int | None = None
    cache_hits: int | None = None
    cache_misses: int | None = None
    cache_hit_ratio: float | None = None
    cache_entries: int | None = None
    catch_ups: int | None = None
    last_feed_poll_unix: float | None = Field(
        default=None, description="When the follower last read the live writer's feed: rows fed before it are served."
    )
    last_catch_up_unix: float | None = Field(
        default=None,
        description="When the last catch-up of the RocksDB view with the live writer began (every --catch-up-seconds).",
    )
    freshness_seconds: float | None = Field(
        default=None,
        description="Seconds since the follower last saw everything the live writer had written (feed epochs mapped).",
    )
    changes_applied: int | None = None


class MemoryParts(BaseModel):
    row_cache: int
    block_cache: int
    item_cache: int
    feed: int


class MemorySplitStatus(BaseModel):
    memory_mb: float = Field(description="The worker process's budget (--memory-mb), all its models together.")
    models: int = Field(description="Models sharing it: each gets memory_mb / models.")
    versions: int = Field(
        1, description="Versions of this model served at once (labels): each gets memory_mb / models / versions."
    )
    row_cache_mb: float
    block_cache_mb: int
    item_cache_items: int
    item_bytes: int = Field(
        1874,
        description="What an item is counted at: its FG item cache entry, its candidate cache entry, and its join "
        "record with item tables.",
    )
    feed_mb: float
    index_mb: float = Field(
        description="What the version's index needs (estimated from its manifest), held by the block cache."
    )
    model_mb: float = Field(description="This version's parts together.")


class MemoryStatus(BaseModel):
    """The version's share of its worker's memory budget (``offgraph.scoring.memory_budget``) and what each part holds."""

    split: MemorySplitStatus
    budget_bytes: MemoryParts = Field(
        description="Bytes each part may hold (the FG item cache: its items at an estimated size)."
    )
    used_bytes: MemoryParts = Field(
        description="Bytes each part holds now, in this worker: the row cache's "
        "arena, the block cache's usage, the FG items held (estimated), "
        "the write feed's mapped epochs."
    )


class LoadedVersion(BaseModel):
    version: int
    state: Literal["serving"] = "serving"
    loaded_at_unix: float
    load_seconds: float
    in_flight: int
    quantization: str | None
    shards: int | None
    backend: str = Field("rocksdb", description="Where the rows live: `rocksdb` (the version's directory) or `redis`.")
    rows_at: str | None = Field(
        None,
        description="A remote backend's rows: its URL and namespace (`redis://HOST:PORT namespace NAME/VERSION/ID`).",
    )
    embedding_dim: int | None
    row_counts: dict[str, int]
    total_rows: int
    row_cache_mb: float
    memory: MemoryStatus | None = None
    created_at: str | None
    training: dict[str, Any] | None = Field(description="Held-out metrics and config of the training run.")
    store: StoreStatus
    training_loss: Literal[LOSSES] = Field(  # type: ignore[valid-type] # (a tuple of names, as ScoreKind)
        "pointwise",
        description="The loss the version was trained with (a version exported before it was "
        "recorded: its training config's, else pointwise).",
    )
    score_kind: ScoreKind = Field("ctr", description=SCORE_KIND_DOC)


class FeatureTableStatus(BaseModel):
    name: str
    scope: Literal["request", "item"]
    key: str = Field(description="The raw input the rows are keyed by: send it alone (ids-only requests).")
    columns: list[str] = Field(description="Raw inputs the table fills when the body does not send them.")
    present: bool = Field(description="The table exists on disk (else every key is unknown until it is created).")


class VersionStatusDetail(BaseModel):
    error_code: str = Field(
        "OK", description="`OK`, or `UNKNOWN` for a version that was refused (see `error_message`)."
    )
    error_message: str = Field("", description="Why the version was refused; empty when it is not.")


class ModelVersionStatus(BaseModel):
    """One version's state, as TensorFlow Serving's model status API words it."""

    version: str = Field(description="The version number, as a string (TensorFlow Serving's int64 in JSON).")
    state: Literal["LOADING", "AVAILABLE", "END"] = Field(
        description="`AVAILABLE`: it serves; `LOADING`: it is being loaded and warmed up; `END`: it served before "
        "the current one, or it was refused."
    )
    status: VersionStatusDetail


MODEL_VERSION_STATUS_DOC = (
    "TensorFlow Serving's view of the versions: the serving one, the one loading, the previous one and the refused "
    "ones, newest first."
)


class ModelStatus(BaseModel):
    name: str
    state: Literal["new", "loading", "serving", "unloaded", "failed"]
    policy: Literal["latest", "pinned", "unloaded"] = Field(
        description="latest: new versions are swapped in when they appear; pinned: an admin chose the version; "
        "unloaded: an admin unloaded the model."
    )
    versions_on_disk: list[int] = Field(description="Complete versions (with a manifest).")
    loaded: LoadedVersion | None
    loading_version: int | None
    previous_version: int | None = Field(description="Version served before the current one (:rollback target).")
    refused: list[RefusedVersion]
    scans: int = Field(
        0,
        description="Scans of MODELS that have looked at this model since the server started "
        "(every --poll-seconds): wait for it to grow to see what the next scan did.",
    )
    inputs: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Raw feature names read per scope: `request` (sent once, in "
        "`request`), `item` (sent in each candidate).",
    )
    feature_tables: list[FeatureTableStatus] = Field(
        default_factory=list,
        description="The loaded version's feature tables (MODELS/NAME/features/): what an "
        "ids-only request may leave out.",
    )
    labels: dict[str, int] = Field(
        default_factory=dict,
        description="Version labels an admin set (`stable`, `canary`), label -> version: a request with `label` "
        "is scored by that version.",
    )
    served_versions: list[int] = Field(
        default_factory=list,
        description="Every version that serves: the default one first (the one `loaded` describes), then the "
        "labelled ones. They share the model's memory budget equally.",
    )
    last_error: str | None
    updater: dict[str, Any] | None = Field(
        None,
        description="The streaming updater's status (MODELS/NAME/updater-status.json, as of the last scan): "
        "version, rows applied per second, backlog (items, rows, oldest_unapplied_s), for Kafka "
        "the lag per partition (messages, rows, seconds); age_seconds: how old it is (a stale "
        "status means no updater runs). None: no updater has run for this model.",
    )
    model_version_status: list[ModelVersionStatus] = Field(default_factory=list, description=MODEL_VERSION_STATUS_DOC)


class ModelList(BaseModel):
    models: list[ModelStatus]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool
    models: dict[str, str] = Field(description="State of each model.")
    detail: str


VALIDATION_ERROR = "Invalid request: the message names each problem."


def error_responses(**descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for error codes, each an ``ErrorResponse``: ``error_responses(e404="...")``.

    A 422 is always listed: FastAPI would otherwise document its own validation error shape,
    which this server never sends.
    """
    out: dict[int | str, dict[str, Any]] = {
        int(code[1:]): {"model": ErrorResponse, "description": d} for code, d in descriptions.items()
    }
    out.setdefault(422, {"model": ErrorResponse, "description": VALIDATION_ERROR})
    return out

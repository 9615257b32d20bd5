"""What the client's calls return: the server's response bodies as frozen dataclasses.

Field names are the HTTP API's (``offgraph.server.api.schemas``; ``tests/client/test_client_results.py`` checks
that they stay the same). Keys a newer server adds are ignored; the nested status objects that
carry counters (``loaded.store``, ``loaded.memory``, ``loaded.training``, ``updater``) stay dicts,
as the server sends them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ScoreResult:
    """``POST /v1/models/{name}:score``: one score per candidate, in candidate order."""

    model: str
    version: int | None  # None only for an experiment's prior arm (no model scored: the order sent)
    scores: list[float]
    score_kind: str = "ctr"  # "ctr": calibrated CTRs; "ranking": they order the candidates, not probabilities
    unknown_candidates: int = 0  # candidates whose key has no row in the model's item feature table
    unknown_request: bool = False  # the request's key has no row in its feature table
    arm: str | None = None  # the model's experiment arm that answered (None: no experiment, or a named version)


@dataclass(frozen=True)
class LoadedVersion:
    """The version a model serves (``loaded`` of ``GET /v1/models/{name}``)."""

    version: int
    loaded_at_unix: float
    load_seconds: float
    in_flight: int
    quantization: str | None
    shards: int | None
    embedding_dim: int | None
    row_counts: dict[str, int]
    total_rows: int
    row_cache_mb: float
    created_at: str | None
    training: dict[str, Any] | None
    store: dict[str, Any]
    state: str = "serving"
    memory: dict[str, Any] | None = None
    training_loss: str = "pointwise"
    score_kind: str = "ctr"
    backend: str = "rocksdb"
    rows_at: str | None = None


@dataclass(frozen=True)
class RefusedVersion:
    version: int
    reason: str
    at_unix: float


@dataclass(frozen=True)
class FeatureTable:
    name: str
    scope: str  # "request" or "item"
    key: str  # the raw input the rows are keyed by: send it alone (ids-only requests)
    columns: list[str]
    present: bool


@dataclass(frozen=True)
class VersionStatusDetail:
    error_code: str = "OK"  # "UNKNOWN" for a refused version
    error_message: str = ""


@dataclass(frozen=True)
class ModelVersionStatus:
    """One version's state as TensorFlow Serving words it (``model_version_status``)."""

    version: str
    state: str  # LOADING, AVAILABLE, END
    status: VersionStatusDetail


@dataclass(frozen=True)
class ModelStatus:
    """``GET /v1/models/{name}`` (and the answer of the admin calls): what is on disk and what is served."""

    name: str
    state: str  # new, loading, serving, unloaded, failed
    policy: str  # latest, pinned, unloaded
    versions_on_disk: list[int]
    loaded: LoadedVersion | None
    loading_version: int | None
    previous_version: int | None  # the :rollback target
    refused: list[RefusedVersion]
    last_error: str | None
    scans: int = 0
    inputs: dict[str, list[str]] = field(default_factory=dict)  # raw input names by scope: request, item
    feature_tables: list[FeatureTable] = field(default_factory=list)
    updater: dict[str, Any] | None = None
    model_version_status: list[ModelVersionStatus] = field(default_factory=list)  # newest first
    labels: dict[str, int] = field(default_factory=dict)  # label -> version (set_label)
    served_versions: list[int] = field(default_factory=list)  # the default version first, then the labelled ones


@dataclass(frozen=True)
class Readiness:
    """``GET /readyz``: ``ready`` once every model is loaded and warmed up, in every worker."""

    ready: bool
    models: dict[str, str]  # each model's state
    detail: str


def parse(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls`` from a JSON object: its fields by name (nested ones built too), other keys ignored."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kw = {k: v for k, v in data.items() if k in names}
    if cls is ModelStatus:
        loaded = kw.get("loaded")
        kw["loaded"] = None if loaded is None else parse(LoadedVersion, loaded)
        kw["refused"] = [parse(RefusedVersion, r) for r in kw.get("refused", ())]
        kw["feature_tables"] = [parse(FeatureTable, t) for t in kw.get("feature_tables", ())]
        kw["model_version_status"] = [parse(ModelVersionStatus, v) for v in kw.get("model_version_status", ())]
    elif cls is ModelVersionStatus:
        kw["status"] = parse(VersionStatusDetail, kw.get("status", {}))
    return cls(**kw)

"""The typed manifest of a model version (``manifest.json``), as ``load_manifest`` returns it.

The model is frozen and strict: a value of the wrong JSON type is refused, not converted, so that
``to_dict()`` gives back the JSON that was read. Keys it does not name (a newer exporter's) are kept
as they are and round-trip too. Nested JSON objects it does not type (``spec``, ``training``) stay
dicts: read them, do not change them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="allow")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object this was read from: keys absent there stay absent."""
        return self.model_dump(mode="json", exclude_unset=True)


class FieldRecord(_Record):
    """One embedding table: field ``name`` is table ``table_id`` of ``rows`` rows."""

    name: str
    table_id: int
    rows: int
    scope: str | None = None
    op: str | None = None
    pooling: str | None = None


class StoreRecord(_Record):
    """The store's settings (``offgraph.store.StoreConfig``'s, kept as extra keys) and the figures of its export."""

    quant: str
    shards: int
    backend: str = "rocksdb"
    dim: int | None = None
    block_size_kb: int = 16
    path: str = "store"
    row_counts: dict[str, int] = {}
    bytes_on_disk: int | None = None

    @property
    def total_rows(self) -> int:
        return sum(self.row_counts.values())


class StoreFileRecord(_Record):
    """A store file's size and bounded sha256 at export (``offgraph.modeldir.manifest.store_file_records``)."""

    kind: str
    bytes: int
    sha256: str
    hashed_bytes: int | None = None


class FileRecord(_Record):
    """A version file's size and whole xxh3-128 at export (``offgraph.modeldir.manifest.version_file_records``)."""

    bytes: int
    xxh3_128: str


class Checksums(_Record):
    dense: dict[str, str] = {}
    dense_digest: str | None = None
    store_files: dict[str, StoreFileRecord] | None = None
    files: dict[str, FileRecord] | None = None
    """Every file of the version but the manifest, whole: what a copy (object storage) is checked against.
    Absent in versions exported before it."""


class DenseSplitRecord(_Record):
    """The dense SavedModel's signature ``name`` that takes the request part once: fields ``request_fields``
    (request-scope, indices in spec order) as [1, F_r, D] and ``candidate_fields`` (the others) as [N, F_c, D]."""

    name: str
    request_fields: tuple[int, ...]
    candidate_fields: tuple[int, ...]
    inputs: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None


class DenseRecord(_Record):
    path: str = "dense"
    signature: dict[str, Any] | None = None
    split: DenseSplitRecord | None = None
    """Absent in versions exported before the split signature: they serve with ``signature`` alone."""


class ExportSeconds(_Record):
    store: float
    total: float


class HotSetRecord(_Record):
    """The version's static hot set (``offgraph.modeldir.hot_set``): ``rows`` entries in file ``path``, counted over
    ``lookups`` lookups of the training rows of ``source``; ``sha256`` of the file."""

    path: str
    rows: int
    lookups: int
    source: str
    sha256: str


class Manifest(_Record):
    """A version's manifest. Fields a reader may rely on are typed (in the order the exporter writes
    them); older manifests may lack the optional ones."""

    format_version: int
    fg_version: str
    hash: str | None = None
    embedding_dim: int
    fields: tuple[FieldRecord, ...]
    dense_inputs: tuple[dict[str, Any], ...] | None = None
    segmenters: dict[str, Any] | None = None
    spec: dict[str, Any]
    calibration: dict[str, Any] | None = None
    training_loss: str | None = None
    """As recorded; ``offgraph.modeldir.manifest.training_loss`` also reads manifests without it."""
    score_kind: str | None = None
    feature_tables: tuple[dict[str, Any], ...] | None = None
    store: StoreRecord
    dense: DenseRecord | None = None
    training: dict[str, Any] | None = None
    checksums: Checksums
    created_at: str | None = None
    export_seconds: ExportSeconds | None = None
    hot_set: HotSetRecord | None = None
    """Absent in versions exported without training data to count (and before hot sets)."""

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse ``manifest.json``'s text; pydantic's ValidationError says what does not fit."""
        return cls.model_validate_json(text)

    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def table_rows(self) -> dict[int, int]:
        """Rows of each table, by table id."""
        return {f.table_id: f.rows for f in self.fields}

    def __getitem__(self, key: str) -> Any:
        """The manifest's JSON by key, as ``json.load`` gives it (for tools and tests that hold the file's
        format; offgraph's own readers use the typed attributes)."""
        return self.to_dict()[key]


def store_record(manifest: Manifest | Mapping[str, Any]) -> StoreRecord:
    """The store record of a manifest, or of a manifest's JSON (or the part of it that holds ``store``)."""
    if isinstance(manifest, Manifest):
        return manifest.store
    return StoreRecord.model_validate(manifest["store"])

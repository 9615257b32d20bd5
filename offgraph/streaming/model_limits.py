"""What a delta for one model version must fit, read from the version's manifest."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from offgraph.modeldir.manifest_model import Manifest
from offgraph.store.quant import Codec


@dataclass(frozen=True)
class ModelLimits:
    """What a delta for one model version must fit (from its manifest)."""

    model: str
    version: int
    dim: int
    table_rows: np.ndarray  # int64 [F]: rows of table id i
    codec: Codec  # the store's record format: which values it can hold

    @classmethod
    def from_manifest(cls, model: str, version: int, manifest: Manifest, codec: Codec) -> ModelLimits:
        fields = manifest.fields
        rows = np.zeros(len(fields), dtype=np.int64)
        for f in fields:
            if not 0 <= f.table_id < len(fields):
                raise ValueError(
                    f"manifest of {model}/{version}: field {f.name!r} has table_id {f.table_id} "
                    f"outside [0, {len(fields)})"
                )
            rows[f.table_id] = f.rows
        return cls(model, int(version), manifest.embedding_dim, rows, codec)

"""The live version of a model: the newest complete version under MODELS/NAME."""

from __future__ import annotations

import logging
from pathlib import Path

from offgraph.modeldir.manifest import check_model_name, complete_versions
from offgraph.modeldir.version import ModelVersion
from offgraph.streaming.model_limits import ModelLimits
from offgraph.streaming.vocabulary_state import VocabularyState

log = logging.getLogger("offgraph.update")


class LiveModel:
    """Finds and opens (mode "w") the newest complete version of MODELS/NAME."""

    def __init__(self, models_dir: str | Path, name: str) -> None:
        self.models_dir = Path(models_dir)
        self.name = check_model_name(name)
        self.model_dir = self.models_dir / name
        self.version: int | None = None
        self.store = None
        self.limits: ModelLimits | None = None
        self.spec = None  # the live version's FeatureSpec (its feature tables)
        self.appends: VocabularyState | None = None  # the keys appended to its vocabularies

    def newest(self) -> int | None:
        v = complete_versions(self.model_dir)
        return v[-1] if v else None

    def open(self, version: int) -> None:
        """Close the current store (if any) and open ``version``'s for writing."""
        vdir = self.model_dir / str(version)
        mv = ModelVersion.open(vdir, verify_dense=False)
        store = mv.open_store("w")
        try:
            limits = ModelLimits.from_manifest(self.name, version, mv.manifest, store.codec)
            spec = mv.spec
            if store.config.dim != limits.dim:
                raise ValueError(f"{vdir}: store dim {store.config.dim} differs from the manifest's {limits.dim}")
            appends = VocabularyState(spec, store)
        except BaseException:
            store.close()
            raise
        self.close()
        self.version, self.store, self.limits, self.spec = int(version), store, limits, spec
        self.appends = appends
        log.info("live version of %s: %d (%s, %d shards)", self.name, version, store.config.quant, store.config.shards)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

"""The live version of a model: the newest complete version under MODELS/NAME."""

from __future__ import annotations

import logging
from pathlib import Path

from offgraph.features.spec import parse_spec
from offgraph.modeldir.manifest import check_model_name, complete_versions, load_manifest, open_version_store
from offgraph.streaming.model_limits import ModelLimits

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

    def newest(self) -> int | None:
        v = complete_versions(self.model_dir)
        return v[-1] if v else None

    def open(self, version: int) -> None:
        """Close the current store (if any) and open ``version``'s for writing."""
        vdir = self.model_dir / str(version)
        manifest = load_manifest(vdir, verify_dense=False)
        store = open_version_store(vdir, manifest, "w")
        try:
            limits = ModelLimits.from_manifest(self.name, version, manifest, store.codec)
            spec = parse_spec(manifest["spec"], source=str(vdir / "manifest.json"))
            if store.config.dim != limits.dim:
                raise ValueError(f"{vdir}: store dim {store.config.dim} differs from the manifest's {limits.dim}")
        except BaseException:
            store.close()
            raise
        self.close()
        self.version, self.store, self.limits, self.spec = int(version), store, limits, spec
        log.info("live version of %s: %d (%s, %d shards)", self.name, version, store.config.quant, store.config.shards)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

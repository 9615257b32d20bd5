"""A model version directory opened: its checked manifest, and from it the feature spec, the store
and the dense head."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from offgraph.features.spec import FeatureSpec, parse_spec
from offgraph.modeldir.manifest import DENSE_DIR, MANIFEST, load_manifest, open_version_store
from offgraph.modeldir.manifest_model import Manifest


class ModelVersion:
    """One version directory (MODELS/NAME/VERSION). ``open`` reads and checks the manifest at once; the
    spec is parsed, and the store and dense head (RocksDB, TensorFlow) are opened, when first used.
    ``close`` closes the store if it was opened."""

    def __init__(self, path: str | Path, manifest: Manifest) -> None:
        self.path = Path(path)
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, *, verify_dense: bool = True, verify_store: bool | None = None) -> ModelVersion:
        """The version at ``path``; ModelDirError if its manifest is missing or wrong (``load_manifest``)."""
        return cls(path, load_manifest(path, verify_dense=verify_dense, verify_store=verify_store))

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def version(self) -> int | None:
        """The directory's integer name (None for a directory not named as a version)."""
        return int(self.path.name) if self.path.name.isdigit() else None

    @cached_property
    def spec(self) -> FeatureSpec:
        """The feature spec the version was trained with (SpecError names the manifest if it is wrong)."""
        # a vocabulary field's file is the version's own copy (relative to the version directory)
        return parse_spec(self.manifest.spec, source=str(self.manifest_path), base=self.path)

    def open_store(
        self,
        mode: str = "r",
        *,
        block_cache_mb: int | None = None,
        statistics: bool = False,
        direct_reads: bool | None = None,
    ):
        """A new handle on the version's store, with the settings its manifest records (``open_version_store``);
        the caller closes it."""
        return open_version_store(
            self.path,
            self.manifest,
            mode,
            block_cache_mb=block_cache_mb,
            statistics=statistics,
            direct_reads=direct_reads,
        )

    @cached_property
    def store(self):
        """The store opened read-only, once; closed by ``close``."""
        return self.open_store("r")

    @cached_property
    def dense(self) -> tuple[Any, Any]:
        """(loaded SavedModel, its serving signature): keep the first alive while the second is used."""
        from offgraph.modeldir.dense import load_dense

        return load_dense(self.path / DENSE_DIR)

    def close(self) -> None:
        store = self.__dict__.pop("store", None)
        if store is not None:
            store.close()

    def __enter__(self) -> ModelVersion:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ModelVersion({str(self.path)!r})"

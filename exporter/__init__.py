"""Export a trained DeepFM into a servable model directory (the library scorer that serves it is
``server.scorer``).

    models/<name>/<version>/manifest.json   (written last, by atomic rename)
                           /dense/          (SavedModel of the dense head only)
                           /store/          (sharded, quantized RocksDB tables)

Names are imported lazily: ``exporter.manifest`` (used by the streaming updater)
must not pay for importing TensorFlow.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "ModelDirError": "exporter.manifest",
    "complete_versions": "exporter.manifest",
    "load_manifest": "exporter.manifest",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'exporter' has no attribute {name!r}")

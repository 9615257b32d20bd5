"""Export a trained DeepFM into a servable model directory, and the library scorer.

    models/<name>/<version>/manifest.json   (written last, by atomic rename)
                           /dense/          (SavedModel of the dense head only)
                           /store/          (sharded, quantized RocksDB tables)
"""
from exporter.manifest import ModelDirError, complete_versions, load_manifest
from exporter.scorer import Scorer, load

__all__ = ["ModelDirError", "Scorer", "complete_versions", "load", "load_manifest"]

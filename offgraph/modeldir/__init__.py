"""The model version directory: ``manifest.json`` (the typed ``Manifest``, its checks), complete versions,
``ModelVersion`` (a version's manifest, spec, store and dense head), the dense head's signature and
loading, and the status files written beside a model."""

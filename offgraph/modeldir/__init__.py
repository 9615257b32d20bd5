"""The model version directory: ``manifest.json``, its checks, complete versions, the dense head's
signature and loading, and the status files written beside a model."""

"""Names a model version's files and manifest use that light modules need too (the command line, the
training settings): this module imports nothing."""

SIGNATURE = "serving_default"
"""The dense head SavedModel's serving signature: all fields of each candidate."""
SPLIT_SIGNATURE = "split"
"""Its signature that takes the request's fields once (recorded as the manifest's ``dense.split``)."""

LOSSES = ("pointwise", "listwise", "both", "pairwise", "lambdarank", "pointwise+pairwise", "pointwise+lambdarank")
"""The training losses a version may record (``training_loss``); its calibration and ranking follow from it
(``offgraph.model.losses``: "both" is pointwise + listwise, a name with "+" the sum of its parts)."""

HOT_SET_FILE = "hot_set.npz"
"""A version's static hot set (``offgraph.modeldir.hot_set``), beside its manifest."""
DEFAULT_HOT_SET_ROWS = 1_000_000
"""Rows of a hot set by default: more than a worker's default row cache holds (20 MB on disk)."""

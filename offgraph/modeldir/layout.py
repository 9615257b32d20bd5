"""Names a model version's files and manifest use that light modules need too (the command line, the
training settings): this module imports nothing."""

SIGNATURE = "serving_default"
"""The dense head SavedModel's one serving signature."""

LOSSES = ("pointwise", "listwise", "both")
"""The training losses a version may record (``training_loss``); its calibration and ranking follow from it."""

"""What a label means to the losses and the metrics: one rule for each, shared by both.

A label is a non-negative relevance grade: 0/1 for a click, an integer grade 0..G, or a non-negative
real gain such as a play share. The functions are plain arithmetic, so each works unchanged on NumPy
arrays (``offgraph.model.metrics``) and TensorFlow tensors (``offgraph.model.losses``); this module
imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["binarise", "gain"]


def binarise(labels: Any) -> Any:
    """Relevant or not (a bool array): label > 0. What pointwise cross-entropy trains on and what AUC,
    logloss, MAP and MRR count as a positive; a binary label is its own binarisation."""
    return labels > 0


def gain(labels: Any) -> Any:
    """The gain of a grade: 2^g - 1 (NDCG's graded gain, and the listwise loss's target weight). One rule
    for every label: an integer grade 0, 1, 2, 3 gains 0, 1, 3, 7; a binary label gains its own value (0 or 1),
    so binary lists train and score as before grades existed; a real gain g >= 0 is read as a grade
    too (0.5 gains 2^0.5 - 1 = 0.414), monotone and 0 exactly at 0."""
    return 2.0**labels - 1.0

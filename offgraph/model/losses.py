"""Training losses by name: ``make_loss_fn(LossKey.BOTH)(labels, logits, segments)``.

The names are the manifest's (``offgraph.modeldir.layout.LOSSES``): a run records the loss it was
trained with, and a listwise model's scores are ranking scores until calibrated. ``segments`` numbers
each row's request group 0..G-1 within the batch (zeros for a pointwise loss).

The losses themselves: pointwise sigmoid cross-entropy, and listwise softmax cross-entropy per request.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import tensorflow as tf

__all__ = ["LossKey", "LossFn", "make_loss_fn", "is_listwise", "pointwise_loss", "listwise_loss"]

# labels [N] float32, logits [N], segments [N] int32 -> a scalar loss
LossFn = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]


class LossKey(enum.StrEnum):
    POINTWISE = "pointwise"  # sigmoid cross-entropy per row: the score is a CTR
    LISTWISE = "listwise"  # softmax cross-entropy over each request's candidates
    BOTH = "both"  # their sum


def pointwise_loss(labels, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def listwise_loss(labels, logits, segments, num_segments):
    """Softmax cross-entropy over each request's candidates (segments 0..G-1 in the batch),
    labels normalised per request; requests without a positive are left out."""
    seg_max = tf.math.unsorted_segment_max(logits, segments, num_segments)
    shifted = logits - tf.gather(tf.stop_gradient(seg_max), segments)
    lse = tf.math.log(tf.math.unsorted_segment_sum(tf.exp(shifted), segments, num_segments))
    log_softmax = shifted - tf.gather(lse, segments)
    pos = tf.math.unsorted_segment_sum(labels, segments, num_segments)
    per_group = -tf.math.unsorted_segment_sum(labels * log_softmax, segments, num_segments) / tf.maximum(pos, 1.0)
    has = tf.cast(pos > 0, tf.float32)
    return tf.reduce_sum(per_group * has) / tf.maximum(tf.reduce_sum(has), 1.0)


def loss_key(key: str) -> LossKey:
    try:
        return LossKey(key)
    except ValueError:
        raise ValueError(f"unknown loss {key!r}: expected one of {[k.value for k in LossKey]}") from None


def is_listwise(key: str) -> bool:
    """Whether the loss compares a request's candidates, so batches must hold whole request groups."""
    return loss_key(key) != LossKey.POINTWISE


def _listwise(labels, logits, segments):
    return listwise_loss(labels, logits, segments, tf.reduce_max(segments) + 1)


def _pointwise(labels, logits, segments):
    return pointwise_loss(labels, logits)


def _both(labels, logits, segments):
    return _pointwise(labels, logits, segments) + _listwise(labels, logits, segments)


_LOSS_FNS: dict[LossKey, LossFn] = {LossKey.POINTWISE: _pointwise, LossKey.LISTWISE: _listwise, LossKey.BOTH: _both}


def make_loss_fn(key: str) -> LossFn:
    """The loss called ``key`` (a ``LossKey`` or its string)."""
    return _LOSS_FNS[loss_key(key)]

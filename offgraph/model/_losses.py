"""Training losses: pointwise sigmoid cross-entropy and listwise softmax cross-entropy per request."""

from __future__ import annotations

import tensorflow as tf


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

"""Training losses by name: ``make_loss_fn(LossKey.LAMBDARANK)(labels, logits, segments)``.

The names are the manifest's (``offgraph.modeldir.layout.LOSSES``): a run records the loss it was
trained with, and a model trained with anything but the pointwise loss gives ranking scores until
calibrated. ``segments`` numbers each row's request group (its list) 0..G-1 within the batch (zeros for
the pointwise loss); a loss that compares candidates needs whole lists in a batch (``is_listwise``).

Labels are relevance grades >= 0 (``offgraph.model.relevance``): binary clicks, integer grades or real
gains. The losses, each a scalar over the batch:

- pointwise: sigmoid cross-entropy per row against the binarised label (label > 0); the score is a CTR;
- listwise: softmax cross-entropy over each list, the target being the list's gains 2^g - 1 normalised
  to sum to 1 (a binary list: its positives share the mass equally, as before grades); lists with no
  gain are left out, the others averaged;
- pairwise (RankNet): log(1 + exp(-(s_i - s_j))) over every pair (i, j) of one list with label_i > label_j,
  averaged over the batch's pairs (pairs of equal labels are no pairs);
- lambdarank: the same pairs, each weighted by |delta NDCG|, the change in the list's NDCG (gains
  2^g - 1, no cut-off) if i and j swapped places in the order of the current scores, then summed and
  divided by the number of pairs like the pairwise loss;
- mixtures: the sum of their parts ("both" is pointwise + listwise).

The pairwise losses build [n, n] matrices over the batch's rows masked to pairs of one list: at most
``PAIR_ROWS_MAX`` rows a batch (the trainer checks its batches before the first step).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import tensorflow as tf

from offgraph.model.relevance import binarise, gain

__all__ = [
    "LossKey",
    "LossFn",
    "PAIR_ROWS_MAX",
    "make_loss_fn",
    "is_listwise",
    "has_pointwise",
    "uses_pairs",
    "pointwise_loss",
    "listwise_loss",
    "pairwise_loss",
    "lambdarank_loss",
]

# labels [N] float32, logits [N], segments [N] int32 -> a scalar loss
LossFn = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]

# rows of a batch a pairwise loss takes: its [n, n] float32 matrices are 64 MiB each at 4,096 rows
PAIR_ROWS_MAX = 4096


class LossKey(enum.StrEnum):
    POINTWISE = "pointwise"  # sigmoid cross-entropy per row: the score is a CTR
    LISTWISE = "listwise"  # softmax cross-entropy over each request's candidates, graded targets
    BOTH = "both"  # pointwise + listwise
    PAIRWISE = "pairwise"  # RankNet: logistic loss of each pair of one list with different labels
    LAMBDARANK = "lambdarank"  # those pairs weighted by |delta NDCG| of swapping them
    POINTWISE_PAIRWISE = "pointwise+pairwise"
    POINTWISE_LAMBDARANK = "pointwise+lambdarank"


# each mixture's parts, summed
_MIXTURES: dict[LossKey, tuple[LossKey, ...]] = {
    LossKey.BOTH: (LossKey.POINTWISE, LossKey.LISTWISE),
    LossKey.POINTWISE_PAIRWISE: (LossKey.POINTWISE, LossKey.PAIRWISE),
    LossKey.POINTWISE_LAMBDARANK: (LossKey.POINTWISE, LossKey.LAMBDARANK),
}


def _parts(key: LossKey) -> tuple[LossKey, ...]:
    return _MIXTURES.get(key, (key,))


def _num_segments(segments, num_segments):
    return tf.reduce_max(segments) + 1 if num_segments is None else num_segments


def pointwise_loss(labels, logits):
    """Mean sigmoid cross-entropy against the binarised labels (``relevance.binarise``)."""
    y = tf.cast(binarise(labels), logits.dtype)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))


def listwise_loss(labels, logits, segments, num_segments=None):
    """Softmax cross-entropy over each request's candidates (segments 0..G-1 in the batch), the target
    being the gains (``relevance.gain``) normalised per request; requests without a gain are left out."""
    num_segments = _num_segments(segments, num_segments)
    seg_max = tf.math.unsorted_segment_max(logits, segments, num_segments)
    shifted = logits - tf.gather(tf.stop_gradient(seg_max), segments)
    lse = tf.math.log(tf.math.unsorted_segment_sum(tf.exp(shifted), segments, num_segments))
    log_softmax = shifted - tf.gather(lse, segments)
    g = gain(labels)
    total = tf.math.unsorted_segment_sum(g, segments, num_segments)
    per_group = tf.math.divide_no_nan(-tf.math.unsorted_segment_sum(g * log_softmax, segments, num_segments), total)
    has = tf.cast(total > 0, logits.dtype)
    return tf.reduce_sum(per_group * has) / tf.maximum(tf.reduce_sum(has), 1.0)


def _checked_rows(logits):
    n = tf.shape(logits)[0]
    tf.debugging.assert_less_equal(
        n, PAIR_ROWS_MAX, message=f"a pairwise loss takes at most {PAIR_ROWS_MAX} rows a batch"
    )
    return n


def _pairs(labels, segments):
    """[n, n] float: 1 where row i is more relevant than row j of the same list."""
    same = tf.equal(segments[:, None], segments[None, :])
    return tf.cast(same & (labels[:, None] > labels[None, :]), tf.float32)


def _weighted_pair_loss(pairs, weights, logits):
    # log(1 + exp(-(s_i - s_j))), summed with the weights, over the number of pairs
    per_pair = tf.nn.softplus(logits[None, :] - logits[:, None])
    return tf.reduce_sum(pairs * weights * per_pair) / tf.maximum(tf.reduce_sum(pairs), 1.0)


def pairwise_loss(labels, logits, segments):
    """RankNet: the mean over the batch's pairs (i, j) of one list with label_i > label_j of
    log(1 + exp(-(s_i - s_j))); 0 for a batch without a pair."""
    _checked_rows(logits)
    return _weighted_pair_loss(_pairs(labels, segments), 1.0, logits)


def _ranks_within(key, segments, n):
    """1-based place of each row in its list sorted by ``key`` descending; equal keys keep batch order."""
    same = tf.equal(segments[:, None], segments[None, :])
    idx = tf.range(n)
    earlier = idx[None, :] < idx[:, None]  # [i, j]: j comes before i in the batch
    ahead = same & ((key[None, :] > key[:, None]) | ((key[None, :] == key[:, None]) & earlier))
    return 1.0 + tf.reduce_sum(tf.cast(ahead, tf.float32), axis=1)


def ndcg_swap_weights(labels, logits, segments, num_segments=None):
    """[n, n] |delta NDCG| of swapping rows i and j of one list in the order of ``logits``: |G_i - G_j| *
    |1/log2(1 + r_i) - 1/log2(1 + r_j)| / IDCG of the list (gains G = 2^g - 1, ranks r, no cut-off).
    Constants to the gradient; 0 across lists and for a list without a gain."""
    num_segments = _num_segments(segments, num_segments)
    n = tf.shape(logits)[0]
    g = gain(labels)
    ln2 = math.log(2.0)
    disc = ln2 / tf.math.log(1.0 + _ranks_within(logits, segments, n))
    ideal = ln2 / tf.math.log(1.0 + _ranks_within(g, segments, n))
    idcg = tf.gather(tf.math.unsorted_segment_sum(g * ideal, segments, num_segments), segments)
    same = tf.cast(tf.equal(segments[:, None], segments[None, :]), tf.float32)
    delta = tf.abs(g[:, None] - g[None, :]) * tf.abs(disc[:, None] - disc[None, :])
    return tf.stop_gradient(same * tf.math.divide_no_nan(delta, idcg[:, None]))


def lambdarank_loss(labels, logits, segments, num_segments=None):
    """The pairwise loss with each pair weighted by ``ndcg_swap_weights``, over the number of pairs."""
    _checked_rows(logits)
    weights = ndcg_swap_weights(labels, logits, segments, num_segments)
    return _weighted_pair_loss(_pairs(labels, segments), weights, logits)


_BASE: dict[LossKey, LossFn] = {
    LossKey.POINTWISE: lambda labels, logits, segments: pointwise_loss(labels, logits),
    LossKey.LISTWISE: listwise_loss,
    LossKey.PAIRWISE: pairwise_loss,
    LossKey.LAMBDARANK: lambdarank_loss,
}


def _mixture(parts: tuple[LossKey, ...]) -> LossFn:
    fns = [_BASE[p] for p in parts]
    return lambda labels, logits, segments: tf.add_n([f(labels, logits, segments) for f in fns])


_LOSS_FNS: dict[LossKey, LossFn] = {k: _BASE.get(k) or _mixture(_parts(k)) for k in LossKey}


def loss_key(key: str) -> LossKey:
    try:
        return LossKey(key)
    except ValueError:
        raise ValueError(f"unknown loss {key!r}: expected one of {[k.value for k in LossKey]}") from None


def is_listwise(key: str) -> bool:
    """Whether the loss compares a request's candidates (any part but pointwise), so batches must hold whole
    request groups, the rows need a group, and its scores are ranking scores."""
    return any(p != LossKey.POINTWISE for p in _parts(loss_key(key)))


def has_pointwise(key: str) -> bool:
    """Whether the loss has a pointwise part: the only part with a gradient for a shift of every score (the bias)."""
    return LossKey.POINTWISE in _parts(loss_key(key))


def uses_pairs(key: str) -> bool:
    """Whether the loss builds [n, n] pair matrices over a batch (at most ``PAIR_ROWS_MAX`` rows)."""
    return any(p in (LossKey.PAIRWISE, LossKey.LAMBDARANK) for p in _parts(loss_key(key)))


def make_loss_fn(key: str) -> LossFn:
    """The loss called ``key`` (a ``LossKey`` or its string)."""
    return _LOSS_FNS[loss_key(key)]

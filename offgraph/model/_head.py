"""DeepFM head maths (Keras ops, backend-neutral).

For one candidate with pooled embeddings v_f in R^D and first-order weights w_f:
  first = sum_f w_f
  fm    = 0.5 * sum_d [ (sum_f v_fd)^2 - sum_f v_fd^2 ]   (= sum of pairwise dot products)
  logit = b + first + fm + MLP(concat_f v_f)
"""

from __future__ import annotations

from keras import ops


def fm_term(emb):
    """emb [N, F, D] -> [N]: sum over field pairs of <v_i, v_j>, in O(F*D)."""
    s = ops.sum(emb, axis=1)
    sq = ops.sum(emb * emb, axis=1)
    return 0.5 * ops.sum(s * s - sq, axis=1)


def first_order_term(first_order):
    """first_order [N, F] -> [N]."""
    return ops.sum(first_order, axis=1)


def masked_pool(vectors, mask, mode: str):
    """vectors [N, L, K], mask [N, L] (1 = value present) -> [N, K]; no value -> zeros."""
    m = ops.expand_dims(mask, -1)
    total = ops.sum(vectors * m, axis=1)
    if mode == "sum":
        return total
    count = ops.sum(mask, axis=1, keepdims=True)
    return total / ops.maximum(count, 1.0)

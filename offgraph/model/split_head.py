"""The DeepFM head with the request's part computed once per request (the dense SavedModel's ``split`` signature).

All candidates of a request share its request-scope fields, so their share of the head is the same
for every candidate and is computed on one row:

  first = sum_r w_r + sum_c w_c
  fm    = 0.5 * sum_d [ (s_r + s_c)^2 - (q_r + q_c) ]   s: sum of v_f, q: sum of v_f^2 over the fields
  MLP   : x W1 = x_r W1_r + x_c W1_c (+ dense W1_k)      W1's rows split by the field each row reads

with r the request fields (once, [1, ...], broadcast over the N candidates) and c the candidate
fields. The flattened MLP input is in spec field order (field f's D values at rows f*D..f*D+D-1, the
numeric columns after them), so W1's rows are gathered per field. It is the same function as
``DeepFMHead.call`` on the concatenated fields, summed in another order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from keras import ops

REQUEST_SCOPE = "request"


def split_fields(scopes: Sequence[str]) -> tuple[list[int], list[int]]:
    """(request field indices, candidate field indices), each in spec order, of fields of these scopes.
    A cross reading an item input has scope 'cross' or 'item': it is the candidate's."""
    req = [i for i, s in enumerate(scopes) if s == REQUEST_SCOPE]
    return req, [i for i, s in enumerate(scopes) if s != REQUEST_SCOPE]


def _first_layer(head):
    return head.hidden[0] if head.hidden else head.out_unit


def split_kernel(head, request_fields: Sequence[int], candidate_fields: Sequence[int]):
    """The first MLP layer's kernel [F*D + k, H] as (request rows [F_r*D, H], candidate rows [F_c*D, H],
    numeric rows [k, H]), float32."""
    kernel = ops.convert_to_numpy(_first_layer(head).kernel).astype(np.float32)
    d, f = head.dim, head.num_fields

    def rows(fields: Sequence[int]) -> np.ndarray:
        idx = (np.asarray(fields, dtype=np.int64)[:, None] * d + np.arange(d)).reshape(-1)
        return kernel[idx]

    return rows(request_fields), rows(candidate_fields), kernel[f * d :]


def split_logit(head, kernels, req_emb, req_first_order, cand_emb, cand_first_order, dense=None):
    """The logit [N] of ``head`` from the request part (``req_emb`` [1, F_r, D], ``req_first_order``
    [1, F_r]) and the candidates' (``cand_emb`` [N, F_c, D], ``cand_first_order`` [N, F_c], ``dense``
    [N, k] with numeric fields); ``kernels``: :func:`split_kernel`'s three, as tensors."""
    w_req, w_cand, w_dense = kernels
    n = ops.shape(cand_emb)[0]
    req_flat = ops.reshape(req_emb, (1, w_req.shape[0]))
    cand_flat = ops.reshape(cand_emb, (n, w_cand.shape[0]))
    first_layer = _first_layer(head)
    z = ops.matmul(req_flat, w_req) + ops.matmul(cand_flat, w_cand)  # [1, H] + [N, H]
    first = ops.sum(req_first_order, axis=1) + ops.sum(cand_first_order, axis=1)
    if head.num_dense:
        z = z + ops.matmul(dense, w_dense)
        first = first + ops.sum(dense * head.dense_w, axis=1)
    deep = first_layer.activation(z + first_layer.bias)
    if head.hidden:
        for layer in head.hidden[1:]:
            deep = layer(deep)
        deep = head.out_unit(deep)
    deep = ops.squeeze(deep, -1)
    s = ops.sum(req_emb, axis=1) + ops.sum(cand_emb, axis=1)  # [N, D]
    q = ops.sum(req_emb * req_emb, axis=1) + ops.sum(cand_emb * cand_emb, axis=1)
    fm = 0.5 * ops.sum(s * s - q, axis=1)
    return head.bias + first + fm + deep

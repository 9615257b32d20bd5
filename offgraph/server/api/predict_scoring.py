"""Rows of raw features (one per candidate) and the request features they share, scored by the ``:score`` path.

Every protocol whose body is not offgraph's own ``{"request", "candidates"}`` ends here: TensorFlow Serving's row
format (``{"instances": [...], "context": {...}}``, REST and gRPC) as it comes, and the named tensors of TF Serving's
columnar format and of KServe v2 over REST and gRPC once ``offgraph.server.api.tensor_inputs`` has made rows of
them. The request-scope inputs are taken out of the rows by ``tfserving_body.split_instances`` (one rule: the same
value in every row, or given once), and the request and candidates are scored by ``ModelHolder.score``
(``Scorer.score_joined``): no second copy of the request maths, FG or validation.

``score_rows`` and ``score_tensors`` run in a scoring thread (REST: ``scored``; gRPC: its context's ``score``, which
checks the deadline first). Their errors are the score path's: ``ApiError`` 422 (a bad value, a scope conflict, a
bad tensor), ``NotServing`` (no such version or label: REST's 404), and the ``ModelLoading`` / ``StoreFailure`` /
``StoreOutage`` the app answers 503.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from offgraph.features import FeatureValueError
from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.server.api.model_inputs import describe_inputs
from offgraph.server.api.state import ServerState
from offgraph.server.api.tensor_inputs import Tensor, rows_from_tensors
from offgraph.server.api.tfserving_body import split_instances
from offgraph.server.http.errors import ApiError
from offgraph.server.models.served import ModelHolder, NotServing


def score_rows(
    holder: ModelHolder,
    rows: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    version: int | None,
    label: str | None,
    rows_name: str = "instances",
) -> tuple[int, np.ndarray]:
    """(the version that scored, the scores in row order) of ``rows`` sharing ``context``, split with the scopes of
    the version asked for. ``rows_name`` names a row in the messages (``instances[3]``, ``candidates[3]``).

    A swap between the split and the score to a version whose spec moves an input to the other scope
    is refused by the score path's own scope check (a 422), never scored silently wrong."""
    sv = holder.peek(version, label)
    if sv is None:  # the score call answers why (loading, unloaded, not served)
        request, candidates = dict(context), list(rows)
    else:
        spec = sv.scorer.spec
        req_in, item_in = set(spec.raw_inputs("request")), set(spec.raw_inputs("item"))
        request, candidates = split_instances(rows, context, req_in - item_in, item_in - req_in, rows_name)
    try:
        # the candidates are the body's values, keyed by their JSON for the candidate cache (RawCandidates.keyed): a
        # candidate that comes back is neither joined nor generated again, as on :score
        served, scores, _, _ = holder.score(request, cast(list, RawCandidates.keyed(candidates)), version, label)
    except FeatureValueError as e:  # the score path's words, with the rows' own name for the candidates
        raise ApiError(422, f"bad feature value: {str(e).replace('candidates[', rows_name + '[')}") from None
    return served, scores


def score_tensors(
    holder: ModelHolder, tensors: Sequence[Tensor], version: int | None, label: str | None, max_candidates: int
) -> tuple[int, np.ndarray]:
    """``score_rows`` of KServe v2 input tensors, read as the inputs of the version asked for (element i of each
    input is candidate i: ``candidates[i]`` in the messages)."""
    sv = holder.acquire(version, label)  # NotServing, ModelLoading: why none serves
    holder.release(sv)  # its spec stays readable once it is closed (the score takes its own reference)
    rows, once = rows_from_tensors(tensors, describe_inputs(sv.scorer.spec), max_candidates)
    return score_rows(holder, rows, once, version, label, rows_name="candidates")


async def scored(
    state: ServerState, holder: ModelHolder, started: float, fn: Callable[..., tuple[int, np.ndarray]], *args: Any
) -> tuple[int, np.ndarray]:
    """``fn(holder, *args)`` (``score_rows``, ``score_tensors``) in the scoring pool, for a REST route: a version
    that does not serve is a 404, the latency (from ``started``, the request's ``time.perf_counter()`` at arrival)
    and candidates go to the request metrics."""
    try:
        served, scores = await state.run_scoring(fn, holder, *args)
    except NotServing as e:
        raise ApiError(404, str(e)) from None
    state.metrics.observe_score(holder.name, len(scores), time.perf_counter() - started)
    return served, scores

"""Rows of raw features (one per candidate) and the request features they share, scored by the ``:score`` path.

Every protocol whose body is not offgraph's own ``{"request", "candidates"}`` ends here: TensorFlow Serving's row
format (``{"instances": [...], "context": {...}}``, REST) as rows (``score_rows``), and the named tensors of TF
Serving's columnar format, TF Serving's gRPC ``Predict`` and KServe v2 over REST and gRPC as the columns
``offgraph.server.api.tensor_inputs`` makes of them (``score_columns``, ``score_tensors``). The request-scope inputs
are taken out of the rows or columns by ``tfserving_body.split_instances`` / ``split_columns`` (one rule: the same
value in every row, or given once), and the request and candidates are scored by ``ModelHolder.score``
(``Scorer.score_joined``): no second copy of the request maths, FG or validation. Columns reach it as
``RawCandidates.columns``: keyed in the candidate cache by their elements, a candidate's dict made only where the cache
lacks it (as a JSON body's candidates are keyed by their bytes and decoded only where the cache lacks them).

``score_rows``, ``score_columns`` and ``score_tensors`` run in a scoring thread (REST: ``scored``; gRPC: its context's ``score``, which
checks the deadline first). Each returns ``(version, scores, joined)``: ``joined`` the feature join's result
(``Joined``: the request after the join, the candidates the scorer saw), which ``scored`` offers to the served log
(``ServerState.log_served``) once the scores are in. Their errors are the score path's: ``ApiError`` 422 (a bad value, a scope conflict, a
bad tensor), ``NotServing`` (no such version or label: REST's 404), and the ``ModelLoading`` / ``StoreFailure`` /
``StoreOutage`` the app answers 503.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from offgraph.feature_tables.join import Joined
from offgraph.features import FeatureValueError
from offgraph.features.spec import FeatureSpec
from offgraph.scoring.raw_candidates import RawCandidates, column_keys
from offgraph.server.api.model_inputs import InputInfo, describe_inputs
from offgraph.server.api.state import ServerState
from offgraph.server.api.tensor_inputs import Column, Tensor, checked_columns, json_columns, tensor_columns
from offgraph.server.api.tfserving_body import split_columns, split_instances
from offgraph.server.api.wire_keys import wire_candidates
from offgraph.server.http.errors import ApiError
from offgraph.server.models.experiment import NO_ARM
from offgraph.server.models.served import ModelHolder, NotServing


def score_rows(
    holder: ModelHolder,
    rows: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    version: int | None,
    label: str | None,
    rows_name: str = "instances",
) -> tuple[int, np.ndarray, Joined]:
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
        served, scores, joined, _ = holder.score(request, cast(list, RawCandidates.keyed(candidates)), version, label)
    except FeatureValueError as e:  # the score path's words, with the rows' own name for the candidates
        raise ApiError(422, f"bad feature value: {str(e).replace('candidates[', rows_name + '[')}") from None
    return served, scores, joined


def _candidates(columns: Mapping[str, Column], n: int) -> RawCandidates:
    """The candidates of ``columns`` (``n`` of them; no columns: one candidate with no features of its own), keyed
    by their elements under the columns' names and forms, their dicts made where asked for."""
    cols = list(columns.values())
    if not cols:
        return RawCandidates.decoded([{}])
    names = list(columns)

    def rows(which: Sequence[int]) -> list[dict[str, Any]]:
        return [{name: c.value(i) for name, c in zip(names, cols)} for i in which]

    keys = column_keys([[c.name, c.padded] for c in cols], [c.elements for c in cols])
    return RawCandidates.columns(n, keys, rows)


def _spec_of(holder: ModelHolder, version: int | None, label: str | None) -> tuple[FeatureSpec, list[InputInfo]]:
    """(spec, raw inputs) of the version asked for; ``NotServing`` / ``ModelLoading`` say why none serves."""
    sv = holder.acquire(version, label)
    holder.release(sv)  # its spec stays readable once it is closed (the score takes its own reference)
    spec = sv.scorer.spec
    return spec, describe_inputs(spec)


def score_columns(
    holder: ModelHolder,
    columns: Sequence[Column],
    version: int | None,
    label: str | None,
    max_candidates: int,
    spec_inputs: tuple[FeatureSpec, list[InputInfo]] | None = None,
) -> tuple[int, np.ndarray, Joined]:
    """(the version that scored, the scores in candidate order) of named columns (``tensor_inputs.Column``, element
    i of each is candidate i: ``candidates[i]`` in the messages), read as the inputs of the version asked for
    (``spec_inputs``: its spec and raw inputs, where the caller has them already)."""
    spec, inputs = spec_inputs or _spec_of(holder, version, label)
    per_row, once = checked_columns(columns, inputs, max_candidates)
    n = len(next(iter(per_row.values()))) if per_row else 1
    req_in, item_in = set(spec.raw_inputs("request")), set(spec.raw_inputs("item"))
    request, per_row = split_columns(per_row, once, req_in - item_in, item_in - req_in)
    return _score(holder, request, _candidates(per_row, n), version, label)


def _score(
    holder: ModelHolder, request: dict[str, Any], candidates: RawCandidates, version: int | None, label: str | None
) -> tuple[int, np.ndarray, Joined]:
    try:
        served, scores, joined, _ = holder.score(request, cast(list, candidates), version, label)
    except FeatureValueError as e:  # the score path's words
        raise ApiError(422, f"bad feature value: {e}") from None
    return served, scores, joined


def score_json_columns(
    holder: ModelHolder, columns: Mapping[str, Sequence[Any]], version: int | None, label: str | None, limit: int
) -> tuple[int, np.ndarray, Joined]:
    """``score_columns`` of TF Serving's columnar format (``{"inputs": {name: [value per candidate]}}``)."""
    return score_columns(holder, json_columns(columns), version, label, limit)


def score_tensors(
    holder: ModelHolder, tensors: Sequence[Tensor], version: int | None, label: str | None, max_candidates: int
) -> tuple[int, np.ndarray, Joined]:
    """``score_columns`` of KServe v2 / TF Serving input tensors, read as the inputs of the version asked for:
    straight from the wire where ``wire_keys.wire_candidates`` can (each candidate keyed by its elements' bytes, read
    only where the cache lacks it), else as ``Column`` s."""
    spec, inputs = _spec_of(holder, version, label)
    req_in, item_in = set(spec.raw_inputs("request")), set(spec.raw_inputs("item"))
    wire = wire_candidates(tensors, inputs, req_in - item_in, max_candidates)
    if wire is None:
        columns = tensor_columns(tensors, inputs, max_candidates)
        return score_columns(holder, columns, version, label, max_candidates, (spec, inputs))
    request, candidates = wire
    return _score(holder, request, candidates, version, label)


async def scored(
    state: ServerState,
    holder: ModelHolder,
    started: float,
    fn: Callable[..., tuple[int, np.ndarray, Joined]],
    *args: Any,
) -> tuple[int, np.ndarray]:
    """``fn(holder, *args)`` (``score_rows``, ``score_tensors``) in the scoring pool, for a REST route or gRPC's
    ``Predict``: a version that does not serve is a 404, the latency (from ``started``, the request's
    ``time.perf_counter()`` at arrival) and candidates go to the request metrics, the request to the served log."""
    try:
        served, scores, joined = await state.run_scoring(fn, holder, *args)
    except NotServing as e:
        raise ApiError(404, str(e)) from None
    state.metrics.observe_score(holder.name, len(scores), time.perf_counter() - started)
    log_scored(state, holder, served, scores, joined)
    return served, scores


def log_scored(state: ServerState, holder: ModelHolder, served: int, scores: np.ndarray, joined: Joined) -> None:
    """A request scored outside an experiment (every protocol but ``:score``), offered to the served log."""
    state.log_served(holder.name, served, NO_ARM, joined.request, joined.candidates, scores)

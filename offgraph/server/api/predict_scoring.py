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
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, cast

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
from offgraph.server.models.experiment import NO_ARM, Arm, Experiment, prior_scores
from offgraph.server.models.served import ModelHolder, NotServing


class Scored(NamedTuple):
    """A scored request: the version that scored (None: the prior arm), the scores in candidate order, and the
    request and candidates as the scorer saw them (``Joined``; the prior arm's: as sent), for the served log."""

    version: int | None
    scores: np.ndarray
    joined: Joined


@dataclass
class ArmChoice:
    """A request's arm in its model's ``experiment``, recorded where the scoring thread assigns it (``_score``), so
    that the caller can name it in the answer, the metrics and the served log, and count an error against it."""

    experiment: Experiment
    arm: Arm | None = None
    assigned: bool = True

    def assign(self, request: Mapping[str, Any]) -> Arm:
        self.arm, self.assigned = self.experiment.assign(dict(request))
        return self.arm


Redo = Callable[[int | None, str | None], Scored]
"""The same request scored again, split with the scopes of the version (or label) given, outside the experiment."""


def _scopes(spec: FeatureSpec) -> tuple[set[str], set[str]]:
    """(request-only inputs, item-only inputs) of a spec: how its raw inputs split between the scopes."""
    req_in, item_in = set(spec.raw_inputs("request")), set(spec.raw_inputs("item"))
    return req_in - item_in, item_in - req_in


def score_rows(
    holder: ModelHolder,
    rows: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    version: int | None,
    label: str | None,
    rows_name: str = "instances",
    experiment: ArmChoice | None = None,
) -> Scored:
    """``rows`` sharing ``context``, split with the scopes of the version asked for, scored (on ``experiment``'s arm
    for the request where it applies: ``_score``). ``rows_name`` names a row in the messages (``instances[3]``,
    ``candidates[3]``).

    A swap between the split and the score to a version whose spec moves an input to the other scope
    is refused by the score path's own scope check (a 422), never scored silently wrong."""
    sv = holder.peek(version, label)
    scopes = None
    if sv is None:  # the score call answers why (loading, unloaded, not served)
        request, candidates = dict(context), list(rows)
    else:
        scopes = _scopes(sv.scorer.spec)
        request, candidates = split_instances(rows, context, *scopes, rows_name)

    def redo(v: int | None, lb: str | None) -> Scored:
        return score_rows(holder, rows, context, v, lb, rows_name)

    # the candidates are the body's values, keyed by their JSON for the candidate cache (RawCandidates.keyed): a
    # candidate that comes back is neither joined nor generated again, as on :score
    keyed = cast(RawCandidates, RawCandidates.keyed(candidates))
    return _score(holder, request, keyed, version, label, scopes, experiment, redo, rows_name)


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
    experiment: ArmChoice | None = None,
) -> Scored:
    """Named columns (``tensor_inputs.Column``, element i of each is candidate i: ``candidates[i]`` in the messages),
    read as the inputs of the version asked for (``spec_inputs``: its spec and raw inputs, where the caller has them
    already), scored (on ``experiment``'s arm for the request where it applies: ``_score``)."""
    spec, inputs = spec_inputs or _spec_of(holder, version, label)
    per_row, once = checked_columns(columns, inputs, max_candidates)
    n = len(next(iter(per_row.values()))) if per_row else 1
    scopes = _scopes(spec)
    request, per_row = split_columns(per_row, once, *scopes)

    def redo(v: int | None, lb: str | None) -> Scored:
        return score_columns(holder, columns, v, lb, max_candidates)

    return _score(holder, request, _candidates(per_row, n), version, label, scopes, experiment, redo)


def _score(
    holder: ModelHolder,
    request: dict[str, Any],
    candidates: RawCandidates,
    version: int | None,
    label: str | None,
    scopes: tuple[set[str], set[str]] | None,
    experiment: ArmChoice | None,
    redo: Redo,
    rows_name: str = "candidates",
) -> Scored:
    """Score the split request on the version asked for; or, where ``experiment`` is given and the request names no
    version or label, on the arm its request features assign it to, as ``:score`` assigns a body's ``request``
    (recorded in ``experiment``): the prior arm's scores, or its version's or label's. An arm whose version splits
    the inputs between the scopes otherwise than ``scopes`` (the split this request was read with) has the request
    read again with its own (``redo``): a request is never scored under another version's split. ``rows_name``:
    what the body calls a candidate, in the messages."""
    if experiment is not None and version is None and label is None:
        arm = experiment.assign(request)
        if arm.kind == "prior":
            return Scored(None, prior_scores(len(candidates)), Joined(request, candidates))
        version, label = arm.selection
        if scopes is not None and _scopes(_spec_of(holder, version, label)[0]) != scopes:
            return redo(version, label)
    try:
        served, scores, joined, _ = holder.score(request, cast(list, candidates), version, label)
    except FeatureValueError as e:  # the score path's words, with the body's own name for the candidates
        raise ApiError(422, f"bad feature value: {str(e).replace('candidates[', rows_name + '[')}") from None
    return Scored(served, scores, joined)


def score_json_columns(
    holder: ModelHolder,
    columns: Mapping[str, Sequence[Any]],
    version: int | None,
    label: str | None,
    limit: int,
    experiment: ArmChoice | None = None,
) -> Scored:
    """``score_columns`` of TF Serving's columnar format (``{"inputs": {name: [value per candidate]}}``)."""
    return score_columns(holder, json_columns(columns), version, label, limit, experiment=experiment)


def score_tensors(
    holder: ModelHolder,
    tensors: Sequence[Tensor],
    version: int | None,
    label: str | None,
    max_candidates: int,
    experiment: ArmChoice | None = None,
) -> Scored:
    """``score_columns`` of KServe v2 / TF Serving input tensors, read as the inputs of the version asked for:
    straight from the wire where ``wire_keys.wire_candidates`` can (each candidate keyed by its elements' bytes, read
    only where the cache lacks it), else as ``Column`` s."""
    spec, inputs = _spec_of(holder, version, label)
    scopes = _scopes(spec)
    wire = wire_candidates(tensors, inputs, scopes[0], max_candidates)
    if wire is None:
        columns = tensor_columns(tensors, inputs, max_candidates)
        return score_columns(holder, columns, version, label, max_candidates, (spec, inputs), experiment)
    request, candidates = wire

    def redo(v: int | None, lb: str | None) -> Scored:
        return score_tensors(holder, tensors, v, lb, max_candidates)

    return _score(holder, request, candidates, version, label, scopes, experiment, redo)


async def scored(
    state: ServerState,
    holder: ModelHolder,
    started: float,
    version: int | None,
    label: str | None,
    fn: Callable[..., Scored],
    *args: Any,
) -> tuple[int | None, np.ndarray, Arm | None]:
    """``fn(holder, *args, experiment=...)`` (``score_rows``, ``score_columns``, ``score_tensors``; ``args`` hold the
    ``version`` and ``label`` the request asked for) in the scoring pool, for every protocol but ``:score``: on the
    model's experiment's arm for the request where one is set and the request names no version or label, as on
    ``:score``. A version that does not serve is a 404; the latency (from ``started``, the request's
    ``time.perf_counter()`` at arrival) and candidates go to the request metrics and the arm's, an error to the arm's
    errors, the request to the served log. Returns (the version that scored, None for the prior arm; the scores;
    the arm, None outside an experiment)."""
    experiments, metrics = state.experiments, state.metrics
    exp = experiments.get(holder.name) if experiments is not None and version is None and label is None else None
    choice = ArmChoice(exp) if exp is not None else None
    try:
        served, scores, joined = await state.run_scoring(partial(fn, experiment=choice), holder, *args)
    except Exception as e:
        arm = None if choice is None else choice.arm
        metrics.count_arm_error(holder.name, arm_version(holder, arm, version, label), arm_name(arm))
        if isinstance(e, NotServing):
            raise ApiError(404, str(e)) from None
        raise
    arm = None if choice is None else choice.arm
    if choice is not None and not choice.assigned:
        metrics.unassigned.labels(holder.name).inc()
    seconds = time.perf_counter() - started
    metrics.observe_score(holder.name, len(scores), seconds)
    metrics.observe_arm(holder.name, served, arm_name(arm), seconds, scores)
    state.log_served(holder.name, served, arm_name(arm), joined.request, joined.as_seen, scores)
    return served, scores, arm


def arm_name(arm: Arm | None) -> str:
    """The arm as metrics, responses and the served log name it (``none`` outside an experiment)."""
    return NO_ARM if arm is None else arm.name


def arm_version(holder: ModelHolder, arm: Arm | None, version: int | None, label: str | None) -> int | None:
    """The version a failed request was meant for, as far as it is known (None: unknown, or the prior arm)."""
    if arm is not None:
        if arm.kind == "prior":
            return None
        version, label = arm.selection
    sv = holder.peek(version, label)
    return None if sv is None else sv.version

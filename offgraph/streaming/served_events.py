"""Labelled events from what was served: the served log (``offgraph.server.process.served_log``) joined with an
outcome log, for the stream trainer (``stream_train_table``) to learn from exactly the features the server
computed: no training/serving skew by construction.

``served_events(served, outcomes, spec)``: one row per served candidate, in the log's order (records, then each
record's candidates as sent), with the columns an events table has for ``spec`` (``prepare_events``):

- the spec's raw inputs (``FeatureSpec.raw_inputs``): a request-scope input from the record's ``request`` JSON,
  repeated for each of its candidates; an item-scope one from the candidate's JSON, which the server logs after
  the feature-table join, i.e. as FG saw it. Each key is read as one Arrow type, the first of a number (int64,
  then float64), text, a bool, or a list of one of them that reads every record (``served_outcomes.json_values``):
  the values FG is then given (``to_pylist``) are the ones the server's JSON body gave it. Null where a record
  lacks the key, as FG saw no value there; a key no record has is refused.
- the spec's label: 1 where the outcome log has a ``click`` for the candidate's (request_id, item), else 0
  (``label="click"``, the default: what the stream trainer takes); ``label="gain"``: the candidate's gain as the
  experiment report defines it (the summed values of its ``gain_event`` events), for a graded label.
- the spec's time column, if it names one: the record's served time (when the server scored it), floored to
  ``time_unit`` (``s``, ``ms``, ``us`` or ``ns``; ``auto``: ms), as int64: pass the trainer's ``--time-unit``.
- the spec's group column, if it names one: the record's request id, so each served request is one list.

A time or group column that is also one of the spec's inputs keeps the input's values. Items are matched as text
(``json_field``: ``242`` and ``"242"`` are one item), as the experiment report matches them, with the same
outcome rules (``served_outcomes.outcome_pairs``). ``model``, ``version`` and ``arm`` keep only the records
served by them. Everything is columnar: the JSON by ``pyarrow.json``, the join a pyarrow hash join.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offgraph.features.spec import FeatureSpec
from offgraph.streaming.served_outcomes import (
    EVENTS,
    LogError,
    candidate_outcomes,
    check_columns,
    json_field,
    json_values,
    model_records,
    outcome_pairs,
)
from offgraph.streaming.stream_train_config import TIME_UNITS

SERVED_COLUMNS = ("request_id", "time", "model", "version", "arm", "request", "candidates")
LABELS = ("click", "gain")


def served_events(
    served: pa.Table,
    outcomes: pa.Table,
    spec: FeatureSpec,
    *,
    item_field: str | None = None,
    label: str = "click",
    gain_event: str = "play_share",
    time_unit: str = "ms",
    model: str | None = None,
    version: int | None = None,
    arm: str | None = None,
) -> pa.Table:
    """The events table of the served candidates (the module docstring names its columns). ``item_field``: the
    candidates' item key in both logs (default: the spec's ``item_key``); ``model``: the model whose records count
    (needed when the log holds several); ``version``, ``arm``: only the records served by that version, that arm.
    ``LogError`` (a ValueError) names what is missing: a column, a spec input no record holds, a model, version or
    arm the log does not have, an outcome log none of whose pairs was served."""
    if label not in LABELS:
        raise LogError(f"the label is one of {', '.join(LABELS)}, got {label!r}")
    if gain_event not in EVENTS:
        raise LogError(f"the gain event is one of {', '.join(EVENTS)}, got {gain_event!r}")
    if time_unit != "auto" and time_unit not in TIME_UNITS:
        raise LogError(f"the time unit is auto or one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    item_field = item_field or spec.item_key
    if item_field is None:
        raise LogError("the spec names no item_key: which candidate field is the item (--item-field)?")
    check_columns(served, SERVED_COLUMNS, "served log")
    served = _records(served, model, version, arm)

    request_in, item_in = spec.raw_inputs("request"), spec.raw_inputs("item")
    both = sorted(set(request_in) & set(item_in))
    if both:  # an events table has one column per name: the request's value or the candidate's?
        raise LogError(f"the spec reads {both} both from the request and from the candidates: not from a served log")
    cands = served.column("candidates").combine_chunks()
    parent = pa.array(pc.list_parent_indices(cands).to_numpy().astype(np.int64))
    flat = pc.list_flatten(cands)
    columns: dict[str, pa.Array] = {}
    absent: list[str] = []
    for names, texts, where in ((request_in, served.column("request"), "request"), (item_in, flat, "candidate")):
        for name in names:
            values = json_values(texts, name)
            if values.null_count == len(values):
                absent.append(f"{where} feature {name!r}")
            columns[name] = values.take(parent) if where == "request" else values
    if absent:
        raise LogError(
            f"the served log holds no {', '.join(absent)} that the spec's fields read "
            f"({len(served)} record(s); a model served with other features, or a spec other than the served one?)"
        )

    request_ids = served.column("request_id").cast(pa.string()).combine_chunks().take(parent)
    items = json_field(flat, item_field)
    if items.null_count == len(items):
        raise LogError(f"no served candidate has the field {item_field!r} (the item key; see --item-field)")
    pairs = outcome_pairs(outcomes, item_field, gain_event if label == "gain" else "click")
    clicked, gain, _ = candidate_outcomes(request_ids, items, pairs, item_field)
    columns[spec.label] = pa.array(clicked.astype(np.int64)) if label == "click" else pa.array(gain)
    if spec.time and spec.time not in columns:
        ns = served.column("time").cast(pa.int64()).combine_chunks().take(parent).to_numpy()
        per = int(round(TIME_UNITS["ms" if time_unit == "auto" else time_unit] * 1e6))  # ns per unit
        columns[spec.time] = pa.array(ns // per)
    if spec.group and spec.group not in columns:
        columns[spec.group] = request_ids
    return pa.table(columns)


def _records(served: pa.Table, model: str | None, version: int | None, arm: str | None) -> pa.Table:
    """The served log's records of ``model`` (the log's one model when None), ``version`` and ``arm`` (each:
    any when None); ``LogError`` naming what the log has when one of them is not in it."""
    served, _ = model_records(served, model)
    if version is not None:
        versions = sorted(v for v in pc.unique(served.column("version")).to_pylist() if v is not None)
        if version not in versions:
            raise LogError(f"the served log has no record of version {version} (it has {versions})")
        served = served.filter(pc.equal(served.column("version"), version))
    if arm is not None:
        arms = sorted(a for a in pc.unique(served.column("arm")).to_pylist() if a is not None)
        if arm not in arms:
            raise LogError(f"the served log has no record of the arm {arm!r} (its arms: {', '.join(arms)})")
        served = served.filter(pc.equal(served.column("arm"), arm))
    if served.num_rows == 0:
        raise LogError("the served log has no records")
    return served

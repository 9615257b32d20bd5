"""Example score bodies built from a model's feature spec, for the model's entry in /docs.

Every raw input the spec reads, in its scope (the request's inputs once, the item inputs in each
candidate), with a value of the kind its op reads: a number inside a bucketize field's boundaries, a
count for log_bucket, a value near the training mean for a numeric field, a few words for tokenize, a
list for an id field that pools several values, a placeholder id (``movie_id-1``) otherwise. The ids
are made up (they hash to rows like any id; a feature table has no row of them), but the body is one
the model scores as is, and it shows the names and shapes of the model's own inputs.
``ids_only_body`` is the body of an ids-only request to a model with feature tables: the tables' keys
alone.
"""

from __future__ import annotations

from typing import Any

from offgraph.features.spec import FeatureSpec, FieldSpec
from offgraph.server.api.model_inputs import NUMBER_OPS

WORDS = ("red", "running", "shoes", "for", "trail", "and", "road")
"""Words of a tokenize input's example text."""


def example_body(spec: FeatureSpec, candidates: int = 2) -> dict[str, Any]:
    """``{"request": {...}, "candidates": [{...}, ...]}`` with every raw input of the spec."""
    request = spec.raw_inputs("request")
    item = spec.raw_inputs("item")
    return {
        "request": {name: _value(spec, name, 0) for name in request},
        "candidates": [{name: _value(spec, name, k) for name in item} for k in range(1, candidates + 1)],
    }


def ids_only_body(spec: FeatureSpec, candidates: int = 2) -> dict[str, Any] | None:
    """The keys of the spec's feature tables alone (the server fills the rest); None without tables."""
    if not spec.tables:
        return None
    request = [t.key for t in spec.tables if t.scope == "request"]
    item = [t.key for t in spec.tables if t.scope == "item"]
    return {
        "request": {key: _value(spec, key, 0) for key in request},
        "candidates": [{key: _value(spec, key, k) for key in item} for k in range(1, candidates + 1)],
    }


def _value(spec: FeatureSpec, name: str, k: int) -> Any:
    """A value of raw input ``name``: ``k`` is 0 in the request, the candidate's number (from 1) in a candidate,
    so that candidates differ. An input read as a number by one field is a number for all of them."""
    fields = [f for f in spec.fields + spec.numeric if f.input == name and f.scope in ("request", "item")]
    number = next((f for f in fields if f.op in NUMBER_OPS), None)
    if number is not None:
        return _number(number, k)
    f = fields[0]
    sep = f.params.get("separator")
    if f.op == "tokenize":
        words = [WORDS[(k + j) % len(WORDS)] for j in range(3)]
        return (sep or " ").join(words)
    values = [f"{name}-{k}", f"{name}-{k + 1}"]
    if sep is not None:
        return sep.join(values)
    if _pools(spec, f):
        return values
    return values[0]


def _pools(spec: FeatureSpec, f: FieldSpec) -> bool:
    """The field names its pooling: it is meant to read several values (genres, a title's words)."""
    return any(fr.get("name") == f.name and "pooling" in fr for fr in spec.raw.get("fields", ()))


def _number(f: FieldSpec, k: int) -> int | float:
    if f.op == "bucketize":  # boundaries from the middle on: a value in a bucket the training saw
        b = f.params["boundaries"]
        return _plain(b[(len(b) // 2 + k) % len(b)])
    if f.op == "log_bucket":  # a small count, in a different bucket for each candidate
        return _plain(round(f.params["base"] ** (k + 2), 2))
    stats = f.params.get("stats")
    if stats:  # around the training mean
        return _plain(round(stats["mean"] + 0.5 * (k - 1) * stats.get("std", 1.0), 4))
    clip = f.params.get("clip")
    if clip:
        return _plain((clip[0] + clip[1]) / 2)
    return k + 1


def _plain(x: float) -> int | float:
    """An integral value as an integer (a year, an age), as a caller would write it."""
    return int(x) if float(x).is_integer() else x

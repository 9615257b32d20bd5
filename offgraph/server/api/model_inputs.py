"""What a served version reads, for the metadata routes of TensorFlow Serving and KServe: each raw input's
scope, whether it is a number or a string, whether it takes a list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from offgraph.features.spec import LIST_OPS, FeatureSpec

NUMBER_OPS = frozenset({"bucketize", "log_bucket", "numeric"})
"""Ops that read their input as a number (the others read strings, ``id`` numbers too)."""

Scope = Literal["request", "item", "both"]


@dataclass(frozen=True)
class InputInfo:
    name: str
    scope: Scope  # both: a request-scope field and an item-scope field read it
    number: bool  # every field reading it reads a number
    takes_list: bool  # some field reading it takes a list of values


def describe_inputs(spec: FeatureSpec) -> list[InputInfo]:
    """The spec's raw inputs, request-scope ones first, in spec order."""
    request, item = spec.raw_inputs("request"), spec.raw_inputs("item")
    out = []
    for name in request + [n for n in item if n not in request]:
        fields = [f for f in spec.fields + spec.numeric if f.input == name and f.scope in ("request", "item")]
        scope: Scope = "both" if name in request and name in item else ("request" if name in request else "item")
        out.append(
            InputInfo(
                name=name,
                scope=scope,
                number=all(f.op in NUMBER_OPS for f in fields),
                takes_list=any(f.op in LIST_OPS for f in fields),
            )
        )
    return out


def shape(info: InputInfo) -> list[int]:
    """The input's shape in a request: one value per request (a request-scope input) or per candidate (-1),
    then -1 for a list's values."""
    return [1 if info.scope == "request" else -1] + ([-1] if info.takes_list else [])

"""A JSON Schema (draft 2020-12) of the feature spec, for editors (completion and squiggles as one types a
spec YAML): built from the parser's own names (``offgraph.features.spec``: keys, ops, each op's
parameters, scopes, poolings, hashes, transforms, segmenters; ``table_spec``: a table's keys), so it
cannot drift from them. It checks the shape of each key; the rules across fields (a cross's inputs
declared above it, the scopes they make, tables against the fields' inputs) are the parser's
(``offgraph spec check``). Written to ``docs/spec.schema.json`` by ``offgraph spec schema``."""

from __future__ import annotations

import json
from typing import Any

from offgraph.features import spec as S
from offgraph.features import table_spec as T
from offgraph.features.hashing import HASHES
from offgraph.features.numeric import TRANSFORMS
from offgraph.features.segment import SEGMENTERS

SCHEMA_ID = "https://offgraph.invalid/spec.schema.json"
"""A name, never fetched: editors map the file to specs by a ``# yaml-language-server: $schema=`` line."""

_POSITIVE_INT = {"type": "integer", "minimum": 1}
_NUMBER = {"type": "number"}
_COLUMN = {"type": "string", "minLength": 1}
_NUMBERS = {"type": "array", "items": _NUMBER, "minItems": 1}

_MODEL_PROPS: dict[str, dict[str, Any]] = {
    "embedding_dim": {**_POSITIVE_INT, "description": "embedding width D of every field"},
    "hash": {"enum": sorted(HASHES), "description": "hash of a value's canonical string to its row"},
    "mlp": {"type": "array", "items": _POSITIVE_INT, "description": "hidden layer sizes of the dense head"},
    "pooling": {"enum": list(S.POOLINGS), "description": "default pooling of a multi-valued field"},
    "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "l2_embedding": {"type": "number", "minimum": 0},
    "l2_dense": {"type": "number", "minimum": 0},
    "cross_separator": {"type": "string", "minLength": 1, "description": "joins a cross's values"},
    "cross_max_values": {**_POSITIVE_INT, "description": "default cap of a cross's product"},
    "max_values": {**_POSITIVE_INT, "description": "default max_values of id and tokenize fields"},
    "calibration": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "negative_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "scale": {"type": "number", "exclusiveMinimum": 0},
            "power": {"type": "number", "exclusiveMinimum": 0},
            "logit_scale": {"type": "number", "exclusiveMinimum": 0},
            "logit_shift": _NUMBER,
        },
    },
}

_FIELD_PROPS: dict[str, dict[str, Any]] = {
    "name": {**_COLUMN, "description": "the field's name (unique)"},
    "scope": {"enum": list(S.SCOPES), "description": "where its input comes from: the request, a candidate, both"},
    "op": {"enum": list(S.OPS)},
    "input": {**_COLUMN, "description": "the raw column it reads"},
    "inputs": {
        "type": "array",
        "items": _COLUMN,
        "minItems": 2,
        "description": "fields declared above it that it combines",
    },
    "rows": {**_POSITIVE_INT, "description": "rows of its embedding table (values hash into them)"},
    "pooling": {
        "enum": list(S.FIELD_POOLINGS),
        "description": "how a row's values pool: mean, sum, or recency (a weighted mean whose weights halve every "
        "half_life values back from the last, the most recent of a history listed oldest first)",
    },
    "half_life": {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": S.HALF_LIFE_MAX,
        "description": "recency pooling's half-life, in values back from the most recent",
    },
    "separator": {"type": "string", "minLength": 1},
    "max_values": {**_POSITIVE_INT, "description": "the most values one row may hold (overflow: what becomes of more)"},
    "overflow": {
        "enum": list(S.OVERFLOWS),
        "description": "a row over max_values: refuse (default: refused when serving, every value trained) or "
        "keep_last (cut to its last max_values values, the most recent of a history listed oldest first, in "
        "training and serving alike)",
    },
    "lowercase": {"type": "boolean"},
    "vocabulary": {
        **_COLUMN,
        "description": "a file of keys, one a line, relative to the spec: values map to rows 1..V by it, values it "
        "lacks to row 0 (no hashing; rows, when given, must be V + 1 + capacity)",
    },
    "capacity": {
        "type": "integer",
        "minimum": 0,
        "description": "a vocabulary field's rows V+1..V+capacity, for ids first seen after the file was written: "
        "the stream trainer gives such an id the next free row and offgraph update appends it to the served "
        "vocabulary",
    },
    "segmenter": {"enum": list(SEGMENTERS)},
    "boundaries": {**_NUMBERS, "description": "strictly increasing bucket boundaries"},
    "base": {"type": "number", "exclusiveMinimum": 1},
    "transform": {
        "oneOf": [
            {"enum": list(TRANSFORMS)},
            {"type": "array", "items": {"enum": list(TRANSFORMS)}, "uniqueItems": True},
        ]
    },
    "clip": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2, "description": "[lo, hi]"},
    "stats": {
        "type": "object",
        "required": ["mean", "std"],
        "additionalProperties": False,
        "properties": {"mean": _NUMBER, "std": {"type": "number", "exclusiveMinimum": 0}},
    },
    "missing": {**_NUMBER, "description": "what no value is fed as"},
}

_TOP_PROPS: dict[str, dict[str, Any]] = {
    "model": {"$ref": "#/$defs/model"},
    "label": {**_COLUMN, "description": "the 0/1 label column"},
    "group": {**_COLUMN, "description": "request groups (NDCG@10, listwise loss)"},
    "time": {**_COLUMN, "description": "for the chronological splits"},
    "split_key": {**_COLUMN, "description": "for the per-key chronological split"},
    "item_key": {**_COLUMN, "description": "the candidate id"},
    "fields": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/field"}},
    "tables": {
        "type": "object",
        "minProperties": 1,
        "propertyNames": {"pattern": T.TABLE_NAME.pattern},
        "additionalProperties": {"$ref": "#/$defs/table"},
    },
}

_TABLE_PROPS: dict[str, dict[str, Any]] = {
    "key": {**_COLUMN, "description": "the raw input the rows are keyed by"},
    "columns": {"type": "array", "items": _COLUMN, "minItems": 1, "uniqueItems": True},
    "max_value_bytes": _POSITIVE_INT,
    "max_row_bytes": _POSITIVE_INT,
}


def _exactly(props: dict[str, dict[str, Any]], names: set[str], where: str) -> dict[str, dict[str, Any]]:
    """``props`` restricted to ``names``; the two must list the same keys (a key the parser takes without
    a shape here, or one here the parser refuses, fails at once)."""
    if set(props) != names:
        raise AssertionError(f"{where}: schema keys {sorted(props)} != the parser's {sorted(names)}")
    return {k: props[k] for k in sorted(names)}


def _op_rule(op: str) -> dict[str, Any]:
    """The keys op ``op`` takes, and those it needs."""
    allowed = S._COMMON | S._OP_PARAMS[op]
    if op in S.NUMERIC_OPS:
        allowed -= {"rows", "pooling", "half_life", "inputs"}
        required = ["input"]
    elif op in S.RAW_OPS:
        allowed -= {"inputs"}
        required = ["input", "rows"] + (["boundaries"] if op == "bucketize" else [])
    else:
        allowed -= {"input"}
        required = ["inputs", "rows"]
    rule: dict[str, Any] = {"required": required, "propertyNames": {"enum": sorted(allowed)}}
    if "vocabulary" in allowed:  # its rows come from the vocabulary
        rule["required"] = [k for k in required if k != "rows"]
        rule["anyOf"] = [{"required": ["rows"]}, {"required": ["vocabulary"]}]
    if op in S.RAW_OPS + S.NUMERIC_OPS:
        rule["properties"] = {"scope": {"enum": ["request", "item"]}}
    if op == "match_count":
        rule["properties"] = {"inputs": {"maxItems": 2}}
    return {"if": {"properties": {"op": {"const": op}}, "required": ["op"]}, "then": rule}


# recency pooling takes its half-life, and only it does
_RECENCY_RULE: dict[str, Any] = {
    "if": {"properties": {"pooling": {"const": "recency"}}, "required": ["pooling"]},
    "then": {"required": ["half_life"]},
    "else": {"not": {"required": ["half_life"]}},
}


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a spec (the module docstring)."""
    params = set().union(*S._OP_PARAMS.values()) | S._COMMON
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "offgraph feature spec",
        "description": f"A model's fields, label and optional columns ({S.FG_VERSION}). Generated by "
        "`offgraph spec schema`; the full checks are `offgraph spec check SPEC`.",
        "type": "object",
        "required": ["label", "fields"],
        "additionalProperties": False,
        "properties": _exactly(_TOP_PROPS, S._TOP, "top level"),
        "$defs": {
            "model": {
                "type": "object",
                "additionalProperties": False,
                "properties": _exactly(_MODEL_PROPS, S._MODEL_KEYS, "model"),
            },
            "field": {
                "type": "object",
                "required": ["name", "scope", "op"],
                "properties": _exactly(_FIELD_PROPS, params, "field"),
                "allOf": [_op_rule(op) for op in S.OPS] + [_RECENCY_RULE],
            },
            "table": {
                "type": "object",
                "required": ["key", "columns"],
                "additionalProperties": False,
                "properties": _exactly(_TABLE_PROPS, T._KEYS, "table"),
            },
        },
    }


def schema_json() -> str:
    """The schema as the repository's file holds it (``docs/spec.schema.json``)."""
    return json.dumps(spec_schema(), indent=2) + "\n"

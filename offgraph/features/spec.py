"""Feature spec: the one declaration of a model's fields, loaded from YAML and validated.

A spec names the model's shape (embedding dim, hash, MLP), the label, optional
request-group / time / split-key / item-key columns, and the fields. Every
problem is reported as a ``SpecError`` (a ``ValueError``) naming the field and
what is wrong with it.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from offgraph.features.hashing import check_hash_name
from offgraph.features.numeric import TRANSFORMS
from offgraph.features.segment import SEGMENTERS
from offgraph.features.suggest import did_you_mean, unknown_names
from offgraph.features.table_spec import TableSpec, parse_tables
from offgraph.features.vocabulary import Vocabulary, VocabularyError, read_vocabulary

FG_VERSION = "offgraph-fg-1"
"""Semantics version of feature generation + hashing. Bump on any change that
changes a value's row; stored with every trained run and exported model."""

SCOPES = ("request", "item", "cross")
POOLINGS = ("mean", "sum")
FIELD_POOLINGS = POOLINGS + ("recency",)
"""A field's own pooling may also be ``recency`` (with ``half_life``: ``offgraph.features.pooling.recency_weights``),
a weighting of a history's most recent values; the model-wide default is mean or sum."""
RAW_OPS = ("id", "tokenize", "bucketize", "log_bucket")
DERIVED_OPS = ("cross", "match_count")
NUMERIC_OPS = ("numeric",)
"""Ops of continuous inputs (``offgraph.features.numeric``): one float per row into the dense [N, k] input, no table."""
OPS = RAW_OPS + DERIVED_OPS + NUMERIC_OPS

# parameters each op accepts besides name/scope/op/input(s)/rows/pooling
_OP_PARAMS: dict[str, set[str]] = {
    "id": {"separator", "max_values", "overflow", "vocabulary", "capacity"},
    "tokenize": {"separator", "lowercase", "max_values", "overflow", "segmenter", "vocabulary", "capacity"},
    "bucketize": {"boundaries"},
    "log_bucket": {"base"},
    "cross": {"separator", "max_values"},
    "match_count": {"boundaries"},
    "numeric": {"transform", "clip", "stats", "missing"},
}
_COMMON = {"name", "scope", "op", "input", "inputs", "rows", "pooling", "half_life"}
_TOP = {"model", "label", "group", "time", "split_key", "item_key", "fields", "tables"}
_MODEL_KEYS = {
    "embedding_dim",
    "hash",
    "mlp",
    "pooling",
    "dropout",
    "l2_embedding",
    "l2_dense",
    "cross_separator",
    "cross_max_values",
    "max_values",
    "calibration",
}
LIST_OPS = ("id", "tokenize")
"""Raw ops whose row may hold many values (a list, a split string, text): they take ``max_values``,
the most values one row may hold, and ``overflow``, what becomes of a row with more (``OVERFLOWS``)."""
OVERFLOWS = ("refuse", "keep_last")
"""A list field's ``overflow`` (``offgraph.features.value_limits``): ``refuse`` (the default) refuses a
served row over ``max_values`` and trains on every value; ``keep_last`` keeps a row's last ``max_values``
values (a history's most recent, its list ordered oldest first) in training and serving alike."""
HALF_LIFE_MAX = 1e6
"""A longer half-life weighs a history's values alike to float32 rounding: a mean."""
_CALIB_KEYS = {"negative_rate", "scale", "power", "logit_scale", "logit_shift"}


class SpecError(ValueError):
    """A feature spec that cannot be used; the message names the field and the problem."""


@dataclass(frozen=True)
class Calibration:
    """The steps after the model's sigmoid, in order (``offgraph.calibration.calibrate``)."""

    negative_rate: float = 1.0  # kept negative rate r of down-sampling: p' = p / (p + (1-p)/r)
    scale: float = 1.0  # then p'' = min(1, scale * p'^power)
    power: float = 1.0
    # first of all, Platt scaling: p = sigmoid(logit_scale * logit(p) + logit_shift); fitted on the validation
    # rows by training with a listwise loss (offgraph.model.platt), whose raw scores are not probabilities
    logit_scale: float = 1.0
    logit_shift: float = 0.0

    @property
    def platt(self) -> bool:
        return self.logit_scale != 1.0 or self.logit_shift != 0.0

    @property
    def identity(self) -> bool:
        return self.negative_rate == 1.0 and self.scale == 1.0 and self.power == 1.0 and not self.platt


@dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 16
    hash: str = "xxh64"
    mlp: tuple[int, ...] = (256, 128, 64)
    pooling: str = "mean"
    dropout: float = 0.0
    l2_embedding: float = 0.0
    l2_dense: float = 0.0
    cross_separator: str = "_"
    cross_max_values: int = 64
    max_values: int = 1000  # default max_values of id / tokenize fields
    calibration: Calibration = field(default_factory=Calibration)


@dataclass(frozen=True)
class FieldSpec:
    name: str
    scope: str
    op: str
    rows: int
    pooling: str
    input: str | None = None
    inputs: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    # ``pooling: recency``: values back from the most recent at which a value's weight halves
    half_life: float | None = None
    # ``vocabulary: FILE`` (offgraph.features.vocabulary): values map to its rows 1..V, the unknown to row 0
    vocabulary: Vocabulary | None = field(default=None, compare=False, repr=False)
    # ``capacity: K`` (a vocabulary field): rows V+1..V+K wait for keys appended while serving (streaming)
    capacity: int = 0

    @property
    def appendable(self) -> range:
        """The rows keys appended to the vocabulary take, in order (empty: none may be appended)."""
        return range(self.rows - self.capacity, self.rows)


@dataclass(frozen=True)
class FeatureSpec:
    model: ModelConfig
    label: str
    fields: tuple[FieldSpec, ...]  # embedding fields: one table each, table id = index here
    group: str | None = None
    time: str | None = None
    split_key: str | None = None
    item_key: str | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    fg_version: str = FG_VERSION
    numeric: tuple[FieldSpec, ...] = ()  # numeric fields, in spec order: column j of the dense [N, k] input
    tables: tuple[TableSpec, ...] = ()  # entity tables the server fills raw inputs from (offgraph.features.table_spec)

    def with_calibration(self, **values: float) -> FeatureSpec:
        """The spec with these ``model.calibration`` keys set (training's fitted Platt scaling)."""
        raw = copy.deepcopy(self.raw)
        model = raw.setdefault("model", {})
        model["calibration"] = {**(model.get("calibration") or {}), **{k: float(v) for k, v in values.items()}}
        return parse_spec(raw)

    def with_stats(self, stats: dict[str, dict]) -> FeatureSpec:
        """The spec with ``stats: {mean, std}`` set on the named numeric fields (training's statistics)."""
        raw = copy.deepcopy(self.raw)
        for fr in raw["fields"]:
            if fr.get("name") in stats:
                fr["stats"] = {k: float(v) for k, v in stats[fr["name"]].items()}
        return parse_spec(raw)

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def field_index(self, name: str) -> int:
        for i, f in enumerate(self.fields):
            if f.name == name:
                return i
        raise KeyError(name)

    def raw_inputs(self, scope: str, numeric: bool = True) -> list[str]:
        """Raw input columns read by fields of one scope ('request' or 'item'), numeric fields' included
        unless ``numeric`` is False."""
        out: list[str] = []
        for f in self.fields + (self.numeric if numeric else ()):
            if f.scope == scope and f.input is not None and f.input not in out:
                out.append(f.input)
        return out

    def to_dict(self) -> dict:
        return copy.deepcopy(self.raw)

    def fingerprint(self) -> str:
        """Stable JSON of the spec, for comparisons between a run and a model; a vocabulary is its file's
        sha256 (a version holds its own copy of the file, under another path)."""
        raw = self.raw
        if any(f.vocabulary is not None for f in self.fields):
            raw = self.with_vocabulary_paths(
                {f.name: f"sha256:{f.vocabulary.sha256}" for f in self.fields if f.vocabulary}
            )
        return json.dumps(raw, sort_keys=True, separators=(",", ":"))

    def with_vocabulary_paths(self, paths: dict[str, str]) -> dict:
        """The raw spec with these fields' ``vocabulary`` set to ``paths[name]`` and their ``rows`` written out
        (a version's copy: its files under the version directory)."""
        raw = copy.deepcopy(self.raw)
        by_name = {f.name: f for f in self.fields}
        for fr in raw["fields"]:
            if fr.get("name") in paths:
                fr["vocabulary"] = paths[fr["name"]]
                fr["rows"] = by_name[fr["name"]].rows
        return raw


def load_spec(path: str | Path) -> FeatureSpec:
    """The spec in ``path``; a field's ``vocabulary`` file is read relative to the spec's directory."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"spec {path}: cannot read: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"spec {path}: not valid YAML{yaml_error_text(e)}") from None
    return parse_spec(raw, source=str(path), base=path.parent)


def yaml_error_text(e: yaml.YAMLError) -> str:
    """What follows "not valid YAML": " at line 3, column 7: <problem>, <context> (line 2)". PyYAML's own
    text names the string it parsed ("<unicode string>"), not the file; the caller names the file."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if mark is None or problem is None:
        return f": {e}"
    context = getattr(e, "context", None)
    context_mark = getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}"
    if context and context_mark is not None and context_mark.line != mark.line:
        context += f" (line {context_mark.line + 1})"
    return f"{where}: {problem}" + (f", {context}" if context else "")


def parse_spec(raw: Any, source: str = "<spec>", base: str | Path | None = None) -> FeatureSpec:
    """``base``: the directory a relative ``vocabulary`` path is read from (default: the working directory)."""

    def fail(msg: str) -> NoReturn:
        raise SpecError(f"spec {source}: {msg}")

    if not isinstance(raw, dict):
        fail("top level must be a mapping with 'model', 'label' and 'fields'")
    unknown = set(raw) - _TOP
    if unknown:
        fail(unknown_names("top-level key", unknown, _TOP))
    model = _parse_model(raw.get("model") or {}, fail)
    label = raw.get("label")
    if not isinstance(label, str) or not label:
        fail("'label' must name the label column")
    opt: dict[str, Any] = {}  # the optional column names, str or None
    for key in ("group", "time", "split_key", "item_key"):
        v = raw.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            fail(f"'{key}' must be a column name, got {v!r}")
        opt[key] = v
    fields_raw = raw.get("fields")
    if not isinstance(fields_raw, list) or not fields_raw:
        fail("'fields' must be a non-empty list")
    fields: list[FieldSpec] = []
    numeric: list[FieldSpec] = []
    by_name: dict[str, FieldSpec] = {}
    for i, fr in enumerate(fields_raw):
        f = _parse_field(fr, i, model, by_name, fail, base)
        by_name[f.name] = f
        (numeric if f.op in NUMERIC_OPS else fields).append(f)
    if not fields:
        fail("'fields' needs at least one embedding field (numeric fields alone have no tables)")
    tables = parse_tables(raw.get("tables"), fields + numeric, fail)
    normalized = copy.deepcopy(raw)  # a spec without 'tables' keeps its raw dict, hence its fingerprint
    for fr in normalized["fields"]:  # a vocabulary's path as read, absolute: the spec re-parsed (with_*) or
        if "vocabulary" in fr:  # written into a run reads the same file
            fr["vocabulary"] = by_name[fr["name"]].vocabulary.source  # type: ignore[union-attr]
    return FeatureSpec(
        model=model, label=label, fields=tuple(fields), raw=normalized, numeric=tuple(numeric), tables=tables, **opt
    )


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _parse_model(m: Any, fail) -> ModelConfig:
    if not isinstance(m, dict):
        fail("'model' must be a mapping")
    unknown = set(m) - _MODEL_KEYS
    if unknown:
        fail("model: " + unknown_names("key", unknown, _MODEL_KEYS))
    d = ModelConfig()
    dim = m.get("embedding_dim", d.embedding_dim)
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        fail(f"model.embedding_dim must be an integer >= 1, got {dim!r}")
    h = m.get("hash", d.hash)
    try:
        check_hash_name(h)
    except ValueError as e:
        fail(f"model.hash: {e}")
    mlp = m.get("mlp", list(d.mlp))
    if not isinstance(mlp, list) or not all(isinstance(u, int) and not isinstance(u, bool) and u >= 1 for u in mlp):
        fail(f"model.mlp must be a list of positive layer sizes, got {mlp!r}")
    pooling = m.get("pooling", d.pooling)
    if pooling not in POOLINGS:
        fail(f"model.pooling must be one of {POOLINGS}, got {pooling!r}")
    floats = {}
    for k in ("dropout", "l2_embedding", "l2_dense"):
        v = m.get(k, getattr(d, k))
        if not _num(v) or v < 0 or (k == "dropout" and v >= 1):
            fail(f"model.{k} must be a number >= 0{' and < 1' if k == 'dropout' else ''}, got {v!r}")
        floats[k] = float(v)
    sep = m.get("cross_separator", d.cross_separator)
    if not isinstance(sep, str) or not sep:
        fail("model.cross_separator must be a non-empty string")
    cap = m.get("cross_max_values", d.cross_max_values)
    if not _positive_int(cap):
        fail(f"model.cross_max_values must be an integer >= 1, got {cap!r}")
    max_values = m.get("max_values", d.max_values)
    if not _positive_int(max_values):
        fail(f"model.max_values must be an integer >= 1, got {max_values!r}")
    c = m.get("calibration") or {}
    if not isinstance(c, dict):
        fail(f"model.calibration must be a mapping with keys among {sorted(_CALIB_KEYS)}")
    if set(c) - _CALIB_KEYS:
        fail("model.calibration: " + unknown_names("key", set(c) - _CALIB_KEYS, _CALIB_KEYS))
    r = c.get("negative_rate", 1.0)
    if not _num(r) or not 0 < r <= 1:
        fail(f"model.calibration.negative_rate must be in (0, 1], got {r!r}")
    for k in ("scale", "power", "logit_scale"):
        if not _num(c.get(k, 1.0)) or not 0 < c.get(k, 1.0) < math.inf:
            fail(f"model.calibration.{k} must be a finite number > 0")
    if not _num(c.get("logit_shift", 0.0)) or not math.isfinite(c.get("logit_shift", 0.0)):
        fail("model.calibration.logit_shift must be a finite number")
    calib = Calibration(
        float(r),
        float(c.get("scale", 1.0)),
        float(c.get("power", 1.0)),
        float(c.get("logit_scale", 1.0)),
        float(c.get("logit_shift", 0.0)),
    )
    return ModelConfig(
        dim,
        h,
        tuple(mlp),
        pooling,
        cross_separator=sep,
        cross_max_values=cap,
        max_values=max_values,
        calibration=calib,
        **floats,
    )


def _parse_field(fr: Any, i: int, model: ModelConfig, known: dict[str, FieldSpec], fail, base=None) -> FieldSpec:
    if not isinstance(fr, dict):
        fail(f"fields[{i}] must be a mapping, got {fr!r}")
    name = fr.get("name")
    if not isinstance(name, str) or not name:
        fail(f"fields[{i}] has no 'name'")
    where = f"field '{name}'"
    if name in known:
        fail(f"{where}: duplicate field name")
    op = fr.get("op")
    if op not in OPS:
        fail(f"{where}: unknown op {op!r}{did_you_mean(op, OPS)}; known ops: {list(OPS)}")
    unknown = set(fr) - _COMMON - _OP_PARAMS[op]
    if unknown:
        fail(f"{where}: " + unknown_names("parameter", unknown, _COMMON | _OP_PARAMS[op], of=f" for op '{op}'"))
    scope = fr.get("scope")
    if scope not in SCOPES:
        fail(f"{where}: scope must be one of {SCOPES}, got {scope!r}{did_you_mean(scope, SCOPES)}")
    if op in NUMERIC_OPS:
        return _parse_numeric(fr, name, scope, fail)
    vocab = _vocabulary(fr, where, base, fail) if "vocabulary" in fr else None
    capacity = fr.get("capacity", 0)
    if "capacity" in fr and vocab is None:
        fail(f"{where}: 'capacity' reserves rows for keys appended to a vocabulary: the field has no vocabulary")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        fail(f"{where}: capacity must be an integer >= 0 (rows for appended keys), got {capacity!r}")
    rows = fr.get("rows", vocab.rows + capacity if vocab is not None else None)
    if vocab is not None and rows != vocab.rows + capacity:
        fail(
            f"{where}: rows {rows!r} but its vocabulary {vocab.source} has {vocab.size} keys"
            + (f" and capacity {capacity}" if capacity else "")
            + f": rows must be {vocab.rows + capacity}"
        )
    if rows is None:
        fail(f"{where}: 'rows' is required (an integer >= 1: the rows of its embedding table, which ids hash into)")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        fail(f"{where}: rows must be an integer >= 1, got {rows!r}")
    if rows >= 2**63:
        fail(f"{where}: rows must be < 2**63")
    pooling = fr.get("pooling", model.pooling)
    if pooling not in FIELD_POOLINGS:
        fail(f"{where}: pooling must be one of {FIELD_POOLINGS}, got {pooling!r}")
    half_life = fr.get("half_life")
    if pooling == "recency" and half_life is None:
        fail(
            f"{where}: pooling 'recency' needs 'half_life' (values back from the most recent at which a weight halves)"
        )
    if pooling != "recency" and half_life is not None:
        fail(f"{where}: 'half_life' is recency pooling's: this field's pooling is {pooling!r}")
    if half_life is not None and (not _num(half_life) or not 0 < half_life <= HALF_LIFE_MAX):
        fail(f"{where}: half_life must be a number in (0, {HALF_LIFE_MAX:g}], got {half_life!r}")
    params = {k: fr[k] for k in _OP_PARAMS[op] if k in fr}
    inp, inputs = fr.get("input"), fr.get("inputs")
    if op in RAW_OPS:
        if inputs is not None:
            fail(f"{where}: op '{op}' reads one raw column: use 'input', not 'inputs'")
        if not isinstance(inp, str) or not inp:
            fail(f"{where}: missing 'input' (the raw column op '{op}' reads)")
        if scope == "cross":
            fail(
                f"{where}: a raw-column op reads either the request or the candidate: scope must be "
                "'request' or 'item' ('cross' is for cross/match_count fields)"
            )
        inputs_t: tuple[str, ...] = ()
    else:
        if inp is not None:
            fail(f"{where}: op '{op}' combines other fields: use 'inputs: [field, field]', not 'input'")
        if not isinstance(inputs, list) or len(inputs) < 2 or not all(isinstance(x, str) for x in inputs):
            fail(f"{where}: 'inputs' must list at least two field names")
        if op == "match_count" and len(inputs) != 2:
            fail(f"{where}: match_count takes exactly two inputs, got {len(inputs)}")
        for x in inputs:
            if x == name:
                fail(f"{where}: cannot use itself as an input")
            if x not in known:
                fail(
                    f"{where}: input '{x}' is not a field defined above it (a cross or match_count "
                    "combines fields declared earlier in 'fields')"
                )
            if known[x].op in NUMERIC_OPS:
                fail(
                    f"{where}: input '{x}' is a numeric field (a float, no values to combine): cross a "
                    "bucketize or log_bucket field of the same column instead"
                )
        parts = {known[x].scope for x in inputs}
        derived = "cross" if ("cross" in parts or parts == {"request", "item"}) else parts.pop()
        if scope != derived:
            desc = ", ".join(f"{x} ({known[x].scope})" for x in inputs)
            fail(f"{where}: declared scope '{scope}' but its inputs [{desc}] make it '{derived}'")
        inputs_t = tuple(inputs)
    if op in ("bucketize", "match_count") and "boundaries" in params:
        b = params["boundaries"]
        if not isinstance(b, list) or not b or not all(_num(x) for x in b):
            fail(f"{where}: boundaries must be a non-empty list of numbers")
        if any(b[j] >= b[j + 1] for j in range(len(b) - 1)):
            fail(f"{where}: boundaries must be strictly increasing, got {b}")
        params["boundaries"] = [float(x) for x in b]
    if op == "bucketize" and "boundaries" not in params:
        fail(f"{where}: op 'bucketize' needs 'boundaries'")
    if op == "log_bucket":
        base = params.setdefault("base", 2)
        if not _num(base) or base <= 1:
            fail(f"{where}: log_bucket base must be a number > 1, got {base!r}")
        params["base"] = float(base)
    for k in ("separator",):
        if k in params and (not isinstance(params[k], str) or params[k] == ""):
            fail(f"{where}: {k} must be a non-empty string")
    if op == "cross":
        params.setdefault("separator", model.cross_separator)
        params.setdefault("max_values", model.cross_max_values)
    if op in LIST_OPS:
        params.setdefault("max_values", model.max_values)
        over = params.setdefault("overflow", "refuse")
        if over not in OVERFLOWS:
            fail(f"{where}: overflow must be one of {list(OVERFLOWS)}, got {over!r}{did_you_mean(over, OVERFLOWS)}")
    if "max_values" in params and not _positive_int(params["max_values"]):
        fail(f"{where}: max_values must be an integer >= 1, got {params['max_values']!r}")
    if op == "tokenize":
        params.setdefault("lowercase", True)
        if not isinstance(params["lowercase"], bool):
            fail(f"{where}: lowercase must be true or false")
        seg = params.get("segmenter", "whitespace")
        if seg not in SEGMENTERS:
            fail(f"{where}: segmenter must be one of {list(SEGMENTERS)}, got {seg!r}")
        if seg != "whitespace" and "separator" in params:
            fail(f"{where}: 'separator' is for the whitespace segmenter; segmenter '{seg}' finds its own terms")
    params.pop("vocabulary", None)  # held as the field's Vocabulary
    params.pop("capacity", None)  # likewise
    return FieldSpec(
        name=name,
        scope=scope,
        op=op,
        rows=rows,
        pooling=pooling,
        input=inp,
        inputs=inputs_t,
        params=params,
        vocabulary=vocab,
        capacity=capacity,
        half_life=None if half_life is None else float(half_life),
    )


def _vocabulary(fr: dict, where: str, base, fail: Callable[[str], NoReturn]) -> Vocabulary:
    """The field's ``vocabulary`` file, read (relative to ``base``)."""
    path = fr["vocabulary"]
    if not isinstance(path, str) or not path:
        fail(f"{where}: vocabulary must name a file of keys (one a line), got {path!r}")
    try:
        return read_vocabulary((Path(base or ".") / path).absolute())
    except VocabularyError as e:
        fail(f"{where}: {e}")


def _parse_numeric(fr: dict, name: str, scope: str, fail) -> FieldSpec:
    """A numeric field (``offgraph.features.numeric``): one raw column, transforms, no table."""
    where = f"field '{name}'"
    for k in ("rows", "pooling", "inputs"):
        if k in fr:
            fail(f"{where}: op 'numeric' feeds a float, not table rows: it takes no '{k}'")
    inp = fr.get("input")
    if not isinstance(inp, str) or not inp:
        fail(f"{where}: missing 'input' (the raw column op 'numeric' reads)")
    if scope == "cross":
        fail(f"{where}: a numeric field reads either the request or the candidate: scope must be 'request' or 'item'")
    params: dict[str, Any] = {}
    steps = fr.get("transform", [])
    if isinstance(steps, str):
        steps = [steps]
    if not isinstance(steps, list) or any(t not in TRANSFORMS for t in steps) or len(set(steps)) != len(steps):
        fail(
            f"{where}: transform must be a list of distinct steps among {list(TRANSFORMS)}, got {fr.get('transform')!r}"
        )
    if "standardize" in steps and steps[-1] != "standardize":
        fail(f"{where}: standardize must be the last step (its statistics are of the values before it)")
    params["transform"] = list(steps)
    if ("clip" in steps) != ("clip" in fr):
        fail(f"{where}: 'clip: [lo, hi]' goes with the clip step, and only with it")
    if "clip" in fr:
        c = fr["clip"]
        if not isinstance(c, list) or len(c) != 2 or not all(_num(x) for x in c) or not c[0] < c[1]:
            fail(f"{where}: clip must be [lo, hi] with lo < hi, got {c!r}")
        params["clip"] = [float(c[0]), float(c[1])]
    if "stats" in fr:
        st = fr["stats"]
        if "standardize" not in steps:
            fail(f"{where}: 'stats' are for the standardize step")
        if (
            not isinstance(st, dict)
            or set(st) != {"mean", "std"}
            or not all(_num(v) for v in st.values())
            or not st["std"] > 0
            or st["mean"] != st["mean"]
        ):
            fail(f"{where}: stats must be {{mean: number, std: number > 0}}, got {st!r}")
        params["stats"] = {"mean": float(st["mean"]), "std": float(st["std"])}
    missing = fr.get("missing", 0.0)
    if not _num(missing) or missing != missing or abs(missing) == float("inf"):
        fail(f"{where}: missing must be a finite number (what no value is fed as), got {missing!r}")
    params["missing"] = float(missing)
    return FieldSpec(name=name, scope=scope, op="numeric", rows=0, pooling="none", input=inp, params=params)

"""TensorFlow Serving's predict body (``{"instances": [...]}`` rows, or ``{"inputs": {...}}`` columns) as one score
request: the request and its candidates.

Each instance is one candidate's raw features, and may carry the request-scope inputs too (TF Serving
users send whole rows). The inputs the model reads only at request scope are taken out of the instances:
each has one value for the whole request, so it must be the same in every instance, be sent by all of
them unless ``context`` (the body's field for the shared request features) gives it (a row without it
would be a row with no value), and agree with ``context``. A conflict is a 422 naming the input and the
two places. The other keys of an instance stay in its candidate (the score path ignores those the model
does not read). Columns (``inputs``) are read as KServe's tensors are (``offgraph.server.api.tensor_inputs``), and
follow the same rule column by column (``split_columns``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from offgraph.server.api.schemas import Features, FeatureValue, ScoreRequest
from offgraph.server.api.score_body import JsonBody
from offgraph.server.api.tensor_inputs import Column
from offgraph.server.http.errors import ApiError

INSTANCES_DOC = (
    "One object per candidate, scored in this order: its raw features by input name (`GET /v1/models/{name}` "
    "lists them under `inputs`), and, if you like, the request-scope ones too (whole rows): a request-scope "
    "input must then have the same value in every instance. At least one, at most the server's --max-candidates."
)
CONTEXT_DOC = (
    "Request-scope raw features shared by every instance (the user, the context), sent once. An input given "
    "here and in the instances must have the same value in both."
)


_SCORE: dict[str, Any] = cast(dict, ScoreRequest.model_config["json_schema_extra"])["examples"][0]  # one example


INPUTS_DOC = (
    "TensorFlow Serving's columnar format, instead of `instances`: one list per input name, holding that input's "
    'value for each candidate in order (a value list is one item: `[["Drama"], ["Comedy", "Drama"]]`). '
    "Every list has the same length (the candidates, at most --max-candidates), except a request-scope input, "
    "which may be a list of one value (given once). Names are the model's inputs (`GET /v1/models/{name}/metadata`); "
    'another name is a 422. The answer is `{"outputs": [...]}`.'
)


class PredictRequest(BaseModel):
    """TensorFlow Serving's predict body: the row format (`instances`, and the request features they share in
    `context`) or the columnar format (`inputs`), one of the two."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"context": _SCORE["request"], "instances": _SCORE["candidates"]}],
            "oneOf": [{"required": ["instances"]}, {"required": ["inputs"]}],  # the row or the columnar format
        },
    )

    instances: list[Features] | None = Field(default=None, min_length=1, description=INSTANCES_DOC)
    inputs: dict[str, list[FeatureValue]] | None = Field(default=None, min_length=1, description=INPUTS_DOC)
    context: Features = Field(default_factory=dict, description=CONTEXT_DOC)
    signature_name: Literal["serving_default"] | None = Field(
        default=None, description="TensorFlow Serving's signature: `serving_default` (the only one), or omitted."
    )

    @model_validator(mode="before")
    @classmethod
    def _named_columns_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("inputs"), list):
            raise ValueError(
                "'inputs' is a list: TensorFlow Serving's unnamed columnar form is not taken, name each input "
                '(\'{"inputs": {"movie_id": [242, 302]}}\')'
            )
        return data

    @model_validator(mode="after")
    def _one_format(self) -> PredictRequest:
        if (self.instances is None) == (self.inputs is None):
            raise ValueError("send either 'instances' (the row format) or 'inputs' (the columnar format), one of them")
        if self.inputs is not None and self.context:
            raise ValueError(
                "'context' goes with 'instances': in the columnar format a request-scope input is a list of one value"
            )
        return self


class PredictBody(JsonBody):
    """``parse(request)`` -> ``PredictRequest`` with at most ``max_candidates`` instances (or values per input)."""

    def __init__(self, max_candidates: int):
        model = create_model(
            "PredictRequest",
            __base__=PredictRequest,
            __doc__=PredictRequest.__doc__,
            instances=(
                list[Features] | None,
                Field(default=None, min_length=1, max_length=max_candidates, description=INSTANCES_DOC),
            ),
            inputs=(
                dict[str, Annotated[list[FeatureValue], Field(min_length=1, max_length=max_candidates)]] | None,
                Field(default=None, min_length=1, description=INPUTS_DOC),
            ),
        )
        super().__init__(model, "predict body")


def _same(a: Any, b: Any) -> bool:
    """JSON values equal in type and value (1, 1.0 and true are three different feature values)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _show(v: Any, limit: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."


_ONCE = {
    "instances": "send it once in 'context', or the same in every instance",
    "candidates": "send it once (shape [1]; in the columnar format a list of one value), or the same value for "
    "every candidate",
}
"""How to send a request-scope input right, by what the rows are called: the row format's instances, or the
candidates that named tensors' elements stand for (``offgraph.server.api.tensor_inputs``)."""


def _conflict(
    key: str,
    where: str,
    value: Any,
    other: str,
    other_value: Any = None,
    missing: bool = False,
    rows: str = "instances",
) -> ApiError:
    said = "does not send it" if missing else f"has {_show(other_value)}"
    return ApiError(
        422,
        f"request-scope input '{key}' has one value per request, but {where} has {_show(value)} and {other} {said}: "
        + _ONCE[rows],
    )


def split_instances(
    instances: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    request_only: Collection[str],
    item_only: Collection[str],
    rows: str = "instances",
) -> tuple[dict[str, Any], list[Mapping[str, Any]]]:
    """(request, candidates) of a predict body, for a model reading ``request_only`` inputs at request scope
    only and ``item_only`` at item scope only; an ``ApiError`` 422 names a conflict, calling the instances
    ``rows`` (``instances``, or ``candidates``: the elements of named tensors)."""
    for key in context:
        if key in item_only:
            raise ApiError(422, f"input '{key}' in 'context' is an item-scope input: send it in each instance instead")
    request = dict(context)
    keys = set().union(*instances).intersection(request_only)  # one C-level pass over the instances' keys
    if not keys:
        return request, list(instances)
    for key in sorted(keys):
        if key in context:
            where, value = "'context'", context[key]
        else:
            first = next(i for i, inst in enumerate(instances) if key in inst)
            where, value = f"{rows}[{first}]", instances[first][key]
        for i, inst in enumerate(instances):
            if key not in inst:
                if key not in context:
                    raise _conflict(key, where, value, f"{rows}[{i}]", missing=True, rows=rows)
            elif not _same(inst[key], value):
                raise _conflict(key, where, value, f"{rows}[{i}]", inst[key], rows=rows)
        request[key] = value
    return request, [{k: v for k, v in inst.items() if k not in keys} for inst in instances]


def _uniform(c: Column) -> bool:
    """Whether every element of ``c`` is the same, type and value (``_same``): C-level passes where the elements are
    not lists (lists of JSON may hold 1 and 1.0: compared one by one)."""
    e = c.elements
    first = e[0]
    if type(first) is list:
        return all(_same(x, first) for x in e)
    return e.count(first) == len(e) and len(set(map(type, e))) == 1


def split_columns(
    columns: Mapping[str, Column],
    once: Mapping[str, Any],
    request_only: Collection[str],
    item_only: Collection[str],
) -> tuple[dict[str, Any], dict[str, Column]]:
    """(request, the candidates' columns) of named columns (one element per candidate) and the request features given
    once, for a model reading ``request_only`` inputs at request scope only and ``item_only`` at item scope only:
    ``split_instances``' rule, column by column (a request-scope input sent per candidate has one value in all), and
    its words for a conflict (the candidates named ``candidates[i]``)."""
    for key in once:
        if key in item_only:
            raise ApiError(422, f"input '{key}' is given once but is an item-scope input: send one per candidate")
    request = dict(once)
    out = dict(columns)
    for key in sorted(columns.keys() & request_only):
        c = out.pop(key)
        first = c.value(0)
        if not _uniform(c):
            i = next((i for i in range(1, len(c)) if not _same(c.value(i), first)), None)
            if i is not None:
                raise _conflict(key, "candidates[0]", first, f"candidates[{i}]", c.value(i), rows="candidates")
        request[key] = first
    return request, out

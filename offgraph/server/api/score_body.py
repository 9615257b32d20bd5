"""JSON request bodies: the content type is checked (415) and the documented pydantic model decides.

``JsonBody(model)`` parses a body with a pydantic model inside a dependency, so that a route
decides when the body is read: an admin route authenticates first, and a malformed body never
answers before the 401. Every problem is a 422 naming it (invalid JSON and undecodable bytes
included), or a 415 for a Content-Type that is not JSON; no Content-Type is read as JSON. Every body
is checked for its nesting first (``JsonBody.check_depth``: deeper than ``body_limit.MAX_JSON_DEPTH`` is
a 422 naming the limit), so no decoder below ever recurses deeper; every route that reads a JSON body
reads it with ``JsonBody.parse``.

Score bodies (``ScoreBodyParser``): the pydantic ``ScoreRequest`` (with the app's --max-candidates) is THE
description of the body: OpenAPI publishes it and it words every 422. Validating a body with it costs several
times what a msgspec decoder of the same shape does (JSON parsing included; bench/results/serve-latency/README.md),
on the one core a Python server has, so a body is first decoded by one msgspec struct derived from the model's
field list (``score_struct``): the request, version and label decoded and checked, each candidate left as its
JSON bytes (``msgspec.Raw``: checked as JSON, not decoded) for the scorer's candidate cache
(``offgraph.scoring.raw_candidates``, ``offgraph.scoring.candidate_cache``). The scorer decodes the candidates
its cache does not hold in one call (``CANDIDATES``, the model's ``Features`` in msgspec). A body or a candidate
msgspec refuses is validated by the pydantic model, which then decides: it either raises the 422 that names each
problem or (where the two would disagree) accepts the body. The msgspec decoders are stricter only where that
is cheap to leave to the model: integers beyond 64 bits (the model takes any integer that fits a float64) and
integral floats as versions. ``tests/server/test_score_body.py`` checks that both accept and refuse the same bodies.
"""

from __future__ import annotations

from email.message import Message
from typing import Annotated, Any, Union

import msgspec
from fastapi import Request
from pydantic import BaseModel, ValidationError

from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.server.http.body_limit import MAX_JSON_DEPTH, json_too_deep
from offgraph.server.http.errors import ApiError, BodyValidationError
from offgraph.server.models.control import LABEL_PATTERN

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Scalar = Union[str, Int64, float, bool, None]
Value = Union[Scalar, list[Scalar]]


CANDIDATES = msgspec.json.Decoder(list[dict[str, Value]])
"""A list of candidates (the model's ``list[Features]``), decoded; what the scorer decodes a body's candidates with."""


def score_struct(model: type[BaseModel], max_candidates: int) -> type[msgspec.Struct]:
    """The msgspec struct of ``model``'s fields (``ScoreRequest``'s, in its order, with its defaults) with each
    candidate as its JSON bytes and at most ``max_candidates`` of them. A field the model gains without a type
    here is an error at start-up, not a body decoded without it."""
    types: dict[str, Any] = {
        "candidates": Annotated[list[msgspec.Raw], msgspec.Meta(min_length=1, max_length=max_candidates)],
        "request": dict[str, Value],
        "version": Union[Annotated[int, msgspec.Meta(ge=0)], None],
        "label": Union[Annotated[str, msgspec.Meta(pattern=LABEL_PATTERN)], None],
    }
    fields: list[Any] = []
    for name, f in model.model_fields.items():
        if f.is_required():
            fields.append((name, types[name]))
        elif f.default_factory is not None:
            fields.append((name, types[name], msgspec.field(default_factory=f.default_factory)))  # type: ignore[arg-type]
        else:
            fields.append((name, types[name], f.default))
    return msgspec.defstruct("ScoreBody", fields, kw_only=True, forbid_unknown_fields=True)


def check_json_content_type(request: Request) -> None:
    """415 unless the Content-Type is absent, application/json or application/*+json."""
    value = request.headers.get("content-type")
    if not value:
        return
    msg = Message()
    msg["content-type"] = value
    subtype = msg.get_content_subtype()
    if msg.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json")):
        return
    raise ApiError(415, f"Content-Type {msg.get_content_type()!r} is not supported: send the body as application/json")


class JsonBody:
    """``await parse(request) -> model instance``: 415 for a non-JSON Content-Type, 422 for any other problem.

    An empty body is read as ``{}`` (a model without required keys then takes it, and the OpenAPI
    ``requestBody`` says it is optional). ``what`` names the body in its 422s ("load body").
    """

    def __init__(self, model: type[BaseModel], what: str):
        self.model, self.what = model, what

    async def parse(self, request: Request) -> Any:
        check_json_content_type(request)
        raw = await request.body()
        self.check_depth(raw)
        return self.validate(raw)

    def check_depth(self, raw: bytes) -> None:
        """A 422 for a body nested deeper than ``MAX_JSON_DEPTH`` (``body_limit.json_too_deep``), before any
        decoder sees it: they recurse once per level, and one past Python's recursion limit is an internal error."""
        at = json_too_deep(raw)
        if at is not None:
            msg = f"JSON nested deeper than {MAX_JSON_DEPTH} levels (arrays and objects) at byte {at}"
            raise BodyValidationError(
                [{"type": "json_too_deep", "loc": ("body",), "msg": msg, "ctx": {"limit": MAX_JSON_DEPTH}}],
                self.what,
                [f.alias or k for k, f in self.model.model_fields.items()],
            )

    def validate(self, raw: bytes) -> Any:
        try:  # an empty body is a missing one (as FastAPI words it): every required key is missing
            return self.model.model_validate_json(raw if raw.strip() else b"{}")
        except ValidationError as e:
            raise BodyValidationError(
                [{**err, "loc": ("body", *err["loc"])} for err in e.errors()],
                self.what,
                [f.alias or k for k, f in self.model.model_fields.items()],
            ) from None

    def openapi_extra(self, inline: bool = False) -> dict:
        """The path operation's ``requestBody``: the pydantic model's JSON schema. Its nested models are referred
        to in the app's components, where a response or another body registers them; ``inline``: written out in
        place instead (a body whose nested models nothing else registers: a reference to a component that does
        not exist breaks the docs)."""
        required = any(f.is_required() for f in self.model.model_fields.values())
        if inline:
            schema = self.model.model_json_schema(ref_template="#/$defs/{model}")
            schema = _inlined(schema, schema.pop("$defs", {}))
        else:
            schema = self.model.model_json_schema(ref_template="#/components/schemas/{model}")
        return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def _inlined(schema: Any, defs: dict) -> Any:
    """``schema`` with each ``{"$ref": "#/$defs/X"}`` replaced by ``defs["X"]`` (the bodies' models nest, never
    recursively)."""
    if isinstance(schema, list):
        return [_inlined(x, defs) for x in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _inlined({**defs[ref.removeprefix("#/$defs/")], **rest}, defs)
    return {k: _inlined(v, defs) for k, v in schema.items()}


class ScoreBodyParser(JsonBody):
    """``parse(request)`` / ``validate(raw)`` -> body with ``.request``, ``.version``, ``.label`` and
    ``.candidates``: always ``RawCandidates``, each candidate's bytes as sent where msgspec took the body (the
    scorer decodes those its candidate cache lacks, and a candidate that decoder refuses makes it validate the
    whole body with the model, in the scoring thread: the same 422, or the body accepted), the model's decoded
    candidates where the model took the body msgspec refused."""

    def __init__(self, model: type[BaseModel], max_candidates: int):
        super().__init__(model, "score body")
        self._struct = score_struct(model, max_candidates)
        self._decoder = msgspec.json.Decoder(self._struct)

    def validate(self, raw: bytes) -> Any:
        try:
            body: Any = self._decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            m = super().validate(raw)  # the model's 422, or the model takes what msgspec refused
            return self._struct(
                candidates=RawCandidates.decoded(m.candidates), request=m.request, version=m.version, label=m.label
            )
        whole = super().validate
        body.candidates = RawCandidates(
            list(map(bytes, body.candidates)), CANDIDATES.decode, lambda: whole(raw).candidates
        )
        return body

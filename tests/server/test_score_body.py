"""The score body's fast decoders (msgspec: the body's struct, derived from the documented pydantic model's fields,
then the candidates' list) accept what the documented pydantic model accepts, refuse what it refuses, and leave the
rest (integers beyond 64 bits, integral floats as versions) to the model."""

import json
import sys

import pytest
from pydantic import Field, ValidationError, create_model

from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.server.api.schemas import Features, ScoreRequest
from offgraph.server.api.score_body import CANDIDATES, ScoreBodyParser, score_struct

MAX = 3
Body = create_model(
    "ScoreRequest", __base__=ScoreRequest, candidates=(list[Features], Field(min_length=1, max_length=MAX))
)

GOOD = [
    b'{"candidates": [{}]}',
    b'{"request": {"u": 1, "g": "F", "b": true, "x": null, "f": 0.5, "l": [1, "a", 2.5, false, null]},'
    b' "candidates": [{"m": 3, "genres": ["a", "b"]}, {"m": -4, "genres": []}], "version": 7}',
    b'{"candidates": [{"m": 1}], "version": null}',
    b'{"candidates": [{"m": 1e300, "n": -0.0, "big": 9223372036854775807}], "request": {}}',
    b'{"candidates": [{"m": 1}, {"m": 2}, {"m": 3}]}',
    b'{"candidates": [{"\\u00e9t\\u00e9": "\\ud83d\\ude00"}]}',
    b' {"candidates" : [ {"m" : "1"} ] } ',
    b'{"candidates": [{}], "candidates": [{"a": 1, "a": 2}], "version": 1, "version": 2}',  # the last one wins
    b'{"candidates": [{"m": -9223372036854775808, "n": 9223372036854775807}]}',
]
# valid bodies the fast decoder leaves to the model (integers beyond 64 bits, integral floats as versions)
MODEL_ONLY = [
    b'{"candidates": [{"m": 123456789012345678901234567890}], "version": 123456789012345678901234567890}',
    b'{"candidates": [{"m": -9223372036854775809, "l": [18446744073709551616]}]}',
    b'{"candidates": [{"m": %d, "n": -%d}]}' % (int(sys.float_info.max), int(sys.float_info.max)),  # float64's max
    b'{"candidates": [{"m": 1}], "version": 2.0}',
]
BAD = [
    b"",
    b"null",
    b"[]",
    b"[1, 2]",
    b"{}",
    b'{"request": {}}',
    b'{"candidates": []}',
    b'{"candidates": [{}, {}, {}, {}]}',  # more than MAX
    b'{"candidates": [{"m": NaN}]}',
    b'{"candidates": [{"m": Infinity}]}',
    b'{"candidates": [{"m": 1e999}]}',
    b'{"candidates": [{"m": {"x": 1}}]}',
    b'{"candidates": [{"m": [[1]]}]}',
    b'{"candidates": [{"m": [{}]}]}',
    b'{"candidates": {"m": 1}}',
    b'{"candidates": [1]}',
    b'{"candidates": [{"m": 1}], "request": [1]}',
    b'{"candidates": [{"m": 1}], "extra": 1}',
    b'{"candidates": [{"m": 1}], "version": -1}',
    b'{"candidates": [{"m": 1}], "version": "2"}',
    b'{"candidates": [{"m": 1}], "version": true}',
    b'{"candidates": [{"m": 1}], "version": 1.5}',
    b'{"candidates": [{"m": 1}]',
    b'{"candidates": [{"m": 1,}]}',
    b'{"candidates": [{"m": 1}]} x',
    b"\xff\xfe",
    b'{"candidates": [{"m": "\\ud800"}]}',
    b'{"candidates": [{"m": 1' + b"0" * 400 + b"}]}",
    b'{"candidates": [{"m": [1, -1' + b"0" * 400 + b"]}]}",
    b'{"candidates": [{"m": 1' + b"0" * 5000 + b"}]}",
    b'{"candidates": [{"m": 1}], "version": 2.5}',
]


def _pydantic(raw: bytes):
    try:
        return Body.model_validate_json(raw if raw.strip() else b"{}")
    except ValidationError:
        return None


def _fast(raw: bytes):
    import msgspec

    try:
        body = msgspec.json.decode(raw, type=score_struct(Body, MAX))
        body.candidates = CANDIDATES.decode(b"[" + b",".join(body.candidates) + b"]")
        return body
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _as_dict(b) -> dict:
    return {"request": b.request, "candidates": list(b.candidates), "version": b.version}


@pytest.mark.parametrize("raw", GOOD)
def test_valid_bodies_decode_the_same_both_ways(raw):
    slow, fast = _pydantic(raw), _fast(raw)
    assert slow is not None and fast is not None, raw
    assert _as_dict(fast) == _as_dict(slow) == {"request": {}, "version": None, **json.loads(raw)}
    # types too (1 stays an int, 1.0 a float, True a bool)
    assert repr(_as_dict(fast)) == repr(_as_dict(slow))


@pytest.mark.parametrize("raw", MODEL_ONLY)
def test_the_model_accepts_what_the_fast_decoder_leaves_to_it(raw):
    assert _fast(raw) is None and _pydantic(raw) is not None, raw
    body = ScoreBodyParser(Body, MAX).validate(raw)
    want = {"request": {}, "version": None, **json.loads(raw)}
    want["version"] = None if want["version"] is None else int(want["version"])
    assert _as_dict(body) == want and type(body.version) is type(want["version"])


@pytest.mark.parametrize("raw", BAD)
def test_invalid_bodies_are_refused_both_ways_with_the_documented_message(raw):
    from fastapi.exceptions import RequestValidationError

    assert _fast(raw) is None and _pydantic(raw) is None, raw
    with pytest.raises(RequestValidationError) as e:  # at parse time, or once its candidates are decoded
        _parsed(raw)
    errs = e.value.errors()
    assert errs and all(err["loc"][0] == "body" and err["msg"] for err in errs), errs


def test_the_documented_model_decides_when_the_fast_decoder_refuses():
    # a fast decoder stricter than the model (1 candidate vs MAX): the model's answer stands
    raw = b'{"candidates": [{"m": 1}, {"m": 2}]}'
    body = ScoreBodyParser(Body, max_candidates=1).validate(raw)
    assert list(body.candidates) == [{"m": 1}, {"m": 2}] and body.candidates.raws is None


def test_openapi_documents_the_pydantic_schema():
    schema = ScoreBodyParser(Body, MAX).openapi_extra()["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["candidates"]["maxItems"] == MAX
    assert schema["required"] == ["candidates"] and schema["additionalProperties"] is False


def _parsed(raw: bytes) -> dict:
    """What the score route's parser gives, its candidates decoded as the scorer decodes them: in one call where
    the candidate decoder takes them all, else the whole body validated (which may raise the 422)."""
    body = ScoreBodyParser(Body, MAX).validate(raw)
    assert isinstance(body.candidates, RawCandidates)
    return {"request": body.request, "candidates": list(body.candidates), "version": body.version}


@pytest.mark.parametrize("raw", GOOD + MODEL_ONLY)
def test_the_route_parser_gives_the_models_bodies_with_candidates_as_sent(raw):
    want = _as_dict(_pydantic(raw))
    assert repr(_parsed(raw)) == repr(want), raw  # types too
    body = ScoreBodyParser(Body, MAX).validate(raw)
    if body.candidates.raws is not None:  # each candidate's bytes, exactly as sent
        assert all(r.strip()[:1] == b"{" and r in raw for r in body.candidates.raws)
        part = body.candidates.decode([len(body.candidates) - 1])  # a part, as the scorer decodes its misses
        assert repr(part) == repr(want["candidates"][-1:])


@pytest.mark.parametrize("raw", BAD)
def test_the_route_parser_refuses_the_same_bodies_with_the_models_422(raw):
    from fastapi.exceptions import RequestValidationError

    from offgraph.server.api.score_body import JsonBody

    with pytest.raises(RequestValidationError) as want:
        JsonBody(Body, "score body").validate(raw)
    with pytest.raises(RequestValidationError) as got:  # at parse time, or once its candidates are decoded
        _parsed(raw)
    assert repr(got.value.errors()) == repr(want.value.errors())  # repr: a NaN input is not equal to itself


def test_the_body_struct_has_the_models_fields():
    assert list(score_struct(Body, MAX).__struct_fields__) == list(Body.model_fields)

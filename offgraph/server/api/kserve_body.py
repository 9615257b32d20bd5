"""KServe v2's inference request over REST, with its binary tensor extension, as named tensors.

A body is the JSON ``InferRequest`` (``anchor_schemas``), or, with an ``Inference-Header-Content-Length: L`` header
(what ``tritonclient.http`` sends by default), L bytes of that JSON followed by the inputs' binary data: each
input with ``parameters.binary_data_size`` takes that many bytes, in input order, and together they take every
byte after the JSON. A header that is not a length within the body, sizes that do not add up to the binary part,
or an input with both ``data`` and binary data are refused naming the problem (and the input); what the elements
mean is ``offgraph.server.api.tensor_inputs``'s to check. Like every JSON body, the JSON part is checked for its
nesting first and refused by the documented model with a 422 naming each problem (the route answers 400).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from offgraph.server.api.anchor_schemas import InferRequest
from offgraph.server.api.score_body import JsonBody, check_json_content_type
from offgraph.server.api.tensor_inputs import Tensor
from offgraph.server.http.errors import ApiError
from offgraph.server.models.control import LABEL, LABEL_RULE

HEADER_LENGTH = "inference-header-content-length"
"""The binary tensor extension's header: how many bytes of the body are its JSON."""


@dataclass(frozen=True)
class Inference:
    """A parsed inference request: its tensors, the label it asks for, whether the scores go back as binary data,
    and the ``id`` to echo."""

    tensors: list[Tensor]
    label: str | None
    binary_output: bool
    id: str | None


def _bad(message: str) -> ApiError:
    return ApiError(422, message)


def _label(body: InferRequest) -> str | None:
    label = (body.parameters or {}).get("label")
    if label is None:
        return None
    if type(label) is not str or not LABEL.fullmatch(label):
        raise _bad(f"parameters.label {str(label)[:40]!r} is not a label: {LABEL_RULE}")
    return label


def _binary_output(body: InferRequest) -> bool:
    """Whether the scores go back as binary data: the output's own ``binary_data`` if the request names it with
    one, else the request's ``binary_data_output`` (the protocol's default: JSON)."""
    default = (body.parameters or {}).get("binary_data_output") is True
    for o in body.outputs or ():
        if "binary_data" in (o.parameters or {}):
            return (o.parameters or {})["binary_data"] is True
    return default


class InferBody(JsonBody):
    """``await parse(request) -> Inference``."""

    def __init__(self) -> None:
        super().__init__(InferRequest, "inference request")

    async def parse(self, request: Request) -> Inference:  # type: ignore[override]
        raw = await request.body()
        header = request.headers.get(HEADER_LENGTH)
        if header is None:
            check_json_content_type(request)
            json_part, binary = raw, b""
        else:  # the binary extension: the body's Content-Type is the binary data's, not JSON's
            if not header.strip().isdigit() or not 0 < int(header) <= len(raw):
                raise _bad(
                    f"Inference-Header-Content-Length {header[:40]!r} is not the length of the body's JSON part: "
                    f"a number of bytes from 1 to the body's {len(raw)}"
                )
            json_part, binary = raw[: int(header)], raw[int(header) :]
        self.check_depth(json_part)
        body: InferRequest = self.validate(json_part)
        return Inference(self._tensors(body, binary), _label(body), _binary_output(body), body.id)

    def _tensors(self, body: InferRequest, binary: bytes) -> list[Tensor]:
        out, at = [], 0
        for t in body.inputs:
            size = (t.parameters or {}).get("binary_data_size")
            if size is None:
                if t.data is None:
                    raise _bad(f"input '{t.name[:60]}' has no data: give 'data', or 'parameters.binary_data_size'")
                out.append(Tensor(t.name, t.datatype, t.shape, data=t.data))
                continue
            if type(size) is not int or size < 0:
                raise _bad(f"input '{t.name[:60]}': parameters.binary_data_size {size!r} is not a number of bytes")
            if t.data is not None:
                raise _bad(f"input '{t.name[:60]}' has both 'data' and binary data: one of the two")
            if at + size > len(binary):
                raise _bad(
                    f"input '{t.name[:60]}' takes {size} bytes of binary data from byte {at}, but the body has "
                    f"{len(binary)} after its JSON (Inference-Header-Content-Length)"
                )
            out.append(Tensor(t.name, t.datatype, t.shape, raw=binary[at : at + size]))
            at += size
        if at != len(binary):
            raise _bad(
                f"the body has {len(binary)} bytes of binary data after its JSON, but the inputs' binary_data_size "
                f"add up to {at}"
            )
        return out

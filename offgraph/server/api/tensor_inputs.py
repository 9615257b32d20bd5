"""Named tensors as rows of raw features: KServe v2 inputs (REST, its binary tensor extension, gRPC's typed contents
and ``raw_input_contents``) and TensorFlow Serving's columnar format (``{"inputs": {...}}``).

Each protocol decodes its own wire form into ``Tensor`` s (or, columnar JSON, straight into columns); this module
turns them into ``Column`` s, one element per candidate, which ``predict_scoring.score_columns`` scores by the
``:score`` path (``tfserving_body.split_columns`` decides the request scope, ``Scorer.score_joined`` everything else,
each candidate keyed in the candidate cache by its elements, its dict made only where the cache lacks it): one
conversion for every named-tensor protocol, no per-candidate dicts, no second copy of the request maths or checks.

The conventions (offgraph/server/README.md, "Named tensors: one conversion"):

- an input is one of the model's raw inputs, by the name the metadata lists; any other name is refused;
- one element per candidate: shape ``[N]`` or ``[N, 1]``, the same N for every input; a request-scope input may
  instead be given once (``[1]``). Given N times, its elements must all be equal (the row format's rule);
- a list of values per candidate (an input whose metadata shape ends in -1: ``id`` and ``tokenize`` inputs): shape
  ``[N, K]``, K values per candidate, padded with no value (``""``, NaN) where a candidate has fewer (the padding
  is dropped: the list is what the candidate has); ``[1, K]`` for a request-scope list given once;
- a number input (metadata ``FP64``) takes any integer or floating datatype; NaN is *no value*;
- any other input (strings, ids: metadata ``BYTES``) takes ``BYTES`` (UTF-8 text; ``""`` is no value), an integer
  datatype or ``BOOL`` (an id hashes as its decimal text: 196 and "196" are one id), or a floating one.

Every problem is an ``ApiError`` 422 naming the input (the score path's status for a bad body; KServe's REST route
answers it 400, gRPC ``INVALID_ARGUMENT``); the score path's own errors keep their words.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from offgraph.server.api.model_inputs import InputInfo
from offgraph.server.http.errors import ApiError

NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "?",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
"""KServe v2 datatypes of fixed size and their raw (little-endian) layout."""

DATATYPES = (*NUMPY_DTYPES, "BYTES")
INTEGERS = frozenset(d for d in NUMPY_DTYPES if "INT" in d)
FLOATS = frozenset({"FP16", "FP32", "FP64"})
NUMBERS = INTEGERS | FLOATS

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Tensor:
    """One named input as sent: ``data`` its elements (flat, or nested as JSON may send them), or ``raw`` its bytes
    (fixed-size elements little-endian, ``BYTES`` elements each a 4-byte little-endian length and the bytes)."""

    name: str
    datatype: str
    shape: Sequence[int]
    data: Sequence[Any] | None = None
    raw: bytes | None = None


def bad_input(message: str) -> ApiError:
    """A tensor's problem: the score path's status for a bad body (KServe's REST route answers it 400, gRPC
    INVALID_ARGUMENT)."""
    return ApiError(422, message)


def metadata_datatype(info: InputInfo) -> str:
    """The datatype the model metadata gives an input (the one clients are told to send)."""
    return "FP64" if info.number else "BYTES"


def dims(t: Tensor, info: InputInfo, max_candidates: int) -> tuple[int, int | None]:
    """(candidates N, values per candidate K, or None for one value each) of the tensor's shape."""
    shape = list(t.shape)
    if not all(type(d) is int and d >= 0 for d in shape):
        raise bad_input(f"input '{t.name}' has shape {shape}: dimensions are non-negative integers")
    lists = " or [N, K] (K values per candidate)" if info.takes_list else ""
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1 and not info.takes_list):
        raise bad_input(
            f"input '{t.name}' has shape {shape}: send one element per candidate, shape [N] or [N, 1]{lists}"
        )
    if shape[0] == 0:
        raise bad_input(f"input '{t.name}' has shape {shape}: no candidates (at least one)")
    if shape[0] > max_candidates:
        raise bad_input(
            f"input '{t.name}' has {shape[0]} candidates, at most {max_candidates} per request (--max-candidates)"
        )
    return shape[0], (shape[1] if len(shape) == 2 and shape[1] != 1 else None)


def _flat(data: Sequence[Any]) -> list[Any]:
    """JSON ``data`` flattened in row-major order (KServe lets clients send it nested)."""
    if list not in set(map(type, data)):  # one C-level pass: flat, as sent
        return list(data)
    out: list[Any] = []
    for x in data:
        out.extend(_flat(x) if type(x) is list else [x])
    return out


def _raw_bytes_elements(t: Tensor, raw: bytes, count: int) -> list[bytes]:
    """The ``count`` elements of raw BYTES data: one walk over the lengths (each element's place depends on the
    lengths before it), the checks done once after it where they can be."""
    out: list[bytes] = []
    append, unpack, end, at = out.append, _LENGTH.unpack_from, len(raw), 0
    try:
        for _ in range(count):
            (n,) = unpack(raw, at)
            at += 4
            append(raw[at : at + n])
            at += n
    except struct.error:  # fewer than 4 bytes left: the data ended inside a length, or held fewer elements
        if at < end:
            raise bad_input(
                f"input '{t.name}': raw BYTES data ends inside an element's 4-byte length (at byte {at})"
            ) from None
    if at > end:  # the last element read ran past the end (a slice stops at the end: its length says more)
        i = len(out) - 1
        raise bad_input(
            f"input '{t.name}': raw BYTES element {i} is {at - end + len(out[i])} bytes long, past the data's end"
        )
    if len(out) == count and at < end:  # more data: as the element after the last would be read
        if at + 4 > end:
            raise bad_input(f"input '{t.name}': raw BYTES data ends inside an element's 4-byte length (at byte {at})")
        (n,) = unpack(raw, at)
        if at + 4 + n > end:
            raise bad_input(f"input '{t.name}': raw BYTES element {count} is {n} bytes long, past the data's end")
    if len(out) != count or at != end:
        raise bad_input(
            f"input '{t.name}' has shape {list(t.shape)} ({count} elements) but its raw data holds more or fewer"
        )
    return out


def _elements(t: Tensor, count: int) -> list[Any]:
    """The tensor's ``count`` elements as Python values, checked against its datatype."""
    if t.raw is not None:
        if t.datatype == "BYTES":
            return _raw_bytes_elements(t, t.raw, count)
        dtype = np.dtype(NUMPY_DTYPES[t.datatype])
        if len(t.raw) != count * dtype.itemsize:
            raise bad_input(
                f"input '{t.name}' has {len(t.raw)} bytes of raw data, but shape {list(t.shape)} of {t.datatype} "
                f"takes {count * dtype.itemsize}"
            )
        return _numbers(np.frombuffer(t.raw, dtype))
    elements = _flat(t.data or ())
    if len(elements) != count:
        raise bad_input(
            f"input '{t.name}' has {len(elements)} elements in its data, but its shape {list(t.shape)} says {count}"
        )
    want: tuple[type, ...]
    if t.datatype == "BYTES":
        want, what = (str, bytes), "strings"
    elif t.datatype == "BOOL":
        want, what = (bool,), "booleans"
    elif t.datatype in INTEGERS:
        want, what = (int,), "integers"
    else:
        want, what = (int, float), "numbers"
    if not set(map(type, elements)) <= set(want):  # one pass in C; the loop only to name the first wrong element
        for i, x in enumerate(elements):
            if type(x) not in want:
                raise bad_input(f"input '{t.name}' element {i} is {_show(x)}: {t.datatype} data are {what}")
    return elements


def _numbers(a: np.ndarray) -> list[Any]:
    """A numeric column as Python values, NaN as None (no value): whole-column numpy, no per-element Python."""
    if a.dtype.kind == "f" and np.isnan(a).any():
        out = a.astype(object)  # Python floats, as tolist gives
        out[np.isnan(a)] = None
        return out.tolist()
    return a.tolist()


def _show(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _text(t: Tensor, i: int, x: str | bytes) -> str:
    if type(x) is str:
        return x
    try:
        return x.decode("utf-8")  # type: ignore[union-attr]
    except UnicodeDecodeError:
        raise bad_input(f"input '{t.name}' element {i} is not UTF-8 text") from None


def _no_nan(x: Any) -> Any:
    return None if type(x) is float and math.isnan(x) else x


def _texts(t: Tensor, elements: list[Any]) -> list[str]:
    """BYTES elements as text: the column decoded in one C-level pass (the loop only to name a bad element)."""
    kinds = set(map(type, elements))
    if kinds <= {str}:
        return elements
    if kinds == {bytes}:
        # decoded as one text, split at NULs put between the elements: a NUL is one byte in UTF-8 and never part of
        # another character, so the text decodes exactly when each element does; an element holding a NUL itself
        # splits in two (more parts than elements): decoded one by one then
        try:
            parts = b"\0".join(elements).decode("utf-8").split("\0")
        except UnicodeDecodeError:
            parts = None
        if parts is not None and len(parts) == len(elements):
            return parts
        if parts is not None:
            return list(map(bytes.decode, elements))
    return [_text(t, i, x) for i, x in enumerate(elements)]


def _no_nans(elements: list[Any]) -> list[Any]:
    """NaN as None (no value) over a column; the column itself where it holds no float."""
    return [_no_nan(x) for x in elements] if float in set(map(type, elements)) else elements


@dataclass(frozen=True)
class Column:
    """One input's elements as sent, one per candidate (or one: a request-scope input given once): each a value, or,
    for a list input sent as ``[N, K]`` (``padded``), the tuple of its K elements, padding included (the candidate
    cache's key is the candidate as sent: ``RawCandidates.columns``). ``value(i)`` is candidate i's raw feature value,
    as FG reads it (the padding dropped: the list is what the candidate has)."""

    name: str
    elements: list[Any]
    padded: bool = False

    def __len__(self) -> int:
        return len(self.elements)

    def value(self, i: int) -> Any:
        x = self.elements[i]
        # the padding is no value: "" (text) or None (NaN numbers); 0 and False are values
        return [v for v in x if v is not None and v != ""] if self.padded else x


def check_datatype(t: Tensor) -> None:
    if t.datatype not in DATATYPES:
        raise bad_input(f"input '{t.name}' has datatype {t.datatype!r}: one of {', '.join(DATATYPES)}")


def check_number(t: Tensor, info: InputInfo) -> None:
    if info.number and t.datatype not in NUMBERS:
        raise bad_input(f"input '{t.name}' is a number: send it as FP64, FP32 or an integer datatype, not {t.datatype}")


def column(t: Tensor, info: InputInfo, max_candidates: int) -> Column:
    """The raw feature values of ``t`` (one per candidate), for the model input ``info`` it names."""
    check_datatype(t)
    n, k = dims(t, info, max_candidates)
    elements = _elements(t, n * (1 if k is None else k))
    check_number(t, info)
    if info.number:
        values = _no_nans(elements)
    elif t.datatype == "BYTES":
        values = _texts(t, elements)
    else:
        values = _no_nans(elements)
    if k is None:
        return Column(t.name, values)
    # K values per candidate, as tuples in one C-level pass (a list is never cut or padded by the score path: the
    # padding is dropped when a candidate's value is read, and its length is what the field's max_values checks)
    return Column(t.name, list(zip(*[iter(values)] * k)), padded=True)


def checked_columns(
    columns: Sequence[Column], inputs: Sequence[InputInfo], max_candidates: int
) -> tuple[dict[str, Column], dict[str, Any]]:
    """(the columns with one element per candidate, by name; the request features given once) of named columns of
    raw feature values: one element per candidate, or one for a request-scope input given once. An unknown name, a
    name sent twice, an empty column or columns of different lengths is a 422 naming the input."""
    known = {i.name: i for i in inputs}
    names = ", ".join(known)
    if not columns:
        raise bad_input(f"no inputs: send the model's inputs by name ({names})")
    seen: set[str] = set()
    for c in columns:
        if c.name not in known:
            raise bad_input(f"unknown input '{c.name[:60]}': the model's inputs are {names}")
        if c.name in seen:
            raise bad_input(f"input '{c.name[:60]}' is sent twice")
        seen.add(c.name)
    n = candidate_count({c.name: len(c) for c in columns}, known, max_candidates)
    per_row: dict[str, Column] = {}
    once: dict[str, Any] = {}
    for c in columns:
        if len(c) == n:
            per_row[c.name] = c
        else:
            once[c.name] = c.value(0)
    return per_row, once


def candidate_count(lengths: Mapping[str, int], known: Mapping[str, InputInfo], max_candidates: int) -> int:
    """The number of candidates N of inputs with ``lengths`` elements (by name): the longest; every input has N, or
    one if it is a request-scope input (given once). Else a 422 naming the input."""
    longest = max(lengths, key=lengths.__getitem__)
    n = lengths[longest]
    if n > max_candidates:
        raise bad_input(f"input '{longest}' has {n} elements, at most {max_candidates} per request (--max-candidates)")
    for name, count in lengths.items():
        if count != n and not (count == 1 and known[name].scope == "request"):
            given_once = " (or one, a request-scope input)" if known[name].scope == "request" else ""
            raise bad_input(
                f"inputs disagree on the number of candidates: '{name}' has {count} elements, '{longest}' "
                f"has {n}: every input has one per candidate{given_once}"
            )
    return n


def json_columns(columns: Mapping[str, Sequence[Any]]) -> list[Column]:
    """TF Serving's columnar format: each input's list of JSON values, one per candidate."""
    return [Column(name, list(values)) for name, values in columns.items()]


def tensor_columns(tensors: Sequence[Tensor], inputs: Sequence[InputInfo], max_candidates: int) -> list[Column]:
    """KServe v2 / TF Serving input tensors, each decoded by ``column`` for the input it names."""
    known = {i.name: i for i in inputs}
    out: list[Column] = []
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise bad_input(f"input '{t.name[:60]}' is sent twice")
        seen.add(t.name)
        info = known.get(t.name)
        if info is None:
            raise bad_input(f"unknown input '{t.name[:60]}': the model's inputs are {', '.join(known)}")
        out.append(column(t, info, max_candidates))
    return out

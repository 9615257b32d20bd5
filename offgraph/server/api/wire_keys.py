"""Named tensors scored straight from the wire: each candidate keyed in the candidate cache by its elements' bytes as
they came (raw contents, protobuf's lists of bytes, fixed-size numbers), its raw feature values read only where the
cache lacks it. The fast twin of ``tensor_inputs``' columns, for the tensors gRPC and KServe's binary extension
carry: a JSON body's candidates are keyed by their JSON bytes and decoded only where the cache lacks them
(``offgraph.server.api.score_body``); this does the same for tensors, so that a request whose candidates the cache
holds costs neither a Python object per element nor a dict per candidate.

``wire_candidates`` takes the tensors (their shapes, datatypes and sizes already as ``tensor_inputs`` checks them)
and gives the request features and the candidates as ``RawCandidates.columns``, or None where it does not apply: a
tensor whose elements are not of the forms above (JSON data), raw data that does not parse, a request-scope input
sent per candidate (its one-value rule is ``tfserving_body.split_columns``'). The caller then reads the tensors the
slow way (``tensor_inputs.tensor_columns``), whose errors name the input and the element: this path refuses
nothing on its own except a candidate's element that is not UTF-8, in the same words.

The keys: ``candidate_keys`` (the compiled kernel ``_wire_keys``, built by the package's install; its pure-Python
twin ``_candidate_keys_py`` where it could not be built; the tests check both agree bit for bit). A key is a prefix
(this path's tag and the columns' names, datatypes and elements per candidate, as JSON) and the candidate's
elements: text as a 4-byte little-endian length and its bytes, numbers as their fixed-size bytes. It is never equal
to a JSON body's key or a column key (those are JSON objects, or JSON arrays of another form: the prefix's JSON is
read from the key's start to its end, whatever follows).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.server.api.model_inputs import InputInfo
from offgraph.server.api.tensor_inputs import (
    NUMPY_DTYPES,
    Tensor,
    bad_input,
    candidate_count,
    check_datatype,
    check_number,
    column,
    dims,
)
from offgraph.server.http.errors import ApiError

try:
    from offgraph.server.api._wire_keys import candidate_keys as _candidate_keys_c
    from offgraph.server.api._wire_keys import field_contents
except ImportError:  # not built (no C compiler at install): the pure-Python twin; protobuf fields as lists
    _candidate_keys_c = None
    field_contents = None

__all__ = ["KERNEL", "candidate_keys", "field_contents", "wire_candidates"]

RAW_BYTES, BYTES_LIST, FIXED = 0, 1, 2
"""A column's form (``candidate_keys``): raw BYTES contents, a list of bytes, fixed-size elements."""

_LENGTH = struct.Struct("<I")
_ENCODE = msgspec.json.Encoder().encode
_TAG = "wire"

# typed protobuf numbers (int64_val, float_val, ...) as fixed-size elements: their Python type -> the dtype that
# gives the same Python values back (float_val's floats are float32s already widened to double)
_TYPED = {int: "<i8", float: "<f8", bool: "?"}


def _candidate_keys_py(prefix: bytes, n: int, columns: list[tuple[int, int, Any, int]]) -> list[bytes]:
    """``candidate_keys`` element by element (the kernel's twin, and its reference in the tests)."""
    parts: list[list[bytes]] = []
    for kind, k, data, itemsize in columns:
        count = n * k
        if kind == FIXED:
            raw = bytes(data)
            if len(raw) != count * itemsize:
                raise ValueError("a kind 2 buffer holds n * k * itemsize bytes")
            w = k * itemsize
            parts.append([raw[i * w : (i + 1) * w] for i in range(n)])
            continue
        if kind == RAW_BYTES:
            raw, at, elements = bytes(data), 0, []
            for _ in range(count):
                if len(raw) - at < 4:
                    raise ValueError("raw BYTES data ends inside an element's length")
                (size,) = _LENGTH.unpack_from(raw, at)
                if size > len(raw) - at - 4:
                    raise ValueError("raw BYTES element runs past the data's end")
                elements.append(raw[at + 4 : at + 4 + size])
                at += 4 + size
            if at != len(raw):
                raise ValueError("raw BYTES data holds more than its elements")
        elif kind == BYTES_LIST:
            if type(data) is not list or len(data) != count:
                raise ValueError("a kind 1 column is a list of n * k bytes")
            if not all(type(x) is bytes for x in data):
                raise TypeError("a kind 1 column holds bytes only")
            elements = data
        else:
            raise ValueError("kind is 0 (raw BYTES), 1 (list of bytes) or 2 (fixed size)")
        framed = [_LENGTH.pack(len(x)) + x for x in elements]
        parts.append([b"".join(framed[i * k : (i + 1) * k]) for i in range(n)])
    return [prefix + b"".join(p) for p in zip(*parts)] if parts else [prefix] * n


KERNEL = _candidate_keys_c is not None
"""Whether the compiled kernel serves (else its pure-Python twin)."""
candidate_keys = _candidate_keys_c if _candidate_keys_c is not None else _candidate_keys_py


@dataclass(frozen=True)
class _Layout:
    """How a key's elements read back: per column its name, elements per candidate, whether it is a list input
    sent as ``[N, K]`` (its padding dropped), and its numpy dtype (None: text)."""

    names: tuple[str, ...]
    ks: tuple[int, ...]
    padded: tuple[bool, ...]
    dtypes: tuple[str | None, ...]  # fixed-size columns: their numpy dtype; text columns: None
    skip: int  # the prefix's length

    def row(self, key: bytes, i: int) -> dict[str, Any]:
        """Candidate ``i``'s raw feature values, read back from its key (as ``tensor_inputs.column`` reads them)."""
        at, out = self.skip, {}
        for name, k, padded, dtype in zip(self.names, self.ks, self.padded, self.dtypes):
            if dtype is None:
                values: list[Any] = []
                for j in range(k):
                    (size,) = _LENGTH.unpack_from(key, at)
                    try:
                        values.append(key[at + 4 : at + 4 + size].decode("utf-8"))
                    except UnicodeDecodeError:
                        raise bad_input(f"input '{name}' element {i * k + j} is not UTF-8 text") from None
                    at += 4 + size
            else:
                size = np.dtype(dtype).itemsize * k
                a = np.frombuffer(key, dtype, k, at)
                at += size
                values = a.tolist()
                if a.dtype.kind == "f" and np.isnan(a).any():
                    values = [None if x != x else x for x in values]  # NaN is no value
            out[name] = [v for v in values if v is not None and v != ""] if padded else values[0]
        return out


def _form(t: Tensor) -> tuple[int, Any, int, str | None] | None:
    """(kind, data, itemsize, numpy dtype) of a tensor's elements for ``candidate_keys``, or None: not a form this
    path reads (JSON data, mixed Python types)."""
    if t.raw is not None:
        if t.datatype == "BYTES":
            return RAW_BYTES, t.raw, 0, None
        dtype = NUMPY_DTYPES[t.datatype]
        return FIXED, t.raw, np.dtype(dtype).itemsize, dtype
    data = t.data
    if t.datatype == "BYTES":
        return (BYTES_LIST, data, 0, None) if type(data) is list else None
    kinds = set(map(type, data or ()))
    if len(kinds) != 1:
        return None
    typed = _TYPED.get(kinds.pop())
    want = {"BOOL": "?"}.get(t.datatype, "<f8" if t.datatype in ("FP16", "FP32", "FP64") else "<i8")
    if typed is None or typed != want:  # e.g. JSON ints in an FP32 tensor: their own Python values, the slow way
        return None
    try:
        a = np.asarray(data, typed)
    except (OverflowError, ValueError, TypeError):
        return None
    return FIXED, a.tobytes(), a.itemsize, typed


def wire_candidates(
    tensors: Sequence[Tensor], inputs: Sequence[InputInfo], request_only: set[str], max_candidates: int
) -> tuple[dict[str, Any], RawCandidates] | None:
    """(request features, candidates) of named tensors read straight from the wire (the module's docstring), or None
    where the slow way must read them. ``request_only``: the inputs the version reads at request scope only."""
    known = {i.name: i for i in inputs}
    shapes: dict[str, tuple[Tensor, InputInfo, int, int | None]] = {}
    try:
        for t in tensors:
            info = known.get(t.name)
            if info is None or t.name in shapes:
                return None  # the slow way names it
            check_datatype(t)
            n, k = dims(t, info, max_candidates)
            check_number(t, info)
            if k == 0:
                return None  # [N, 0]: no values per candidate, the slow way's lists
            shapes[t.name] = (t, info, n, k)
        if not shapes:
            return None
        n = candidate_count({name: s[2] for name, s in shapes.items()}, known, max_candidates)
        request: dict[str, Any] = {}
        per_row = []
        for name, (t, info, count, k) in shapes.items():
            if count != n or (n == 1 and name in request_only):  # a request-scope input given once
                request[name] = column(t, info, max_candidates).value(0)
            elif name in request_only:
                return None  # given per candidate: its one-value rule is the slow way's
            else:
                per_row.append((t, k))
    except ApiError:
        return None  # the slow way finds the first problem, in its order
    if not per_row:
        return None
    columns, layout = [], []
    for t, k in per_row:
        form = _form(t)
        if form is None:
            return None
        kind, data, itemsize, dtype = form
        columns.append((kind, k or 1, data, itemsize))
        layout.append((t.name, t.datatype, k or 1, k is not None, dtype))
    # the elements' layout in full (a typed INT32 list is 8-byte ints here, raw INT32 contents 4-byte ones)
    prefix = _ENCODE(
        [_TAG, [[name, datatype, k, padded, dtype or "text"] for name, datatype, k, padded, dtype in layout]]
    )
    try:
        keys = candidate_keys(prefix, n, columns)
    except (ValueError, TypeError):  # malformed raw data: the slow way says where
        return None
    names, _, ks, padded, dtypes = zip(*layout)
    read = _Layout(names, ks, padded, dtypes, len(prefix))
    return request, RawCandidates.columns(n, keys, lambda which: [read.row(keys[i], i) for i in which])

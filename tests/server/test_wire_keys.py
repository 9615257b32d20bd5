"""Named tensors read straight from the wire (``offgraph.server.api.wire_keys``): the compiled key kernel and its
pure-Python twin agree bit for bit (random and malformed columns), a key is what the module says it is (worked by
hand), and the candidates it reads back equal what the slow way (``tensor_inputs.tensor_columns``) reads, for raw
and typed forms; where it does not apply it says so (None) and the slow way answers."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from offgraph.server.api import wire_keys
from offgraph.server.api.model_inputs import InputInfo
from offgraph.server.api.tensor_inputs import Tensor, checked_columns, tensor_columns
from offgraph.server.api.tfserving_body import split_columns
from offgraph.server.api.wire_keys import _candidate_keys_py, candidate_keys, wire_candidates
from offgraph.server.http.errors import ApiError

RAW, LIST, FIXED = wire_keys.RAW_BYTES, wire_keys.BYTES_LIST, wire_keys.FIXED


def framed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def test_the_kernel_is_built_on_these_machines():
    # the package's install compiles it (setup.py); the pure-Python twin is for machines without a compiler
    assert wire_keys.KERNEL and candidate_keys is not _candidate_keys_py


def test_a_key_worked_by_hand():
    # two candidates; a list of 2 texts each (typed), then one int64 each (raw, fixed size)
    cols = [(LIST, 2, [b"a", b"", b"bc", b"d"], 0), (FIXED, 1, np.array([5, -1], "<i8").tobytes(), 8)]
    want = [
        b"P" + b"\x01\x00\x00\x00a" + b"\x00\x00\x00\x00" + b"\x05" + b"\x00" * 7,
        b"P" + b"\x02\x00\x00\x00bc" + b"\x01\x00\x00\x00d" + b"\xff" * 8,
    ]
    assert candidate_keys(b"P", 2, cols) == want
    assert _candidate_keys_py(b"P", 2, cols) == want
    # the same texts sent raw give the same keys
    raw = [(RAW, 2, b"\x01\x00\x00\x00a\x00\x00\x00\x00\x02\x00\x00\x00bc\x01\x00\x00\x00d", 0), cols[1]]
    assert candidate_keys(b"P", 2, raw) == want


def _random_columns(rng: np.random.Generator, n: int) -> list[tuple]:
    cols: list[tuple] = []
    for _ in range(int(rng.integers(1, 5))):
        kind, k = int(rng.integers(0, 3)), int(rng.integers(1, 4))
        if kind == FIXED:
            size = int(rng.choice([1, 2, 4, 8]))
            cols.append((FIXED, k, rng.bytes(n * k * size), size))
            continue
        elements = [rng.bytes(int(rng.integers(0, 6))) for _ in range(n * k)]  # NULs and empties included
        cols.append((RAW, k, framed(*elements), 0) if kind == RAW else (LIST, k, elements, 0))
    return cols


def test_kernel_and_python_agree_bit_for_bit():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 12))
        cols = _random_columns(rng, n)
        prefix = rng.bytes(int(rng.integers(0, 5)))
        assert candidate_keys(prefix, n, cols) == _candidate_keys_py(prefix, n, cols)


@pytest.mark.parametrize(
    "cols, error",
    [
        ([(RAW, 1, b"\x01\x00\x00", 0)], ValueError),  # ends inside a length
        ([(RAW, 1, b"\x05\x00\x00\x00ab", 0)], ValueError),  # an element past the end
        ([(RAW, 1, framed(b"a") + b"x", 0)], ValueError),  # more than its elements
        ([(LIST, 1, [b"a"], 0)], ValueError),  # n * k = 2 elements wanted
        ([(LIST, 1, [b"a", "b"], 0)], TypeError),  # text, not bytes
        ([(FIXED, 1, b"\x00" * 15, 8)], ValueError),  # 2 x 8 bytes wanted
        ([(7, 1, b"", 0)], ValueError),  # no such kind
    ],
)
def test_malformed_columns_are_refused_alike(cols, error):
    for fn in (candidate_keys, _candidate_keys_py):
        with pytest.raises(error):
            fn(b"", 2, cols)


INPUTS = [
    InputInfo("user", "request", number=False, takes_list=False),
    InputInfo("item", "item", number=False, takes_list=False),
    InputInfo("tags", "item", number=False, takes_list=True),
    InputInfo("price", "item", number=True, takes_list=False),
]


def _slow(tensors):
    per_row, once = checked_columns(tensor_columns(tensors, INPUTS, 100), INPUTS, 100)
    request, per_row = split_columns(per_row, once, {"user"}, {"item", "tags", "price"})
    n = len(next(iter(per_row.values())))
    return request, [{name: c.value(i) for name, c in per_row.items()} for i in range(n)]


def _tensors(raw: bool) -> list[Tensor]:
    items, tags = [b"i1", b"i2", b"\xc3\xa9t\xc3\xa9"], [b"a", b"", b"b", b"c", b"", b""]
    prices = np.array([1.5, np.nan, -0.0])
    if raw:
        return [
            Tensor("user", "BYTES", [1], raw=framed(b"u7")),
            Tensor("item", "BYTES", [3], raw=framed(*items)),
            Tensor("tags", "BYTES", [3, 2], raw=framed(*tags)),
            Tensor("price", "FP32", [3], raw=prices.astype("<f4").tobytes()),
        ]
    return [
        Tensor("user", "BYTES", [1], data=[b"u7"]),
        Tensor("item", "BYTES", [3], data=items),
        Tensor("tags", "BYTES", [3, 2], data=tags),
        Tensor("price", "FP64", [3], data=prices.tolist()),
    ]


@pytest.mark.parametrize("raw", [True, False])
def test_candidates_read_back_as_the_slow_way_reads_them(raw):
    tensors = _tensors(raw)
    got = wire_candidates(tensors, INPUTS, {"user"}, 100)
    assert got is not None
    request, candidates = got
    want_request, want_rows = _slow(tensors)
    assert request == want_request == {"user": "u7"}
    rows = list(candidates.dicts())
    assert rows == want_rows
    # by hand: the padding ("") dropped from the lists, NaN is no value, -0.0 kept
    assert [r["tags"] for r in rows] == [["a"], ["b", "c"], []]
    assert [r["item"] for r in rows] == ["i1", "i2", "été"]
    assert rows[0]["price"] == 1.5 and rows[1]["price"] is None and str(rows[2]["price"]) == "-0.0"
    # only the candidates asked for are read
    assert candidates.decode([2]) == [want_rows[2]]


def test_keys_tell_layouts_apart_and_forms_of_one_layout_alike():
    raw_keys = wire_candidates(_tensors(True), INPUTS, {"user"}, 100)[1].raws  # type: ignore[index]
    typed_keys = wire_candidates(_tensors(False), INPUTS, {"user"}, 100)[1].raws  # type: ignore[index]
    assert raw_keys is not None and typed_keys is not None
    assert len(set(raw_keys)) == 3 and not set(raw_keys) & set(typed_keys)  # FP32 raw and FP64 typed: two layouts
    bytes_only = [t for t in _tensors(True) if t.name != "price"]
    listed = [Tensor(t.name, t.datatype, t.shape, data=d) for t, d in zip(bytes_only, ([b"u7"], None, None))]
    listed[1:] = [
        Tensor("item", "BYTES", [3], data=[b"i1", b"i2", "été".encode()]),
        Tensor("tags", "BYTES", [3, 2], data=[b"a", b"", b"b", b"c", b"", b""]),
    ]
    a = wire_candidates(bytes_only, INPUTS, {"user"}, 100)
    b = wire_candidates(listed, INPUTS, {"user"}, 100)
    assert a is not None and b is not None and a[1].raws == b[1].raws  # raw BYTES and a list of bytes: one key


def test_an_element_not_utf8_is_refused_naming_it_when_read():
    tensors = _tensors(True)
    tensors[2] = Tensor("tags", "BYTES", [3, 2], raw=framed(b"a", b"", b"b", b"\xff", b"", b""))
    got = wire_candidates(tensors, INPUTS, {"user"}, 100)
    assert got is not None
    with pytest.raises(ApiError) as e:
        got[1].dicts()
    assert e.value.status_code == 422 and "input 'tags' element 3 is not UTF-8 text" in str(e.value.detail)


@pytest.mark.parametrize(
    "change",
    [
        lambda ts: [*ts[:1], Tensor("item", "BYTES", [3], data=["i1", "i2", "i3"]), *ts[2:]],  # JSON text
        lambda ts: [Tensor("user", "BYTES", [3], raw=framed(b"u", b"u", b"u")), *ts[1:]],  # request input per row
        lambda ts: [*ts[:1], Tensor("item", "BYTES", [3], raw=framed(b"i1") + b"\x09"), *ts[2:]],  # malformed
        lambda ts: [*ts, Tensor("nope", "BYTES", [3], raw=framed(b"a", b"b", b"c"))],  # unknown input
        lambda ts: [*ts[:3], Tensor("price", "FP32", [3], data=[1, 2.5, 3])],  # JSON ints among floats
    ],
)
def test_what_it_does_not_read_is_left_to_the_slow_way(change):
    assert wire_candidates(change(_tensors(True)), INPUTS, {"user"}, 100) is None


def test_field_contents_reads_a_tensor_proto_as_raw_contents():
    # TF Serving's Predict sends strings and floats as typed repeated fields; the kernel reads them as KServe's raw
    # contents: strings framed by their 4-byte lengths, numbers as their little-endian bytes
    from tensorflow.core.framework import tensor_pb2

    from offgraph.server.api.wire_keys import field_contents

    assert field_contents is not None
    long = bytes(range(256)) * 3  # 768 bytes: a two-byte varint length
    t = tensor_pb2.TensorProto(dtype=7, string_val=[b"ab", b"", long, b"\xff\xfe"], double_val=[1.5, -2.0])
    t.tensor_shape.dim.add(size=4)
    msg = t.SerializeToString()
    raw, count = field_contents(msg, 8, 0)  # string_val is field 8
    assert count == 4
    assert raw == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x00\x03\x00\x00" + long + b"\x02\x00\x00\x00\xff\xfe"
    raw, count = field_contents(msg, 6, 8)  # double_val, packed: 1.5 is 0x3FF8 << 48, -2.0 is 0xC000 << 48
    assert count == 2 and raw == b"\x00" * 6 + b"\xf8\x3f" + b"\x00" * 6 + b"\x00\xc0"
    f = tensor_pb2.TensorProto(dtype=1, float_val=[0.5, float("nan")]).SerializeToString()
    raw, count = field_contents(f, 5, 4)
    assert count == 2 and raw[:4] == b"\x00\x00\x00\x3f" and np.isnan(np.frombuffer(raw, "<f4")[1])
    assert field_contents(msg, 5, 4) == (b"", 0)  # absent
    # unpacked doubles (wire type 1, as a proto2 writer may send them), one field 6 entry each: read the same
    unpacked = bytes([6 << 3 | 1]) + struct.pack("<d", 3.25) + bytes([6 << 3 | 1]) + struct.pack("<d", -1.0)
    assert field_contents(unpacked, 6, 8) == (struct.pack("<2d", 3.25, -1.0), 2)
    # random messages against protobuf's own reading of them
    rng = np.random.default_rng(3)
    for _ in range(200):
        strings = [rng.bytes(int(rng.integers(0, 300))) for _ in range(int(rng.integers(0, 40)))]
        numbers = rng.normal(size=int(rng.integers(0, 40)))
        m = tensor_pb2.TensorProto(dtype=7, string_val=strings, double_val=numbers, int64_val=[1, -5, 1 << 40])
        m.tensor_shape.dim.add(size=len(strings))
        wire = m.SerializeToString()
        assert field_contents(wire, 8, 0) == (framed(*strings), len(strings))
        assert field_contents(wire, 6, 8) == (numbers.astype("<f8").tobytes(), len(numbers))


@pytest.mark.parametrize(
    "message",
    [
        bytes([8 << 3 | 2, 5]) + b"abc",  # a length past the end
        bytes([8 << 3 | 2, 0x80]),  # a varint that never ends
        bytes([6 << 3 | 2, 3]) + b"abc",  # a packed double run that is not whole doubles
        bytes([8 << 3 | 0, 1]),  # string_val as a varint: a wire type it cannot have
        bytes([1 << 3 | 3]),  # a group
        bytes([6 << 3 | 1]) + b"\x00" * 7,  # a fixed64 cut short
    ],
)
def test_field_contents_refuses_malformed_messages(message):
    from offgraph.server.api.wire_keys import field_contents

    field, width = (6, 8) if message[0] >> 3 == 6 else (8, 0)
    with pytest.raises(ValueError, match="malformed"):
        field_contents(message, field, width)

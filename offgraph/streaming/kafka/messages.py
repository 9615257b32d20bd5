"""Row deltas as Kafka messages, format version 1 (see offgraph/streaming/README.md, "Kafka").

A message's value is one delta file's bytes (an Arrow IPC file, ``offgraph.streaming.deltas`` v1: model,
model version and dim in its schema metadata, K rows), so any language with Arrow can
produce one. Headers repeat what a consumer may want before decoding:

    offgraph.delta.version = b"1"               the payload's offgraph.delta.version (format version)
    offgraph.model         = model name (utf-8)  the payload's model
    offgraph.model_version = decimal int         the payload's model_version (row deltas only: a
                                                 feature delta names no version, so has no such header)

Headers are optional, but checked (:func:`check_headers`): each of these three that is present
must be well-formed (null, empty, not UTF-8, not a decimal int: malformed, never "absent") and
say what the payload says; else the message is refused (dead-lettered) with a reason naming the
header, its value and the payload's. Headers of other names are ignored (tracing headers of other
producers, the ``offgraph.dead_letter.*`` ones of a replayed dead letter).

A message is at most ``MAX_MESSAGE_BYTES`` (1 MiB, Kafka's default ``message.max.bytes``):
a producer splits a batch into messages of at most ``rows_per_message(dim)`` rows. All
deltas of one row go to one partition, so they stay in order:

    partition = splitmix64((table_id << 48) | row) % partitions       (offgraph.store.keys.shard_of)

    from offgraph.streaming.kafka.messages import encode_messages
    for partition, value, headers in encode_messages(delta, partitions=4):
        producer.produce(topic, value=value, partition=partition, headers=headers)
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from offgraph.store.keys import shard_of
from offgraph.streaming.deltas import (
    KIND_FEATURES,
    META_KIND,
    META_MODEL,
    META_MODEL_VERSION,
    META_VERSION,
    DeltaFormatError,
    encode_delta,
)

FORMAT_VERSION = b"1"
APPENDS_VERSION = b"2"  # a row delta that appends keys to vocabularies (offgraph.streaming.deltas)
H_VERSION, H_MODEL, H_MODEL_VERSION = "offgraph.delta.version", "offgraph.model", "offgraph.model_version"
H_REASON, H_ORIGIN = "offgraph.dead_letter.reason", "offgraph.dead_letter.origin"
H_DEAD_PREFIX = "offgraph.dead_letter."  # + topic, partition, offset, size: a reference to a payload not copied
MAX_MESSAGE_BYTES = 1 << 20
_OVERHEAD_BYTES = 4096  # Arrow IPC schema, footer and padding of one message, generously
START_FILE = "stream-start.json"  # in a version directory: where the version's deltas begin in a topic


def parse_kafka_url(url: str) -> tuple[str, str]:
    """``kafka://HOST:PORT[,HOST:PORT...]/TOPIC`` -> (bootstrap servers, topic); ValueError naming the fault."""
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.netloc:
        raise ValueError(f"{url!r}: expected kafka://HOST:PORT/TOPIC")
    topic = parts.path.lstrip("/")
    if not topic or "/" in topic or not all(c.isalnum() or c in "._-" for c in topic) or len(topic) > 249:
        raise ValueError(f"{url!r}: the topic must be 1-249 characters of letters, digits, '.', '_', '-'")
    for hp in parts.netloc.split(","):
        host, sep, port = hp.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{url!r}: {hp!r} is not HOST:PORT")
    return parts.netloc, topic


def rows_per_message(dim: int, max_bytes: int = MAX_MESSAGE_BYTES) -> int:
    """Rows of dim ``dim`` that fit one message (table id, row, vector, weight, seq, time)."""
    per_row = 4 + 8 + 4 * dim + 4 + 8 + 8
    return max(1, (max_bytes - _OVERHEAD_BYTES) // per_row)


def headers(model: str, model_version: int, appends: bool = False) -> list[tuple[str, bytes]]:
    """The headers of a row-delta message (what its payload's metadata says; ``appends``: it carries
    vocabulary appends, format version 2)."""
    version = APPENDS_VERSION if appends else FORMAT_VERSION
    return [(H_VERSION, version), (H_MODEL, model.encode()), (H_MODEL_VERSION, str(int(model_version)).encode())]


def feature_headers(model: str) -> list[tuple[str, bytes]]:
    """The headers of a feature-delta message: no model version (a feature delta names none)."""
    return [(H_VERSION, FORMAT_VERSION), (H_MODEL, model.encode())]


# header -> (the payload's metadata key it repeats, what it holds, whether a decimal int)
_CHECKED: dict[str, tuple[bytes, str, bool]] = {
    H_VERSION: (
        META_VERSION,
        f"the delta format version, {FORMAT_VERSION.decode()} or {APPENDS_VERSION.decode()}",
        True,
    ),
    H_MODEL: (META_MODEL, "the model name", False),
    H_MODEL_VERSION: (META_MODEL_VERSION, "the model version, a decimal int", True),
}
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")  # as the sink writes it: no sign, space or leading zero
_SHOWN = 120  # characters of a value shown in a reason at most


def _show(value: bytes | str) -> str:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    s = repr(value)
    return s if len(s) <= _SHOWN else s[:_SHOWN] + "..."


def payload_metadata(value: bytes | bytearray | memoryview) -> dict[bytes, bytes] | None:
    """The schema metadata of a message's payload (an Arrow IPC file; its footer and schema are
    read, not its rows), or None where it is not readable as one (``deltas.read`` says why)."""
    try:
        return dict(ipc.open_file(pa.BufferReader(pa.py_buffer(value))).schema.metadata or {})
    except (pa.ArrowException, OSError, ValueError):
        return None


def _payload_says(meta: dict[bytes, bytes] | None, key: bytes) -> str:
    if meta is None:
        return "the payload is not a readable Arrow IPC file"
    if key == META_MODEL_VERSION and meta.get(META_KIND) == KIND_FEATURES:
        return "the payload is a feature delta, which names no model version"
    if key not in meta:
        return f"the payload's metadata has no {key.decode()!r}"
    return f"the payload's {key.decode()} is {_show(meta[key])}"


def _agrees(key: bytes, text: str, meta: dict[bytes, bytes]) -> bool:
    """Whether header value ``text`` (well-formed) says what the payload's ``meta`` does. A payload
    that lacks the key (or holds a value the reader refuses) is refused by ``deltas.read`` anyway."""
    if key == META_MODEL_VERSION and meta.get(META_KIND) == KIND_FEATURES:
        return False  # a feature delta names no version: a header that names one is not about it
    got = meta.get(key)
    if got is None:
        return True
    if key == META_MODEL_VERSION:
        try:
            return int(got.decode("ascii")) == int(text)
        except (UnicodeDecodeError, ValueError):
            return True
    return got == text.encode("utf-8")


def header_problem(name: str, raw: bytes | str | None, meta: dict[bytes, bytes] | None) -> str | None:
    """Why header ``name`` with value ``raw`` (None: a null header) refuses a message whose payload has
    metadata ``meta`` (None: unreadable), or None where it is fine (a name not checked is fine)."""
    if name not in _CHECKED:
        return None
    key, holds, decimal = _CHECKED[name]
    says = _payload_says(meta, key)
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    fault, text = None, ""
    if raw is None:
        fault = "is present but null"
    elif raw == b"":
        fault = "is present but empty"
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            fault = f"= {_show(raw)} is not UTF-8"
        if fault is None and decimal and not _DECIMAL.fullmatch(text):
            fault = f"= {_show(raw)} is not a decimal int"
    if fault is not None:
        return f"Kafka header {name} {fault} (a present {name} header must hold {holds}); {says}"
    if name == H_VERSION and raw not in (FORMAT_VERSION, APPENDS_VERSION):
        return (
            f"Kafka header {name} = {_show(raw)}: this offgraph reads delta format versions "
            f"{FORMAT_VERSION.decode()} and {APPENDS_VERSION.decode()} (with vocabulary appends); {says}"
        )
    if meta is not None and not _agrees(key, text, meta):
        return f"Kafka header {name} = {_show(raw)} disagrees with the payload: {says}"
    return None


def check_headers(hdrs: Iterable[tuple[str, bytes | str | None]], value: bytes | bytearray | memoryview) -> None:
    """Refuse (DeltaFormatError, the first fault) a message whose offgraph headers are malformed or
    disagree with its payload ``value``; absent headers and headers of other names are fine. Every
    occurrence of a repeated header is checked."""
    meta: dict[bytes, bytes] | None = None
    read = False
    for name, raw in hdrs:
        if name not in _CHECKED:
            continue
        if not read:
            meta, read = payload_metadata(value), True
        problem = header_problem(name, raw, meta)
        if problem is not None:
            raise DeltaFormatError(problem)


def encode_one(model: str, model_version: int, **columns) -> bytes:
    """One message value: the delta file bytes of ``columns`` (``write_delta_file``'s kwargs)."""
    return encode_delta(model=model, model_version=model_version, **columns)


def encode_messages(delta: dict, partitions: int, max_bytes: int = MAX_MESSAGE_BYTES):
    """``(partition, value, headers)`` messages holding the rows of ``delta`` (the kwargs of
    ``write_delta_file``, event_time_ms per row or one int), each row in its partition,
    in input order within a partition, each message at most ``max_bytes``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    model, version = delta["model"], delta["model_version"]
    t = np.asarray(delta["table_ids"])
    r = np.asarray(delta["rows"])
    v = np.asarray(delta["vectors"])
    k = len(r)
    et = delta["event_time_ms"]
    times = np.full(k, int(et), np.int64) if np.ndim(et) == 0 else np.asarray(et)
    cols = {
        "table_ids": t,
        "rows": r,
        "vectors": v,
        "first_order": np.asarray(delta["first_order"]),
        "seqs": np.asarray(delta["seqs"]),
        "event_time_ms": times,
    }
    per = rows_per_message(v.shape[1] if v.ndim == 2 else 1, max_bytes)
    hdr, with_appends = headers(model, version), headers(model, version, appends=True)
    part = shard_of(t.astype(np.uint32), r.astype(np.int64), partitions) if k else np.zeros(0, np.int64)
    # keys appended to vocabularies go in the first message of partition 0, with the rows of this delta's new keys:
    # appends are dense and in order, which one partition keeps (a row of a new key delivered on another partition
    # before its append is harmless: no id maps there until the append, and per-row seqs keep the newest value)
    appends = delta.get("vocabulary_appends") or {}
    for tid, (first, keys) in appends.items():
        part[(t == int(tid)) & (r >= first) & (r < first + len(keys))] = 0
    for p in range(partitions):
        idx = np.flatnonzero(part == p)
        extra = {"vocabulary_appends": appends} if appends and p == 0 else {}
        if extra and not len(idx):
            yield p, encode_one(model, version, **{n: a[idx] for n, a in cols.items()}, **extra), with_appends
        for c0 in range(0, len(idx), per):
            sel = idx[c0 : c0 + per]
            value = encode_one(model, version, **{n: a[sel] for n, a in cols.items()}, **extra)
            yield p, value, with_appends if extra else hdr
            extra = {}


def version_start_path(version_dir: str | Path) -> Path:
    return Path(version_dir) / START_FILE


def dead_letter_reference(reason: str, topic: str, partition: int, offset: int, size: int, why: str) -> list:
    """The headers of a dead letter whose payload is not copied (its value is empty): where to read it."""
    text = f"{reason} (the {size}-byte payload is not copied here: {why}; read it at its origin)"
    return [
        (H_REASON, text.encode("utf-8", "backslashreplace")),
        (H_ORIGIN, f"{topic}/{partition}/{offset}".encode()),
        *(
            (H_DEAD_PREFIX + k, str(v).encode())
            for k, v in (("topic", topic), ("partition", partition), ("offset", offset), ("size", size))
        ),
    ]


Offset = Annotated[int, Field(strict=True, ge=0, lt=2**63)]
PartitionKey = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,9})$")]


class VersionStart(BaseModel):
    """``stream-start.json``: the offset of each partition's first message of the version."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    topic: Annotated[str, Field(strict=True, min_length=1)]
    partitions: dict[PartitionKey, Offset]


def read_version_start(version_dir: str | Path, log: logging.Logger) -> tuple[VersionStart | None, Path]:
    """The version's ``stream-start.json`` (partition keys as ints), or None where there is none or
    it is unusable: then a warning names the file and the field, and the topic is read from its
    beginning (one rule for every fault, garbage bytes included: a start-up never fails on it)."""
    path = version_start_path(version_dir)
    try:
        rec = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, path
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deep to parse
        log.warning("%s unreadable (%s): reading the topic from its beginning", path, e)
        return None, path
    try:
        vs = VersionStart.model_validate(rec)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(the whole file)"
        log.warning(
            "%s: field %s: %s (got %.80r): ignored, reading the topic from its beginning",
            path,
            field,
            err["msg"],
            err.get("input"),
        )
        return None, path
    return vs.model_copy(update={"partitions": {int(p): o for p, o in vs.partitions.items()}}), path

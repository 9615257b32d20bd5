"""Kafka headers are checked against the payload (issue 48, defect 5): every offgraph header that is
present (offgraph.delta.version, offgraph.model, offgraph.model_version) must be well-formed and say
what the payload says, else the message is dead-lettered with a reason naming the header, its value
and the payload's; absent headers and headers of other names are fine. Was: a null version header
was read as no header, and headers naming another model or version were applied silently.

Unit checks of ``check_headers`` first (no broker), then one stream through a real Kafka-protocol
broker (Tansu) and ``offgraph update``: the bad messages are dead-lettered, the rest is applied."""

import numpy as np
import pytest
from kafka_helpers import (  # noqa: F401
    P,
    broker,
    caught_up,
    consume_all,
    delta,
    raw_producer,
    rows_of,
    sink,
    start_updater,
    stop,
    tiny_export,
    topic_name,
    wait_until,
)
from streaming_helpers import NAME, assert_store_holds, install_version

from offgraph.streaming.deltas import DeltaFormatError, encode_feature_delta
from offgraph.streaming.kafka.messages import (
    H_MODEL,
    H_MODEL_VERSION,
    H_VERSION,
    check_headers,
    encode_messages,
    encode_one,
    feature_headers,
    headers,
)
from offgraph.streaming.kafka.source import KafkaItem

V, M, MV = H_VERSION, H_MODEL, H_MODEL_VERSION


def _cols(k: int = 3, seq0: int = 1) -> dict:
    return dict(
        table_ids=np.zeros(k, np.uint32),
        rows=np.arange(k, dtype=np.int64),
        vectors=np.ones((k, 4), np.float32),
        first_order=np.zeros(k, np.float32),
        seqs=seq0 + np.arange(k, dtype=np.int64),
        event_time_ms=0,
    )


ROWS = encode_one("ml", 3, **_cols())
FEATURES = encode_feature_delta(
    model="ml", table="item", key="movie_id", rows=[{"movie_id": 1, "year": 1997}], seqs=[1], event_time_ms=0
)


def _refusal(hdrs, value=ROWS) -> str:
    with pytest.raises(DeltaFormatError) as e:
        check_headers(hdrs, value)
    return str(e.value)


# ----------------------------------------------------------------------------- unit: no broker
def test_the_sinks_own_headers_and_none_at_all_pass():
    check_headers(headers("ml", 3), ROWS)
    check_headers(feature_headers("ml"), FEATURES)
    check_headers([], ROWS)
    check_headers([], FEATURES)
    assert KafkaItem(position="0", key=b"k", payload=ROWS, headers=tuple(headers("ml", 3))).read().model_version == 3
    for _p, value, hdrs in encode_messages({"model": "ml", "model_version": 7, **_cols(50)}, partitions=4):
        check_headers(hdrs, value)


def test_headers_of_other_names_are_ignored_whatever_they_hold():
    third_party = [
        ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("x-null", None),
        ("x-empty", b""),
        ("x-binary", b"\xff\xfe"),
        ("offgraph.dead_letter.reason", b"a replayed dead letter's headers"),
        ("Offgraph.Model", b"case differs: another name"),
    ]
    check_headers(third_party, ROWS)
    check_headers([*third_party, *headers("ml", 3)], ROWS)


@pytest.mark.parametrize(
    "name,raw,says",
    [
        (V, None, "is present but null"),
        (M, None, "is present but null"),
        (MV, None, "is present but null"),
        (V, b"", "is present but empty"),
        (M, b"", "is present but empty"),
        (MV, b"", "is present but empty"),
        (M, b"\xff\xfe", "= b'\\xff\\xfe' is not UTF-8"),
        (MV, b"v3", "= 'v3' is not a decimal int"),
        (MV, b"03", "= '03' is not a decimal int"),
        (MV, b" 3", "= ' 3' is not a decimal int"),
        (MV, b"+3", "= '+3' is not a decimal int"),
        (MV, b"3_0", "= '3_0' is not a decimal int"),
        (MV, b"-1", "= '-1' is not a decimal int"),
        (MV, b"9" * 5000, "is not a decimal int"),
        (V, b"one", "= 'one' is not a decimal int"),
        (V, b"1.0", "= '1.0' is not a decimal int"),
    ],
)
def test_a_present_header_that_is_null_empty_or_malformed_is_refused(name, raw, says):
    payload_says = {V: "the payload's offgraph.delta.version is '1'", M: "the payload's model is 'ml'"}
    payload_says[MV] = "the payload's model_version is '3'"
    why = _refusal([(name, raw)])
    assert why.startswith(f"Kafka header {name} ") and says in why, why
    assert payload_says[name] in why, why
    assert len(why) < 600, why  # a huge value is shown cut


@pytest.mark.parametrize(
    "hdrs,says",
    [
        (
            [(M, b"other")],
            "Kafka header offgraph.model = 'other' disagrees with the payload: the payload's model is 'ml'",
        ),
        (
            [(MV, b"4")],
            "Kafka header offgraph.model_version = '4' disagrees with the payload: the payload's model_version is '3'",
        ),
        (
            [(V, b"3")],
            "Kafka header offgraph.delta.version = '3': this offgraph reads delta format versions 1 and 2 (with "
            "vocabulary appends); the payload's offgraph.delta.version is '1'",
        ),
        (
            [(V, b"2")],  # a version this offgraph reads, but not the payload's
            "Kafka header offgraph.delta.version = '2' disagrees with the payload: the payload's "
            "offgraph.delta.version is '1'",
        ),
        ([(M, "other")], "offgraph.model = 'other' disagrees"),  # a str value (producers accept one)
        ([(M, b"ml"), (M, b"other")], "offgraph.model = 'other' disagrees"),  # every occurrence is checked
        ([(M, "Ml")], "offgraph.model = 'Ml' disagrees"),
    ],
)
def test_a_header_that_disagrees_with_the_payload_is_refused_naming_both(hdrs, says):
    assert says in _refusal(hdrs)


def test_a_feature_delta_names_no_model_version_so_a_header_naming_one_is_refused():
    why = _refusal([*feature_headers("ml"), (MV, b"3")], FEATURES)
    assert "offgraph.model_version = '3' disagrees" in why and "a feature delta, which names no model version" in why
    assert "the payload's model is 'ml'" in _refusal([(M, b"other")], FEATURES)


def test_an_unreadable_payload_is_refused_for_itself_unless_a_header_is_malformed():
    check_headers(headers("ml", 3), b"not arrow")  # agreement cannot be told: deltas.read refuses the payload
    item = KafkaItem(position="0", key=b"k", payload=b"not arrow", headers=tuple(headers("ml", 3)))
    with pytest.raises(DeltaFormatError, match="not an Arrow IPC file"):
        item.read()
    why = _refusal([(V, b"3")], b"not arrow")
    assert "this offgraph reads delta format versions 1 and 2" in why and "not a readable Arrow IPC file" in why
    assert "is present but null" in _refusal([(M, None)], b"")


def test_the_source_refuses_before_decoding():
    item = KafkaItem(position="0", key=b"k", payload=ROWS, headers=((V, None),))
    with pytest.raises(DeltaFormatError, match="offgraph.delta.version is present but null"):
        item.read()


# ----------------------------------------------------------------------------- a real broker
@pytest.mark.slow
def test_bad_headers_are_dead_lettered_naming_both_values_and_the_rest_is_applied(
    broker, tiny_export, tmp_path, request
):
    topic = topic_name(request)
    vdir = install_version(tiny_export, tmp_path / "models", 1)
    rng = np.random.default_rng(48)
    good = [delta(rng, 200, 1 + 1000 * i) for i in range(3)]
    out = sink(broker, topic)
    out.emit(good[0])  # the topic and the version's start markers
    out.flush()
    right = [(V, b"1"), (M, NAME.encode()), (MV, b"1")]
    tracing = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), ("x-null", None)]
    bad = {  # case -> (headers, what the reason must name)
        "null version": ([(V, None), (M, NAME.encode())], ["offgraph.delta.version is present but null", "'1'"]),
        "null model": ([(V, b"1"), (M, None), (MV, b"1")], ["offgraph.model is present but null", f"'{NAME}'"]),
        "empty model_version": ([*right[:2], (MV, b"")], ["offgraph.model_version is present but empty"]),
        "empty model": ([(M, b"")], ["offgraph.model is present but empty", f"model is '{NAME}'"]),
        "malformed model_version": (
            [*right[:2], (MV, b"v1")],
            ["offgraph.model_version = 'v1' is not a decimal int", "model_version is '1'"],
        ),
        "non-UTF-8 model": ([(M, b"\xfftiny")], ["offgraph.model = b'\\xfftiny' is not UTF-8", f"model is '{NAME}'"]),
        "another model": (
            [(V, b"1"), (M, b"someone-else"), (MV, b"1")],
            ["offgraph.model = 'someone-else' disagrees", f"the payload's model is '{NAME}'"],
        ),
        "another model_version": (
            [*right[:2], (MV, b"2"), *tracing],
            ["offgraph.model_version = '2' disagrees", "the payload's model_version is '1'"],
        ),
        "another format version": (
            [(V, b"3"), *right[1:]],
            ["offgraph.delta.version = '3'", "reads delta format versions 1 and 2", "offgraph.delta.version is '1'"],
        ),
    }
    fine = {
        "no headers": None,
        "third-party headers only": tracing + [("offgraph.dead_letter.reason", b"replayed"), ("x-empty", b"")],
        "right headers and third-party ones": [*tracing, *right],
    }
    prod, sent = raw_producer(broker), {}
    deltas_of = {}
    for i, (case, hdrs) in enumerate([*((c, h) for c, (h, _) in bad.items()), *fine.items()]):
        d = delta(rng, 20, 10**6 + 1000 * i)  # seqs above every good one: if applied, they would show
        deltas_of[case] = d
        cols = {k: d[k] for k in ("table_ids", "rows", "vectors", "first_order", "seqs", "event_time_ms")}
        prod.produce(
            topic,
            value=encode_one(NAME, 1, **cols),
            partition=i % P,
            headers=hdrs,
            on_delivery=lambda e, m, case=case: sent.__setitem__(case, (e, m.partition(), m.offset())),
        )
    assert prod.flush(10) == 0 and all(e is None for e, _, _ in sent.values()), sent
    for d in good[1:]:  # behind them on every partition
        out.emit(d)
    out.flush()
    log = tmp_path / "update.log"
    up = start_updater(tmp_path / "models", topic, broker, log)
    try:
        wait_until(lambda: caught_up(vdir, topic, out.last_offsets), 120, up, log=log, what="applied past them")
    finally:
        stop(up)
        out.close()
    dead = consume_all(broker, f"{topic}.dead", 1, expect=len(bad))
    reasons = {m[3]["offgraph.dead_letter.origin"].decode(): m[3]["offgraph.dead_letter.reason"].decode() for m in dead}
    origin = {case: f"{topic}/{p}/{off}" for case, (_, p, off) in sent.items()}
    assert sorted(reasons) == sorted(origin[c] for c in bad), reasons  # those, and only those, refused
    for case, (_, names) in bad.items():
        why = reasons[origin[case]]
        assert all(n in why for n in names), (case, why)
    # the well-headed, header-less and third-party-headed messages applied, the rest went on
    assert_store_holds(vdir, good + [deltas_of[c] for c in fine])
    for case in bad:
        d = deltas_of[case]
        assert not np.isin(rows_of(vdir, d["table_ids"], d["rows"])[2], d["seqs"]).any(), case  # seqs: its own

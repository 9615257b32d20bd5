"""The served log's JSON features and the outcome log, read columnar: what the experiment report
(``offgraph.experiments.report``) and the stream trainer's served events (``offgraph.streaming.served_events``) share.

- ``json_values(texts, name)``: the top-level key ``name`` of each JSON object (the served log's ``request`` and
  ``candidates`` texts) as one typed Arrow array, read by ``pyarrow.json``; ``json_field``: the same as text.
- ``read_outcomes(path)``: an outcome log (Parquet or CSV: ``request_id``, the item field, ``event`` in
  ``EVENTS``, an optional ``value``); ``outcome_pairs``: one row per (request id, item) with clicked and gain.

Both logs are read by the report and by the trainer alike, so a candidate is clicked (and has its gain) for
the one by the same rule. Here, under the report (``offgraph.experiments``) and the trainer (``offgraph.streaming``)
in the layers: both import it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

EVENTS = ("click", "play", "play_share")
_JSON_SLICE = 200_000
"""JSON texts read by one pyarrow.json call (joined into one buffer: well under a string's 2 GiB)."""
SCALAR_TYPES = (pa.int64(), pa.string(), pa.float64(), pa.bool_())
VALUE_TYPES = (
    pa.int64(),
    pa.float64(),  # after int64: a key holding 1 and 1.5 is read as floats (FG hashes 1.0 as 1)
    pa.string(),
    pa.bool_(),
    *(pa.list_(t) for t in (pa.int64(), pa.float64(), pa.string(), pa.bool_())),
)
"""The Arrow types a feature is read as, the first that reads every record: a number, text, a bool, or a list
of one of them (what FG takes). A key whose values mix them (1 in one record, "1" in another) is refused."""


class LogError(ValueError):
    """A served log or outcome log that cannot be read as asked (a missing column, a key of mixed types...): the
    CLI exits 2 naming the problem."""


def read_outcomes(path: str | Path) -> pa.Table:
    """The outcome log at ``path``: Parquet (``.parquet``, ``.pq``) or CSV (``.csv``; ``.tsv`` tab-separated),
    request ids and events read as text."""
    p = Path(path)
    if not p.is_file():
        raise LogError(f"{p}: no such outcome log")
    suffix = p.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return pq.read_table(p)
    if suffix in (".csv", ".tsv"):
        import pyarrow.csv as pcsv

        return pcsv.read_csv(
            p,
            parse_options=pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ","),
            convert_options=pcsv.ConvertOptions(column_types={"request_id": pa.string(), "event": pa.string()}),
        )
    raise LogError(f"{p}: an outcome log is .parquet, .pq, .csv or .tsv")


def check_columns(table: pa.Table, need: tuple[str, ...] | list[str], what: str) -> None:
    missing = [c for c in need if c not in table.column_names]
    if missing:
        raise LogError(f"the {what} lacks the column(s) {', '.join(missing)} (it has {', '.join(table.column_names)})")


def model_records(served: pa.Table, model: str | None, flag: str = "") -> tuple[pa.Table, str | None]:
    """(the served log's records of ``model``, its name): the log's one model when None; ``LogError`` naming the
    models the log has when it holds several and none is named, or not the one named (``flag``: the option that
    names it, said in the error)."""
    models = sorted(m for m in pc.unique(served.column("model")).to_pylist() if m is not None)
    if model is None and len(models) > 1:
        raise LogError(f"the served log holds the models {', '.join(models)}: name one{flag and f' ({flag})'}")
    if model is not None:
        if model not in models:
            raise LogError(f"the served log has no record of the model {model!r} (it has {', '.join(models)})")
        served = served.filter(pc.equal(served.column("model"), model))
    return served, model or (models[0] if models else None)


def json_field(texts: pa.Array | pa.ChunkedArray, name: str) -> pa.Array:
    """The value of the top-level key ``name`` of each JSON object in ``texts``, as text (a number as its
    digits; null where the key is absent or null); each ``_JSON_SLICE`` objects' type found on its own."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    kind = "one scalar type (number or text)"
    parts = [
        json_values(texts.slice(i, _JSON_SLICE), name, SCALAR_TYPES, kind).cast(pa.string())
        for i in range(0, len(texts), _JSON_SLICE)
    ]
    return pa.concat_arrays(parts) if parts else pa.array([], pa.string())


def json_values(
    texts: pa.Array | pa.ChunkedArray,
    name: str,
    types: tuple[pa.DataType, ...] = VALUE_TYPES,
    kind: str = "one JSON type (a number, text, a bool or a list of one of them)",
) -> pa.Array:
    """The value of the top-level key ``name`` of each JSON object in ``texts`` as one Arrow array of the first
    of ``types`` that reads every object (null where the key is absent or null). Read by ``pyarrow.json``,
    ``_JSON_SLICE`` objects a call; ``LogError`` (saying the values are not ``kind``) when no type reads them."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    slices = [texts.slice(i, _JSON_SLICE) for i in range(0, len(texts), _JSON_SLICE)]
    if not slices:
        return pa.array([], types[0])
    error = None
    for typ in types:  # one type for every slice: the column is one array
        try:
            return pa.concat_arrays([_json_slice(s, name, typ) for s in slices])
        except pa.ArrowInvalid as e:
            error = e
    raise LogError(f"the served log's field {name!r} is not {kind}: {error}")


def _json_slice(texts: pa.Array, name: str, typ: pa.DataType) -> pa.Array:
    import pyarrow.json as pj

    lines = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(texts)], pa.int32()), texts), "\n")
    buf = lines[0].as_buffer()
    longest = pc.max(pc.binary_length(texts)).as_py() or 0
    read = pj.ReadOptions(block_size=max(1 << 20, 2 * longest + 2))
    # an explicit type: inferring every field would fail on a field whose type varies, and read them all
    parse = pj.ParseOptions(
        explicit_schema=pa.schema([(name, typ)]),
        unexpected_field_behavior="ignore",
        newlines_in_values=True,  # a candidate is logged as the caller sent its bytes: it may span lines
    )
    return pj.read_json(pa.BufferReader(buf), read_options=read, parse_options=parse).column(name).combine_chunks()


def outcome_pairs(outcomes: pa.Table, item_field: str, gain_event: str) -> pa.Table:
    """One row per (request_id, item) of the outcome log: clicked (0/1: it has a ``click`` event) and gain (the
    summed values of its ``gain_event`` events; a null value counts 1; without a ``value`` column each event
    counts 1, which play_share refuses), the item as text."""
    check_columns(outcomes, ["request_id", item_field, "event"], "outcome log")
    if outcomes.num_rows == 0:
        raise LogError("the outcome log has no rows")
    event = outcomes.column("event").cast(pa.string())
    unknown = sorted(set(pc.unique(event).to_pylist()) - set(EVENTS), key=str)
    if unknown:
        raise LogError(f"the outcome log's events are {', '.join(EVENTS)}; it has {unknown}")
    if "value" in outcomes.column_names:
        value = outcomes.column("value").cast(pa.float64()).fill_null(1.0)
        if pc.any(pc.less(value, 0.0)).as_py():
            raise LogError("the outcome log has a negative value: a gain is >= 0")
    elif gain_event == "play_share":
        raise LogError("the outcome log has no value column: play_share needs one (or choose --gain-event)")
    else:
        value = pa.array(np.ones(outcomes.num_rows))
    is_gain = pc.equal(event, gain_event).fill_null(False)
    t = pa.table(
        {
            "request_id": outcomes.column("request_id").cast(pa.string()),
            "item": outcomes.column(item_field).cast(pa.string()),
            "clicked": pc.equal(event, "click").fill_null(False).cast(pa.int8()),
            "gain": pc.if_else(is_gain, value, 0.0),
        }
    )
    agg = t.group_by(["request_id", "item"]).aggregate([("clicked", "max"), ("gain", "sum")])
    names = {"request_id": "request_id", "item": "item", "clicked": "clicked_max", "gain": "gain_sum"}
    return pa.table({name: agg.column(col) for name, col in names.items()})  # by name: the order varies by version


def candidate_outcomes(
    request_ids: pa.Array, items: pa.Array, pairs: pa.Table, item_field: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """(clicked [N], gain [N], matched) of N served candidates, each given by its request id and its item as text
    (``json_field``), from ``outcome_pairs``: 0 where the outcome log has nothing for the candidate; ``matched``:
    the pairs that are a served candidate (``LogError`` when none is). A pyarrow hash join."""
    n = len(items)
    cands = pa.table({"request_id": request_ids, "item": items, "row": np.arange(n)})
    joined = cands.join(pairs, ["request_id", "item"], join_type="inner")
    row = joined.column("row").to_numpy()
    clicked, gain = np.zeros(n), np.zeros(n)
    clicked[row] = joined.column("clicked").to_numpy(zero_copy_only=False)
    gain[row] = joined.column("gain").to_numpy(zero_copy_only=False)
    matched = pairs.join(cands.select(["request_id", "item"]), ["request_id", "item"], join_type="left semi").num_rows
    if matched == 0:
        raise LogError(
            f"none of the outcome log's {pairs.num_rows} (request_id, {item_field}) pairs is a served candidate: "
            "are the request ids the served log's, and the item field the right one?"
        )
    return clicked, gain, matched

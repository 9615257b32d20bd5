"""Training from what was served (``offgraph.streaming.served_events``, ``offgraph stream-train --served
--outcomes``): a real ``offgraph serve --served-log-rate 1 --served-log-dir`` answers requests, the test writes the
outcome log by hand, and

- the events built from the served log are, column by column, the request and candidate features the test sent,
  labelled exactly with the clicks it wrote, each request one group, at the time it was served;
- ``offgraph stream-train --served DIR --outcomes FILE`` emits the same delta rows and values as ``--events`` on a
  file the test builds by hand from the same requests and clicks (no training/serving skew), while the same file
  with one feature of one request changed emits other values (the comparison can fail);
- the same records read from the served log's Kafka topic train the same;
- requests sending ids only give events holding the feature tables' values the server joined;
- the CLI refuses a second source, --served without --outcomes, a served log without a spec input, an unknown
  arm and outcomes of no served candidate, in one line, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from served_log_helpers import metric
from server_helpers import copy_models, serve_process, stop_server, wait_ready

from offgraph.cli import main
from offgraph.features import parse_spec
from offgraph.server.process.served_log import ServedLog
from offgraph.server.process.served_log_spool import SpoolSink, read_served
from offgraph.streaming.deltas import read as read_delta_file
from offgraph.streaming.served_events import served_events
from offgraph.streaming.served_outcomes import LogError, read_outcomes

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
WRITTEN = "offgraph_served_log_records_total"
REQUEST_IN = ["user_id", "age", "gender", "occupation", "zip_prefix"]  # examples/movielens.yaml's request inputs
ITEM_IN = ["movie_id", "genres", "title_words", "release_year"]  # ... and its item inputs
N_REQUESTS, N_CANDIDATES = 12, 15
# the clicks, by hand: request index -> candidate places clicked
CLICKS = {0: [0, 3], 1: [14], 2: [], 3: [1, 2, 5], 5: [7], 8: [0], 9: [4, 9], 11: [13]}
TRAIN_FLAGS = ["--seq-start", "1000", "--batch-size", "16", "--lr", "0.05", "--no-progress"]


@pytest.fixture(scope="module")
def served(tiny_model, requests_, tmp_path_factory):
    """``offgraph serve --served-log-rate 1 --served-log-dir`` answering N_REQUESTS score requests (request ids
    ``req-<i>``), one after the other; the outcome log written by hand (CLICKS, plus events that must not count);
    the server stopped once every record was written. (tmp, models, served dir, outcomes file, the requests sent
    as (request, candidates), each request's [start, end] send time in ms)."""
    tmp = tmp_path_factory.mktemp("served_train")
    models = copy_models(tiny_model[0], tmp / "models")
    sent = [(req, cands[:N_CANDIDATES]) for req, cands in requests_ if len(cands) >= N_CANDIDATES][:N_REQUESTS]
    assert len(sent) == N_REQUESTS
    flags = ("--served-log-rate", "1.0", "--served-log-dir", str(tmp / "served"))
    proc, url = serve_process(models, tmp / "serve.log", *flags)
    windows = []
    try:
        wait_ready(url, 120, proc, log=str(tmp / "serve.log"))
        with httpx.Client(base_url=url, timeout=30) as http:
            for i, (req, cands) in enumerate(sent):
                t0 = time.time_ns() // 1_000_000
                body = {"request": req, "candidates": cands}
                r = http.post("/v1/models/ml:score", json=body, headers={"x-request-id": f"req-{i}"})
                assert r.status_code == 200, r.text
                windows.append((t0, time.time_ns() // 1_000_000 + 1))
            deadline = time.monotonic() + 30
            while metric(http.get("/metrics").text, WRITTEN) < N_REQUESTS:
                assert time.monotonic() < deadline, "the served log's records were not all written in 30 s"
                time.sleep(0.05)
    finally:
        stop_server(proc, 60)
    rows = []
    for i, places in CLICKS.items():
        for p in places:
            rows.append((f"req-{i}", sent[i][1][p]["movie_id"], "click"))
    rows.append(("req-0", sent[0][1][0]["movie_id"], "click"))  # a second click on one candidate: still 1
    rows.append(("req-2", sent[2][1][6]["movie_id"], "play"))  # a play, not a click: 0
    rows.append(("req-4", 999_999, "click"))  # an item req-4 was not served: nothing
    rows.append(("not-served", sent[0][1][1]["movie_id"], "click"))  # a request not in the log: nothing
    rid, item, event = zip(*rows)
    outcomes = tmp / "outcomes.parquet"
    pq.write_table(
        pa.table({"request_id": list(rid), "movie_id": pa.array(item, pa.int64()), "event": list(event)}), outcomes
    )
    return tmp, models, tmp / "served", outcomes, sent, windows


def expected_columns(sent) -> dict[str, list]:
    """The events the test sent, one row per candidate in the order sent: each request's features repeated for
    its candidates, each candidate's own, the clicks of CLICKS, the request id."""
    cols: dict[str, list] = {c: [] for c in [*REQUEST_IN, *ITEM_IN, "label", "request_id"]}
    for i, (req, cands) in enumerate(sent):
        for j, cand in enumerate(cands):
            for c in REQUEST_IN:
                cols[c].append(req[c])
            for c in ITEM_IN:
                cols[c].append(cand[c])
            cols["label"].append(1 if j in CLICKS.get(i, []) else 0)
            cols["request_id"].append(f"req-{i}")
    return cols


def hand_events(sent, times_ms: list[int], change: dict | None = None) -> pa.Table:
    """The --events table built by hand from the requests sent and CLICKS, each request at ``times_ms[i]``;
    ``change``: {request index: {feature: value}} set on that request."""
    cols = expected_columns(sent)
    if change:
        for i, values in change.items():
            for c, v in values.items():
                for k in range(i * N_CANDIDATES, (i + 1) * N_CANDIDATES):
                    cols[c][k] = v
    cols["timestamp"] = [times_ms[i] for i in range(len(sent)) for _ in range(N_CANDIDATES)]
    return pa.table(cols)


def deltas(spool: Path) -> dict[str, np.ndarray]:
    """Every delta row emitted into ``spool``, in emit order, by column."""
    files = [read_delta_file(p) for p in sorted(spool.glob("*.delta.arrow"))]
    assert files, f"no delta file in {spool}"
    keys = ("table_ids", "rows", "vectors", "first_order", "seqs", "event_time_ms")
    return {k: np.concatenate([getattr(f, k) for f in files]) for k in keys}


def test_the_events_of_the_served_log_are_what_was_sent_labelled_with_the_clicks(served, tiny_model):
    tmp, models, served_dir, outcomes, sent, windows = served
    from offgraph.modeldir.version import ModelVersion

    spec = ModelVersion.open(models / "ml" / "1", verify_dense=False, verify_store=False).spec
    events = served_events(read_served(served_dir), read_outcomes(outcomes), spec)
    want = expected_columns(sent)
    assert events.column_names == [*REQUEST_IN, *ITEM_IN, "label", "timestamp", "request_id"]
    for c in [*REQUEST_IN, *ITEM_IN, "label", "request_id"]:
        assert events.column(c).to_pylist() == want[c], c
        assert events.column(c).type == pa.array(want[c]).type, c  # the types a file of the same values has
    assert sum(want["label"]) == sum(len(p) for p in CLICKS.values()) == 11
    # served times in ms (the trainer's default unit): each request's within the time it was sent
    t = np.asarray(events.column("timestamp").to_pylist()).reshape(N_REQUESTS, N_CANDIDATES)
    assert (t == t[:, :1]).all()
    lo, hi = np.array(windows).T
    assert ((t[:, 0] >= lo) & (t[:, 0] <= hi)).all(), (t[:, 0], windows)
    # the served log's arm (none: no experiment) and the model's name are the filters' keys
    assert served_events(read_served(served_dir), read_outcomes(outcomes), spec, arm="none", model="ml").equals(events)
    with pytest.raises(LogError, match=r"no record of the arm 'v2' \(its arms: none\)"):
        served_events(read_served(served_dir), read_outcomes(outcomes), spec, arm="v2")


def test_stream_train_on_the_served_log_emits_what_a_hand_built_events_file_does(served, capsys):
    """No skew: the deltas of ``--served --outcomes`` (a subprocess, as a user runs it) equal, row for row and bit
    for bit, those of ``--events`` on the file built from the requests sent (at the times the server logged
    them: the server's clock is the one thing the test cannot know). A file with one request's gender flipped
    emits other values: the comparison sees a feature that differs."""
    tmp, models, served_dir, outcomes, sent, _ = served
    version = models / "ml" / "1"
    log = read_served(served_dir)
    when = dict(
        zip(
            log.column("request_id").to_pylist(), (log.column("time").cast(pa.int64()).to_numpy() // 1_000_000).tolist()
        )
    )
    times = [when[f"req-{i}"] for i in range(N_REQUESTS)]

    (tmp / "spool-served").mkdir()
    cmd = [sys.executable, "-m", "offgraph.cli", "stream-train", "--model", str(version), "--served", str(served_dir)]
    cmd += ["--outcomes", str(outcomes), "--emit", f"spool:{tmp / 'spool-served'}", *TRAIN_FLAGS]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert f"{N_REQUESTS * N_CANDIDATES} events" in r.stdout, r.stdout

    def by_hand(name: str, change: dict | None = None) -> dict[str, np.ndarray]:
        pq.write_table(hand_events(sent, times, change), tmp / f"{name}.parquet")
        (tmp / f"spool-{name}").mkdir()
        args = ["stream-train", "--model", str(version), "--events", str(tmp / f"{name}.parquet")]
        assert main([*args, "--emit", f"spool:{tmp / f'spool-{name}'}", *TRAIN_FLAGS]) == 0
        capsys.readouterr()
        return deltas(tmp / f"spool-{name}")

    got, want = deltas(tmp / "spool-served"), by_hand("hand")
    assert len(want["rows"]) > 100
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)

    flipped = {"F": "M", "M": "F"}[sent[3][0]["gender"]]
    skewed = by_hand("skewed", {3: {"gender": flipped}})
    same_rows = len(skewed["rows"]) == len(want["rows"]) and (skewed["rows"] == want["rows"]).all()
    assert not (same_rows and np.array_equal(skewed["vectors"], want["vectors"]))


def test_stream_train_reads_the_served_log_from_its_kafka_topic_as_from_its_spool(served, capsys, tmp_path):
    """The served log's Kafka sink (``--served-log-kafka``): the fixture's records on a topic of two partitions of
    the real Tansu broker, written by the sink the server uses in two batches; ``--served kafka://...`` emits the
    deltas ``--served DIR`` does (the records put back in time order whatever the partitions' order)."""
    from offgraph.server.process.served_log_kafka import KafkaServedSink
    from offgraph.testing.tansu import TansuBroker

    tmp, models, served_dir, outcomes, _, _ = served
    log = read_served(served_dir)
    broker = TansuBroker(tmp_path / "tansu.log")
    url = f"kafka://{broker.start()}/served"
    runs = {}
    try:
        sink = KafkaServedSink(url, partitions=2)
        sink.ready()
        sink.write(log.slice(0, N_REQUESTS // 2))
        sink.write(log.slice(N_REQUESTS // 2))
        sink.close()
        for name, source in (("kafka", url), ("spool", str(served_dir))):
            (tmp_path / name).mkdir()
            args = ["stream-train", "--model", str(models / "ml" / "1"), "--served", source]
            assert main([*args, "--outcomes", str(outcomes), "--emit", f"spool:{tmp_path / name}", *TRAIN_FLAGS]) == 0
            runs[name] = deltas(tmp_path / name)
            assert f"{N_REQUESTS * N_CANDIDATES} events" in capsys.readouterr().out
    finally:
        broker.kill()
    for k in runs["spool"]:
        np.testing.assert_array_equal(runs["kafka"][k], runs["spool"][k], err_msg=k)


def _by_key(table: pa.Table, key: str, columns: list[str]) -> dict:
    """key -> its columns' values in the source rows (one distinct value per key in MovieLens, checked here)."""
    out: dict = {}
    for row in table.select([key, *columns]).to_pylist():
        values = {c: row[c] for c in columns}
        assert out.setdefault(row[key], values) == values, row[key]
    return out


def test_ids_only_requests_train_on_the_feature_tables_values_the_server_joined(tiny_model, requests_, tmp_path):
    """Requests that send ids only (the server fills the rest from its user and item tables): the events hold the
    tables' values, the features the server scored with, which the caller never sent."""
    from offgraph.feature_tables.build import build_feature_tables
    from offgraph.modeldir.version import ModelVersion

    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    spec = ModelVersion.open(models / "ml" / "1", verify_dense=False, verify_store=False).spec
    build_feature_tables(models / "ml", spec, table, progress=False)
    users, items = _by_key(table, "user_id", REQUEST_IN[1:]), _by_key(table, "movie_id", ITEM_IN[1:])
    sent = [(req["user_id"], [c["movie_id"] for c in cands[:10]]) for req, cands in requests_[:4]]
    flags = ("--served-log-rate", "1.0", "--served-log-dir", str(tmp_path / "served"))
    proc, url = serve_process(models, tmp_path / "serve.log", *flags)
    try:
        wait_ready(url, 120, proc, log=str(tmp_path / "serve.log"))
        with httpx.Client(base_url=url, timeout=30) as http:
            for i, (user, movies) in enumerate(sent):
                body = {"request": {"user_id": user}, "candidates": [{"movie_id": m} for m in movies]}
                r = http.post("/v1/models/ml:score", json=body, headers={"x-request-id": f"ids-{i}"})
                assert r.status_code == 200 and r.json()["unknown_candidates"] == 0, r.text
            deadline = time.monotonic() + 30
            while metric(http.get("/metrics").text, WRITTEN) < len(sent):
                assert time.monotonic() < deadline, "the served log's records were not all written in 30 s"
                time.sleep(0.05)
    finally:
        stop_server(proc, 60)
    outcomes = pa.table({"request_id": ["ids-1"], "movie_id": [sent[1][1][2]], "event": ["click"]})
    events = served_events(read_served(tmp_path / "served"), outcomes, spec)
    rows = [(i, user, m) for i, (user, movies) in enumerate(sent) for m in movies]
    assert events.column("user_id").to_pylist() == [user for _, user, _ in rows]
    assert events.column("movie_id").to_pylist() == [m for _, _, m in rows]
    for c in REQUEST_IN[1:]:
        assert events.column(c).to_pylist() == [users[user][c] for _, user, _ in rows], c
    for c in ITEM_IN[1:]:
        assert events.column(c).to_pylist() == [items[m][c] for _, _, m in rows], c
    assert events.column("label").to_pylist() == [int(k == len(sent[0][1]) + 2) for k in range(len(rows))]


@pytest.mark.parametrize(
    "case",
    ["no source", "two sources", "no outcomes", "outcomes without served", "label without served", "gain event alone"],
)
def test_stream_train_refuses_a_source_it_cannot_use_at_once(case, tmp_path, capsys):
    args = ["stream-train", "--model", str(tmp_path / "nowhere"), "--emit", f"spool:{tmp_path}"]
    served, outcomes, events = (
        ["--served", str(tmp_path)],
        ["--outcomes", str(tmp_path / "o.parquet")],
        ["--events", "e.parquet"],
    )
    args += {
        "no source": [],
        "two sources": [*events, *served, *outcomes],
        "no outcomes": served,
        "outcomes without served": [*events, *outcomes],
        "label without served": [*events, "--label", "gain"],
        "gain event alone": [*served, *outcomes, "--gain-event", "play"],
    }[case]
    message = {
        "no source": "give one source of events: --events FILE, or --served DIR|URL --outcomes FILE",
        "two sources": "--events and --served are two sources of events: give one",
        "no outcomes": "--served needs --outcomes FILE",
        "outcomes without served": "--outcomes goes with --served (the served log)",
        "label without served": "--label goes with --served (the served log)",
        "gain event alone": "--gain-event goes with --label gain",
    }[case]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"offgraph stream-train: error: {message}"), err


def _write_served(directory: Path, records: list[tuple]) -> None:
    """``records`` (request_id, model, version, arm, request, candidates) written by the served log's own writer
    into its spool sink, as a server writes them."""
    log = ServedLog(SpoolSink(directory), 1.0, flush_s=60.0)
    for rid, model, version, arm, req, cands in records:
        assert log.offer(rid, model, version, arm, req, cands, np.linspace(1, 0, len(cands), dtype=np.float32))
    log.close()
    assert log.written == len(records)


@pytest.mark.parametrize("case", ["a spec input missing", "an unknown arm", "outcomes of no served candidate"])
def test_stream_train_refuses_a_served_log_it_cannot_use(case, served, capsys):
    tmp, models, _, outcomes, sent, _ = served
    where = tmp / case.replace(" ", "-")
    req, cands = sent[0]
    if case == "a spec input missing":  # a served log of requests without age
        _write_served(where, [("req-0", "ml", 1, "none", {k: v for k, v in req.items() if k != "age"}, cands)])
        message = "the served log holds no request feature 'age' that the spec's fields read"
    else:
        _write_served(where, [("req-0", "ml", 1, "v1", req, cands), ("req-1", "ml", None, "prior", req, cands)])
        message = (
            "the served log has no record of the arm 'v3' (its arms: prior, v1)"
            if case == "an unknown arm"
            else "none of the outcome log's"
        )
    if case == "outcomes of no served candidate":
        pq.write_table(pa.table({"request_id": ["x"], "movie_id": [1], "event": ["click"]}), where / "o.parquet")
        outcomes = where / "o.parquet"
    (where / "spool").mkdir()
    args = ["stream-train", "--model", str(models / "ml" / "1"), "--served", str(where), "--outcomes", str(outcomes)]
    args += ["--emit", f"spool:{where / 'spool'}", "--no-progress"]
    if case == "an unknown arm":
        args += ["--arm", "v3"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("offgraph stream-train: error: "), err
    assert message in err, err
    assert not list((where / "spool").iterdir())  # nothing emitted


# -- the library on a log written by the served log's writer (no model: the spec alone) -----------------------
SPEC = parse_spec(
    {
        "model": {"embedding_dim": 4, "mlp": [4]},
        "label": "clicked",
        "group": "list",
        "time": "ts",
        "item_key": "item",
        "fields": [
            {"name": "user", "scope": "request", "op": "id", "input": "user", "rows": 100},
            {"name": "item", "scope": "item", "op": "id", "input": "item", "rows": 100},
            {"name": "tags", "scope": "item", "op": "id", "input": "tags", "rows": 100},
        ],
    }
)


def test_gain_labels_versions_and_one_type_per_feature(tmp_path):
    """label="gain": the summed play_share values of each (request, item), as the experiment report counts them;
    version= keeps that version's records; the time in seconds when asked; a key whose type varies between
    records (1 and "1") is refused, naming it."""
    a = {"item": 1, "tags": ["x", "y"]}
    b = {"item": "2", "tags": []}  # an item as text: matched to the outcome log's 2
    records = [
        ("r1", "m", 1, "none", {"user": 7}, [a, b]),
        ("r2", "m", 2, "none", {"user": 8.5}, [b]),
        ("r3", "m", 2, "none", {}, [a]),
    ]
    _write_served(tmp_path / "s", records)
    log = read_served(tmp_path / "s")
    outcomes = pa.table(
        {
            "request_id": ["r1", "r1", "r1", "r2", "r3"],
            "item": [2, 2, 1, 2, 1],
            "event": ["play_share", "play_share", "click", "click", "play_share"],
            "value": [0.25, 0.5, None, None, 1.0],
        }
    )
    with pytest.raises(LogError, match=r"'item' is not one JSON type"):  # 1 and "2": not one type
        served_events(log, outcomes, SPEC)
    b["item"] = 2  # the same records, the item now a number in every one
    _write_served(tmp_path / "t", records)
    log = read_served(tmp_path / "t")
    clicks = served_events(log, outcomes, SPEC)
    assert clicks.column_names == ["user", "item", "tags", "clicked", "ts", "list"]
    assert clicks.column("user").to_pylist() == [7.0, 7.0, 8.5, None]  # 7 and 8.5: read as numbers
    assert clicks.column("tags").to_pylist() == [["x", "y"], [], [], ["x", "y"]]
    assert clicks.column("clicked").to_pylist() == [1, 0, 1, 0]
    assert clicks.column("list").to_pylist() == ["r1", "r1", "r2", "r3"]
    gains = served_events(log, outcomes, SPEC, label="gain")
    assert gains.column("clicked").to_pylist() == [0.0, 0.75, 0.0, 1.0]
    v2 = served_events(log, outcomes, SPEC, version=2, time_unit="s")
    assert v2.column("list").to_pylist() == ["r2", "r3"]
    ns = log.column("time").cast(pa.int64()).to_pylist()[1:]
    assert v2.column("ts").to_pylist() == [ns[0] // 10**9, ns[1] // 10**9]
    with pytest.raises(LogError, match=r"no record of version 3 \(it has \[1, 2\]\)"):
        served_events(log, outcomes, SPEC, version=3)
    with pytest.raises(LogError, match="no record of the model 'other' \\(it has m\\)"):
        served_events(log, outcomes, SPEC, model="other")
    assert json.loads(log.column("request").to_pylist()[2]) == {}  # r3's request: no user, a null in the events

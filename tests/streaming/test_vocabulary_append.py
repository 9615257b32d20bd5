"""Streaming appends new ids to a served vocabulary (issue 54, item 2): a vocabulary field with ``capacity: K``
reserves rows V+1..V+K, which the exporter fills with the unknown row's values; the stream trainer gives an id the
vocabulary lacks the next free row; ``offgraph update`` appends the key with the rows of the same file, exactly
once; a scorer maps the key to its row from its next catch-up on. What would put a key on two rows, or two keys on
one row, is refused by name, and the rest of the stream goes on.

On real MovieLens ratings: the vocabularies are those of the first 3,000 ratings; the stream is the next 2,000."""

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from redis_helpers import cluster  # noqa: F401 (the module's fixture)
from server_helpers import model_server
from streaming_helpers import kill_at_a_random_point, spool_files

from offgraph.export.export import export_run
from offgraph.features import load_spec
from offgraph.features.vocabulary import write_vocabulary
from offgraph.model.train import TrainConfig, train_run
from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.scoring.scorer import Scorer
from offgraph.store import open_store
from offgraph.store.vocabulary_appends import read_appended
from offgraph.streaming.deltas import publish_delta
from offgraph.streaming.deltas import read as read_delta_file
from offgraph.streaming.sources import open_source
from offgraph.streaming.stream_train import StreamTrainConfig, open_trainer, stream_train_table
from offgraph.streaming.updater import Updater
from offgraph.streaming.updater_config import UpdaterConfig

pytestmark = pytest.mark.timeout(600)

CAPACITY = 60
MOVIE = 2  # the movie field's table id


@pytest.fixture(scope="module")
def ml(movielens_table, tmp_path_factory):
    root = tmp_path_factory.mktemp("append")
    order = np.argsort(np.asarray(movielens_table.column("timestamp").to_numpy()), kind="stable")
    table = movielens_table.take(order[:5000])
    first = table.slice(0, 3000)
    users = sorted({str(u) for u in first.column("user_id").to_pylist()})
    movies = sorted({str(m) for m in first.column("movie_id").to_pylist()})
    write_vocabulary(root / "users.txt", users)
    write_vocabulary(root / "movies.txt", movies)
    (root / "spec.yaml").write_text(
        "model: {embedding_dim: 4, mlp: [8]}\nlabel: label\ntime: timestamp\nsplit_key: user_id\nfields:\n"
        "  - {name: user, scope: request, op: id, input: user_id, vocabulary: users.txt}\n"
        "  - {name: gender, scope: request, op: id, input: gender, rows: 10}\n"
        f"  - {{name: movie, scope: item, op: id, input: movie_id, vocabulary: movies.txt, capacity: {CAPACITY}}}\n"
    )
    spec = load_spec(root / "spec.yaml")
    train_run(spec, first, TrainConfig(epochs=1, split="per-key-time"), root / "run", progress=False)
    export_run(root / "run", root / "models" / "ml" / "1", shards=2, quant="fp32", progress=False)
    events = table.slice(3000, 2000)
    seen, new = set(movies), []
    for m in map(str, events.column("movie_id").to_pylist()):  # ids the vocabulary lacks, first seen first
        if m not in seen:
            seen.add(m)
            new.append(m)
    assert len(new) > CAPACITY  # some new ids find no free row
    return {"root": root, "spec": spec, "movies": movies, "events": events, "new": new, "V": len(movies)}


def _copy(ml, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(ml["root"] / "models", models)
    return models, models / "ml" / "1"


def _dead(spool):
    return sorted(p.read_text() for p in (spool / "dead").glob("*.reason.txt"))


def test_capacity_rows_hold_the_unknown_row_and_the_spec_checks_it(ml, tmp_path):
    version = ml["root"] / "models" / "ml" / "1"
    v = ml["V"]
    assert ml["spec"].fields[MOVIE].rows == v + 1 + CAPACITY
    m = json.loads((version / "manifest.json").read_text())
    assert m["fields"][MOVIE]["rows"] == v + 1 + CAPACITY and m["spec"]["fields"][MOVIE]["capacity"] == CAPACITY
    with open_store(version / "store") as st:
        rows = np.arange(v + 1 + CAPACITY)
        vec, w, found = st.read_unique(np.full(len(rows), MOVIE, np.uint32), rows)
    assert found.all()
    np.testing.assert_array_equal(vec[v + 1 :], np.repeat(vec[:1], CAPACITY, 0))
    np.testing.assert_array_equal(w[v + 1 :], np.repeat(w[:1], CAPACITY))
    assert np.abs(vec[1 : v + 1] - vec[0]).max(1).min() > 0  # trained rows are not the unknown row's copy
    bad = (ml["root"] / "spec.yaml").read_text().replace(f"capacity: {CAPACITY}", f"capacity: {CAPACITY}, rows: 5")
    (tmp_path / "spec.yaml").write_text(bad)
    for f in ("users.txt", "movies.txt"):
        shutil.copy(ml["root"] / f, tmp_path / f)
    with pytest.raises(ValueError, match=rf"rows 5 but its vocabulary .* and capacity {CAPACITY}: rows must be"):
        load_spec(tmp_path / "spec.yaml")
    (tmp_path / "spec.yaml").write_text(bad.replace("rows: 10}", "rows: 10, capacity: 3}"))
    with pytest.raises(ValueError, match="field 'gender': 'capacity' reserves rows .* has no vocabulary"):
        load_spec(tmp_path / "spec.yaml")


def test_streamed_new_ids_are_appended_once_and_served_on_their_rows(ml, tmp_path):
    models, version = _copy(ml, tmp_path)
    v, new = ml["V"], ml["new"]
    spool = tmp_path / "spool"
    spool.mkdir()
    probe_user = ml["events"].column("user_id")[0].as_py()
    probe_gender = ml["events"].column("gender")[0].as_py()
    probe = [{"movie_id": int(m)} for m in new[: CAPACITY + 2]]  # the appended ones, then two left unknown
    cols = {
        "user_id": [probe_user] * len(probe),
        "gender": [probe_gender] * len(probe),
        "movie_id": [c["movie_id"] for c in probe],
    }
    # a scorer that follows the store while the stream is applied; it has scored the new ids on the unknown row
    follower = Scorer(version, store_mode="follow", catch_up_s=0.2, follow_interval_s=0.02, item_cache_size=1000)
    try:
        req = {"user_id": probe_user, "gender": probe_gender}
        keyed = RawCandidates.keyed(probe)  # held by their bytes in the candidate cache, as the HTTP route's are
        unknown_before = follower.score(req, keyed)
        assert np.allclose(follower.score(req, keyed), unknown_before) and follower.candidates.hits >= len(probe)
        assert np.ptp(unknown_before) < 1e-6  # all on the unknown row
        cfg = StreamTrainConfig(lr=0.05, lr_first_order=0.2, every_events=500)
        with open_trainer(model_dir=version, config=cfg) as tr:
            summary = stream_train_table(tr, ml["events"], spool, progress=False)
            predicted = tr.predict(cols, len(probe))
            assert summary["vocabulary_appended"] == {"movie": CAPACITY}
            assert tr.fg.vocabulary_unknown["movie"] > 0  # ids past the capacity stayed on the unknown row
        files = [read_delta_file(p) for p in summary["files"]]
        appended = [(f.appends[MOVIE][0], list(f.appends[MOVIE][1])) for f in files if f.appends]
        assert len(appended) >= 2  # new ids came in more than one file
        keys = [k for _, ks in appended for k in ks]
        assert keys == new[:CAPACITY]  # first seen, first given; no more than the capacity
        assert [first for first, _ in appended] == list(np.cumsum([v + 1] + [len(ks) for _, ks in appended])[:-1])
        held = v + 1
        for f in files:  # a file writes the rows of keys it appends or that were appended before, no other
            held += len(f.appends.get(MOVIE, (0, ()))[1])
            assert (f.rows[f.table_ids == MOVIE] < held).all()

        res = Updater(models, "ml", open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
        assert res["files_applied"] == len(files) and res["files_dead_lettered"] == 0, res
        with open_store(version / "store", mode="r") as st:
            assert read_appended(st, MOVIE) == new[:CAPACITY]
            assert read_appended(st, 0) == []  # the user field has no capacity

        # the follower maps the keys at its next catch-up: the new ids leave the unknown row (its candidate
        # cache held them scored there)
        deadline = time.monotonic() + 20
        while True:
            served = follower.score(req, RawCandidates.keyed(probe))
            if np.abs(served[:CAPACITY] - predicted[:CAPACITY]).max() < 1e-5 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        np.testing.assert_allclose(served[:CAPACITY], predicted[:CAPACITY], rtol=1e-5, atol=1e-6)
        assert np.abs(served[:CAPACITY] - unknown_before[:CAPACITY]).max() > 1e-3
        ids = follower.features(req, probe).fields[MOVIE].ids
        np.testing.assert_array_equal(ids, np.r_[np.arange(v + 1, v + 1 + CAPACITY), 0, 0])
    finally:
        follower.close()

    # a scorer opened afterwards reads the appends with the store; the two ids past the capacity are unknown
    with Scorer(version) as sc:
        again = sc.score(req, probe)
        np.testing.assert_allclose(again, predicted, rtol=1e-5, atol=1e-6)
        assert sc.stats()["vocabulary_unknown:movie"] == 2

    # exactly once: the same files sent again (new names: the updater takes them for new files) change nothing
    for p in summary["files"]:
        publish_delta(spool, **_kwargs(read_delta_file(spool / "applied" / Path(p).name)))
    res = Updater(models, "ml", open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
    assert res["files_applied"] == len(files) and res["files_dead_lettered"] == 0, res
    with open_store(version / "store", mode="r") as st:
        assert read_appended(st, MOVIE) == new[:CAPACITY]

    # /metrics shows the rows a field has left: none after the stream, all of them in the version as exported
    for pristine, free in ((models, 0), (ml["root"] / "models", CAPACITY)):
        with model_server(pristine, tmp_path / f"srv{free}") as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            text = c.get("/metrics").text
        got = [x for x in text.splitlines() if x.startswith("offgraph_vocabulary_free_rows{")]
        assert got == [f'offgraph_vocabulary_free_rows{{field="movie",model="ml"}} {float(free)}'], got

    # a second stream continues from the stored appends: the trainer reads them, no id gets a second row
    with open_trainer(model_dir=version, config=StreamTrainConfig(lr=0.05)) as tr:
        assert tr.fg.appended["movie"].keys == new[:CAPACITY] and tr.fg.appended["movie"].free == 0
        again = stream_train_table(tr, ml["events"].slice(0, 300), spool, progress=False)
        assert not tr.fg.has_new_keys and again["vocabulary_appended"] == {"movie": CAPACITY}


def _kwargs(b):
    return dict(
        model=b.model,
        model_version=b.model_version,
        table_ids=b.table_ids,
        rows=b.rows,
        vectors=b.vectors,
        first_order=b.first_order,
        seqs=b.seqs,
        event_time_ms=b.event_time_ms,
        vocabulary_appends={t: (first, list(keys)) for t, (first, keys) in b.appends.items()} or None,
    )


def test_appends_that_would_put_a_key_on_two_rows_are_refused_by_name(ml, tmp_path):
    models, version = _copy(ml, tmp_path)
    v, movies = ml["V"], ml["movies"]
    spool = tmp_path / "spool"
    d = 4
    first = v + 1

    seqs = itertools.count(1)

    def delta(appends, rows=(), table=MOVIE):
        rows = np.asarray(rows, np.int64)
        publish_delta(
            spool,
            model="ml",
            model_version=1,
            table_ids=np.full(len(rows), table, np.uint32),
            rows=rows,
            vectors=np.full((len(rows), d), 0.5, np.float32),
            first_order=np.zeros(len(rows), np.float32),
            seqs=np.array([next(seqs) for _ in rows], np.int64),
            event_time_ms=1,
            vocabulary_appends=appends,
        )

    delta({MOVIE: (first, ["9001", "9002"])}, [first, first + 1])  # good: the first two free rows
    delta({0: (5, ["u1"])})  # the user field has no capacity
    delta({MOVIE: (first + 3, ["9004"])}, [first + 3])  # skips row first + 2
    delta({MOVIE: (first, ["9005"])})  # row first holds 9001
    delta({MOVIE: (first + 2, [movies[0]])})  # in the file's vocabulary
    delta({MOVIE: (first + 2, ["9001"])})  # 9001 has a row
    delta({MOVIE: (first + 2, [f"n{i}" for i in range(CAPACITY)])})  # past the capacity
    delta({MOVIE: (first + 2, ["x", "x"])})  # twice in one file
    delta(None, [first + 2])  # a reserved row no key holds yet: written (over Kafka it may come before its append)
    delta({MOVIE: (first, ["9001", "9002", "9003"])}, [first + 2])  # repeats two, appends one: good
    res = Updater(models, "ml", open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
    assert res["files_applied"] == 3 and res["files_dead_lettered"] == 7, res
    reasons = "\n".join(_dead(spool))
    for want in (
        "field 'user', which has no vocabulary capacity",
        f"the keys start at row {first + 3}, but the next free row is {first + 2}",
        f"row {first} already holds key '9001', not '9005'",
        f"key '{movies[0]}' is in the vocabulary file already (row 1)",
        f"key '9001' already has row {first}",
        f"go past the field's {CAPACITY} rows for appended keys",
        "key 'x' is appended twice",
    ):
        assert want in reasons, (want, reasons)
    with open_store(version / "store", mode="r") as st:
        assert read_appended(st, MOVIE) == ["9001", "9002", "9003"]
    with Scorer(version) as sc:
        ids = sc.features({"user_id": 1, "gender": "M"}, [{"movie_id": m} for m in (9001, 9003, 9004)]).fields
        np.testing.assert_array_equal(ids[MOVIE].ids, [first, first + 2, 0])


def test_appends_survive_kill9_of_the_updater_exactly_once(ml, tmp_path):
    """60 files, each appending one key with its row (and other rows), applied by `offgraph update` killed -9 three
    times at random: every key on its own row, in order, in both shards, each row at its last value."""
    models, version = _copy(ml, tmp_path)
    v, spool = ml["V"], tmp_path / "spool"
    rng = np.random.default_rng(5)
    want_rows: dict[tuple[int, int], np.ndarray] = {}
    for i in range(CAPACITY):
        t = np.r_[MOVIE, rng.integers(0, 2, 9)].astype(np.uint32)  # the new key's row, and user/gender rows
        r = np.r_[v + 1 + i, rng.integers(1, 10, 9)].astype(np.int64)
        r[1:][t[1:] == 0] = rng.integers(1, 30, int((t[1:] == 0).sum()))  # user rows (36 users)
        _, first = np.unique(t.astype(np.int64) * 10**9 + r, return_index=True)
        t, r = t[np.sort(first)], r[np.sort(first)]  # one delta per row in a file
        vec = rng.normal(size=(len(r), 4)).astype(np.float32)
        for j in range(len(r)):
            want_rows[(int(t[j]), int(r[j]))] = vec[j]
        publish_delta(
            spool,
            model="ml",
            model_version=1,
            table_ids=t,
            rows=r,
            vectors=vec,
            first_order=vec[:, 0].copy(),
            seqs=np.full(len(r), 100 + i, np.int64),
            event_time_ms=1,
            vocabulary_appends={MOVIE: (v + 1 + i, [f"k{i}"])},
        )
    cmd = [sys.executable, "-m", "offgraph.cli", "update", "--models", str(models), "--model", "ml"]
    cmd += ["--source", f"spool:{spool}", "--once", "--max-deltas-per-s", "150"]  # ~4 s: room for the kills
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    log = open(tmp_path / "update.log", "ab")
    kills, rnd = 0, random.Random(11)
    applied = lambda: len(spool_files(spool / "applied"))  # noqa: E731
    for _ in range(8):
        if kills >= 3 or applied() == CAPACITY:
            break
        done = applied()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        kills += kill_at_a_random_point(p, 2, rnd, lambda: True, lambda: applied() > done)  # mid-apply
    assert kills >= 3, f"the updater finished before it could be killed 3 times ({kills})"
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, timeout=120)
    assert p.returncode == 0 and applied() == CAPACITY and not list((spool / "dead").glob("*")), p.stdout
    keys = [f"k{i}" for i in range(CAPACITY)]
    with open_store(version / "store", mode="r") as st:
        assert read_appended(st, MOVIE) == keys
        for s in range(st.config.shards):  # every shard holds every append, not only the fullest one
            assert st.get_metas([f"vocabulary/{MOVIE}/n".encode()], s) == [str(CAPACITY).encode()]
        t = np.array([k[0] for k in want_rows], np.uint32)
        r = np.array([k[1] for k in want_rows], np.int64)
        got, _, found = st.read_unique(t, r)
    assert found.all()
    np.testing.assert_array_equal(got, np.stack(list(want_rows.values())))


def test_a_crash_between_shard_batches_leaves_no_shard_without_the_appends(ml, tmp_path):
    """Shard 0 recorded a file's rows, position and appends, shard 1 did not (the updater died between them): the
    restarted updater re-applies the file to shard 1 only, appends included, then applies the next file."""
    from offgraph.store import shard_of
    from offgraph.store.vocabulary_appends import appends_meta

    models, version = _copy(ml, tmp_path)
    v, spool = ml["V"], tmp_path / "spool"
    first = v + 1
    vec = np.arange(16, dtype=np.float32).reshape(4, 4)
    common = dict(model="ml", model_version=1, first_order=np.zeros(2, np.float32), event_time_ms=1)
    f1 = publish_delta(
        spool,
        table_ids=np.array([MOVIE, MOVIE], np.uint32),
        rows=np.array([first, first + 1]),
        vectors=vec[:2],
        seqs=np.array([5, 5]),
        vocabulary_appends={MOVIE: (first, ["k0", "k1"])},
        **common,
    )
    publish_delta(
        spool,
        table_ids=np.array([MOVIE, 0], np.uint32),
        rows=np.array([first + 2, 1]),
        vectors=vec[2:],
        seqs=np.array([6, 6]),
        vocabulary_appends={MOVIE: (first + 2, ["k2"])},
        **common,
    )
    b = read_delta_file(f1)
    in0 = shard_of(b.table_ids, b.rows, 2) == 0
    with open_store(version / "store", mode="w") as st:
        st.write(
            b.table_ids[in0],
            b.rows[in0],
            b.vectors[in0],
            b.first_order[in0],
            seqs=b.seqs[in0],
            meta={b"spool_position": f1.name.encode(), **appends_meta(MOVIE, 0, ["k0", "k1"])},
            meta_shards=0,
        )
    res = Updater(models, "ml", open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
    assert res["files_applied"] == 2 and res["files_dead_lettered"] == 0, res
    with open_store(version / "store", mode="r") as st:
        keys = [f"vocabulary/{MOVIE}/{i}".encode() for i in range(3)] + [f"vocabulary/{MOVIE}/n".encode()]
        for s in (0, 1):
            assert st.get_metas(keys, s) == [b"k0", b"k1", b"k2", b"3"], s
        got, _, found = st.read_unique(
            np.array([MOVIE] * 3 + [0], np.uint32), np.array([first, first + 1, first + 2, 1])
        )
    assert found.all()
    np.testing.assert_array_equal(got, vec)


def test_appends_over_kafka_keep_their_order_across_partitions(ml, tmp_path):
    """stream-train -> a 4-partition topic of a real broker -> offgraph update (a thread): every append applied in
    order, none dead-lettered, and the store serves what the trainer predicts."""
    from offgraph.streaming.sinks import open_sink
    from offgraph.testing.tansu import tansu_broker

    models, version = _copy(ml, tmp_path)
    v, new = ml["V"], ml["new"]
    user, gender = ml["events"].column("user_id")[0].as_py(), ml["events"].column("gender")[0].as_py()
    probe = [{"movie_id": int(m)} for m in new[:CAPACITY]]
    cols = {"user_id": [user] * CAPACITY, "gender": [gender] * CAPACITY, "movie_id": [p["movie_id"] for p in probe]}
    with tansu_broker(tmp_path / "tansu.log") as broker:
        url = f"kafka://{broker}/deltas"
        sink = open_sink(url, version_dir=version, partitions=4)
        with open_trainer(model_dir=version, config=StreamTrainConfig(lr=0.05, every_events=250)) as tr:
            stream_train_table(tr, ml["events"], sink, progress=False)
            predicted = tr.predict(cols, CAPACITY)
        sink.close()
        up = Updater(models, "ml", open_source(url), UpdaterConfig())
        up.start()
        runner = threading.Thread(target=up.run, daemon=True)
        runner.start()
        try:
            t_end, got = time.monotonic() + 60, []
            while time.monotonic() < t_end:
                got = read_appended(up.live.store, MOVIE)
                if got == new[:CAPACITY] and up.source.backlog().items == 0:
                    break
                time.sleep(0.1)
            assert got == new[:CAPACITY] and up.metrics.files_dead == 0
        finally:
            up.stop()
            runner.join(30)
    with Scorer(version) as sc:
        served = sc.score({"user_id": user, "gender": gender}, probe)
        ids = sc.features({"user_id": user, "gender": gender}, probe).fields[MOVIE].ids
    np.testing.assert_array_equal(ids, np.arange(v + 1, v + 1 + CAPACITY))
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)


def test_a_kafka_delta_carries_its_appends_on_partition_0_with_the_new_keys_rows():
    from offgraph.streaming.kafka.messages import encode_messages

    rows = np.arange(100, 140)
    t = np.where(rows % 2 == 0, MOVIE, 0).astype(np.uint32)
    delta = dict(
        model="ml",
        model_version=1,
        table_ids=t,
        rows=rows,
        vectors=np.ones((40, 4), np.float32),
        first_order=np.zeros(40, np.float32),
        seqs=np.arange(40),
        event_time_ms=1,
        vocabulary_appends={MOVIE: (110, ["a", "b", "c"])},  # rows 110..112 of the movie field
    )
    messages = [(p, read_delta_file(value), dict(h)) for p, value, h in encode_messages(delta, 4, max_bytes=5000)]
    assert {p for p, _, _ in messages} == {0, 1, 2, 3} and sum(len(b) for _, b, _ in messages) == 40
    carrying = [(p, b, h) for p, b, h in messages if b.appends]
    assert len(carrying) == 1 and carrying[0][0] == 0 and carrying[0][1].appends == {MOVIE: (110, ("a", "b", "c"))}
    assert carrying[0][2]["offgraph.delta.version"] == b"2"
    assert all(h["offgraph.delta.version"] == b"1" for _, b, h in messages if not b.appends)
    first_of_0 = next(b for p, b, _ in messages if p == 0)
    assert first_of_0.appends  # the first message of partition 0: before any later row of these keys there
    new_rows = np.concatenate(
        [b.rows[(b.table_ids == MOVIE) & (b.rows >= 110) & (b.rows <= 112)] for p, b, _ in messages if p == 0]
    )
    assert sorted(new_rows) == [110, 112]  # the even rows 110 and 112 are the movie field's; all on partition 0


def test_appends_into_a_redis_cluster_store(ml, tmp_path, cluster):  # noqa: F811
    """The same stream into a version whose rows live in a real Redis Cluster: the appends are meta records of its
    shards like the positions, and a scorer opened afterwards serves the new ids on their rows."""
    models = tmp_path / "models"
    version = models / "ml" / "1"
    export_run(ml["root"] / "run", version, shards=3, quant="fp32", progress=False, backend=cluster.url)
    spool = tmp_path / "spool"
    spool.mkdir()
    v, new = ml["V"], ml["new"]
    user, gender = ml["events"].column("user_id")[0].as_py(), ml["events"].column("gender")[0].as_py()
    probe = [{"movie_id": int(m)} for m in new[:CAPACITY]]
    cols = {"user_id": [user] * CAPACITY, "gender": [gender] * CAPACITY, "movie_id": [p["movie_id"] for p in probe]}
    with open_trainer(model_dir=version, config=StreamTrainConfig(lr=0.05, every_events=500)) as tr:
        stream_train_table(tr, ml["events"], spool, progress=False)
        predicted = tr.predict(cols, CAPACITY)
    res = Updater(models, "ml", open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
    assert res["files_dead_lettered"] == 0 and res["files_applied"] >= 4, res
    with Scorer(version) as sc:
        assert sc.fg.appended["movie"].keys == new[:CAPACITY]
        ids = sc.features({"user_id": user, "gender": gender}, probe).fields[MOVIE].ids
        served = sc.score({"user_id": user, "gender": gender}, probe)
    np.testing.assert_array_equal(ids, np.arange(v + 1, v + 1 + CAPACITY))
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)

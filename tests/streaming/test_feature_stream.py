"""Feature-row deltas through the real `offgraph update` (spool and Kafka): a streamed item change is served
within 1 s exactly as recomputed by hand; exactly once over kill -9 and replays; bad files to dead letters."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from server_helpers import ThreadServer, copy_models, score, server_config, wait_for

from offgraph.feature_tables.build import build_feature_tables
from offgraph.feature_tables.db import LOADED_SEQ, FeatureDB, encode_row, row_key, table_dir
from offgraph.scoring.scorer import Scorer
from offgraph.streaming.deltas import publish_feature_delta
from offgraph.streaming.sources import SPOOL_POSITION_KEY
from offgraph.testing.tansu import tansu_broker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def models(tiny_model, tmp_path):
    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    with Scorer(models / "ml" / "1", verify=False) as s:
        spec = s.spec
    build_feature_tables(models / "ml", spec, table, progress=False)
    return models


def _update(models, source, *args):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "update",
            "--models",
            str(models),
            "--model",
            "ml",
            "--source",
            source,
            *args,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(proc, sig=signal.SIGTERM) -> str:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    return out


def _row(cand, **change):
    return {
        "movie_id": cand["movie_id"],
        "genres": cand["genres"],
        "title_words": cand["title_words"],
        "release_year": cand["release_year"],
        **change,
    }


def test_streamed_item_change_is_served_within_1s_as_recomputed(models, requests_, tmp_path):
    request, cands = requests_[0]
    ids = {"request": {"user_id": request["user_id"]}, "candidates": [{"movie_id": c["movie_id"]} for c in cands]}
    new = _row(cands[0], release_year=1931, genres=["Western", "Drama"])
    with Scorer(models / "ml" / "1") as by_hand:  # the library scorer, every feature sent
        want = by_hand.score(request, [new, *cands[1:]]).tolist()
        before = by_hand.score(request, cands).tolist()
    spool = tmp_path / "spool"
    spool.mkdir()
    srv = ThreadServer(server_config(models))
    up = _update(models, f"spool:{spool}")
    try:
        wait_for(lambda: (models / "ml" / "updater-status.json").exists(), 60, "the updater to start")
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            assert score(client, ids).json()["scores"] == before
            t0 = time.monotonic()
            publish_feature_delta(
                spool,
                model="ml",
                table="item",
                key="movie_id",
                rows=[new],
                seqs=[1],
                event_time_ms=int(time.time() * 1000),
            )
            while (got := score(client, ids).json()["scores"]) != want:
                assert time.monotonic() - t0 < 1.0, f"not served within 1 s: {got[:2]} != {want[:2]}"
                time.sleep(0.01)
            seen = time.monotonic() - t0
            assert got[0] != before[0] and got[1:] == before[1:]
        print(f"streamed feature change served after {seen * 1000:.0f} ms")
    finally:
        out = _stop(up)
        srv.stop()
    assert up.returncode == 0, out


def test_exactly_once_stale_seqs_and_dead_letters(models, requests_, tmp_path):
    _, cands = requests_[0]
    spool = tmp_path / "spool"
    k = row_key(cands[0]["movie_id"])
    good = publish_feature_delta(
        spool,
        model="ml",
        table="item",
        key="movie_id",
        rows=[_row(cands[0], release_year=1950)],
        seqs=[5],
        event_time_ms=1,
    )
    stale = publish_feature_delta(
        spool,
        model="ml",
        table="item",
        key="movie_id",
        rows=[_row(cands[0], release_year=1960)],
        seqs=[4],
        event_time_ms=1,
    )
    row = _row(cands[1])
    row.pop("title_words")
    publish_feature_delta(spool, model="ml", table="item", key="movie_id", rows=[row], seqs=[9], event_time_ms=1)
    publish_feature_delta(
        spool, model="ml", table="actors", key="movie_id", rows=[_row(cands[1])], seqs=[9], event_time_ms=1
    )
    up = _update(models, f"spool:{spool}")
    wait_for(lambda: len(list((spool / "applied").glob("*.arrow"))) == 2, 60, "two applied files")
    wait_for(lambda: len(list((spool / "dead").glob("*.arrow"))) == 2, 10, "two dead letters")
    up.send_signal(signal.SIGKILL)  # kill -9: the positions are in the tables' own batches
    up.communicate(timeout=30)
    reasons = "".join(p.read_text() for p in (spool / "dead").glob("*.reason.txt"))
    assert "missing ['title_words']" in reasons and "table 'actors', which the live version 1" in reasons
    with FeatureDB(table_dir(models / "ml", "item"), "r") as db:
        assert db.get([k])[0]["release_year"] == 1950  # seq 5 stays; seq 4 came later but is older
        position = db.get_meta(SPOOL_POSITION_KEY)
    assert position is not None and position.decode() >= stale.name > good.name
    # a replay (the applied files delivered again) changes nothing and is acknowledged
    for f in (good, stale):
        os.replace(spool / "applied" / f.name, f)
    with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
        # a marker a re-apply would overwrite: loaded rows carry seq -1, so only the positions keep the replayed
        # seq-5 row out (the seqs alone would let it in)
        db.ingest_sorted([(k, encode_row(LOADED_SEQ, _row(cands[0], release_year=1999)))], tmp_path)
    up = _update(models, f"spool:{spool}")
    wait_for(lambda: not list(spool.glob("*.delta.arrow")), 60, "the replayed files to be consumed")
    out = _stop(up)
    assert up.returncode == 0, out
    assert len(list((spool / "dead").glob("*.arrow"))) == 2
    with FeatureDB(table_dir(models / "ml", "item"), "r") as db:
        assert db.get([k])[0]["release_year"] == 1999


def test_kafka_feature_delta_reaches_a_follower(models, requests_, tmp_path):
    from offgraph.streaming.kafka.sink import KafkaSink

    _, cands = requests_[0]
    k = row_key(cands[2]["movie_id"])
    with tansu_broker(tmp_path / "tansu.log") as broker:
        url = f"kafka://{broker}/features"
        sink = KafkaSink(url, partitions=2)
        sink.emit_features(
            model="ml",
            table="item",
            key="movie_id",
            rows=[_row(cands[2], release_year=1933)],
            seqs=[1],
            event_time_ms=1,
        )
        sink.emit_features(model="ml", table="nope", key="movie_id", rows=[_row(cands[2])], seqs=[2], event_time_ms=1)
        sink.flush()
        follower = FeatureDB(table_dir(models / "ml", "item"), "follow")
        up = _update(models, url)
        try:

            def seen():
                follower.catch_up()
                return follower.get([k])[0]["release_year"] == 1933

            wait_for(seen, 60, "the Kafka feature delta in the table")
        finally:
            out = _stop(up)
            follower.close()
        assert up.returncode == 0, out
        assert "table 'nope'" in out
        with FeatureDB(table_dir(models / "ml", "item"), "r") as db:
            assert db.get_meta(b"kafka/features/0") is not None  # the position, written with the row


def test_bad_feature_deltas_are_dead_lettered_naming_row_column_rule(models, requests_, tmp_path):
    """Bad feature values through the real updater: a value FG refuses (release_year "abc", 5,000 genres), a 1 MB
    value and two rows of one key at one seq are dead-lettered with a reason naming the delta, key, column and
    rule; the good file behind them is applied, the table keeps no bad row."""
    _, cands = requests_[0]
    spool = tmp_path / "spool"
    kw = dict(model="ml", table="item", key="movie_id", event_time_ms=1)
    ok = _row(cands[0], release_year=1951)
    publish_feature_delta(
        spool, rows=[{**ok, "release_year": "1951"}, _row(cands[1], release_year="abc")], seqs=[5, 5], **kw
    )  # a text column: numbers as text are fine, "abc" is not
    publish_feature_delta(spool, rows=[_row(cands[1], genres=[f"g{i}" for i in range(5000)])], seqs=[6], **kw)
    publish_feature_delta(spool, rows=[_row(cands[1], title_words=["w" * 1_000_000])], seqs=[7], **kw)
    publish_feature_delta(
        spool, rows=[_row(cands[2], release_year=1931), _row(cands[2], release_year=1932)], seqs=[8, 8], **kw
    )
    good = publish_feature_delta(spool, rows=[ok], seqs=[9], **kw)
    up = _update(models, f"spool:{spool}")
    try:
        wait_for(lambda: len(list((spool / "dead").glob("*.arrow"))) == 4, 60, "four dead letters")
        wait_for(lambda: (spool / "applied" / good.name).exists(), 30, "the good file applied")
    finally:
        out = _stop(up)
    assert up.returncode == 0, out
    reasons = sorted(p.read_text() for p in (spool / "dead").glob("*.reason.txt"))
    mid = cands[1]["movie_id"]
    want = [
        f"delta 1 (movie_id={mid!r}): column 'release_year' (field 'release_year'): expected a number, got 'abc'",
        f"delta 0 (movie_id={mid!r}): column 'genres' (field 'genres'): 5000 values, more than the field's "
        "max_values of 1000",
        f"delta 0 (movie_id={mid!r}): column 'title_words': a value of 1,000,000 bytes, more than the table's "
        "max_value_bytes of 65,536",
        f"deltas 0 and 1 both update movie_id='{cands[2]['movie_id']}' at seq 8 (1 such duplicates): one seq of a "
        "row must have one value",
    ]
    for w in want:
        assert sum(w in r for r in reasons) == 1, (w, reasons)
    with FeatureDB(table_dir(models / "ml", "item"), "r") as db:
        got = db.get([row_key(c["movie_id"]) for c in cands[:3]])
    assert got[0]["release_year"] == 1951 and got[1]["release_year"] == cands[1]["release_year"]
    assert got[1]["genres"] == cands[1]["genres"] and got[2]["release_year"] == cands[2]["release_year"]

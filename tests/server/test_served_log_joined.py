"""The served log of ids-only requests (candidates sending only ``movie_id``): each logged candidate holds the item
table's values FG scored it with, whether the join read them for that request or the candidate cache held the
candidate from an earlier one, and the values of the table at the request's time (a row rewritten between two
requests: each record holds the value its request was scored with). Behind a real ``offgraph serve
--served-log-rate 1.0``; the logged features re-scored by a library Scorer of the same version WITHOUT feature
tables give the served scores, fp32 exact."""

import json

import httpx
import numpy as np
import pyarrow as pa
import pytest
from polling import wait_for
from served_log_helpers import WRITTEN, metric
from server_helpers import copy_models, copy_version, serve_process, stop_server, wait_ready

from offgraph.feature_tables.build import build_feature_tables
from offgraph.feature_tables.db import FeatureDB, row_key, table_dir
from offgraph.scoring.scorer import Scorer
from offgraph.server.process.served_log_spool import read_served

pytestmark = pytest.mark.timeout(300)

ITEM = ("genres", "title_words", "release_year")


def _no_tables(m):
    m["spec"].pop("tables")
    m.pop("feature_tables")


def _source_items(table: pa.Table) -> dict:
    """movie_id -> its item features, read from the source rows with pyarrow (the table the feature tables were
    loaded from): one distinct value per movie in MovieLens, checked here."""
    cols = table.select(["movie_id", *ITEM]).to_pylist()
    out: dict = {}
    for row in cols:
        item = {k: row[k] for k in ITEM}
        assert out.setdefault(row["movie_id"], item) == item, row["movie_id"]
    return out


def test_ids_only_records_hold_the_item_tables_values_fg_saw_cached_or_not_and_at_their_time(
    tiny_model, requests_, tmp_path
):
    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    with Scorer(models / "ml" / "1", verify=False) as s:
        spec = s.spec
    build_feature_tables(models / "ml", spec, table, progress=False)
    items = _source_items(table)
    request, cands = requests_[0]
    cands = cands[:30]
    body = {"request": {"user_id": request["user_id"]}, "candidates": [{"movie_id": c["movie_id"]} for c in cands]}
    movie0 = cands[0]["movie_id"]
    # the rewrite: a year in another bucket of release_year (boundaries 1940 ... 1998), so that the score moves
    new_year = 1930 if items[movie0]["release_year"] >= 1960 else 1997
    flags = ("--served-log-rate", "1.0", "--served-log-dir", str(tmp_path / "served"))
    proc, url = serve_process(models, tmp_path / "serve.log", *flags)
    answered: dict[str, np.ndarray] = {}
    try:
        wait_ready(url, 120, proc, log=str(tmp_path / "serve.log"))
        with httpx.Client(base_url=url, timeout=30) as http:

            def send(rid: str) -> np.ndarray:
                r = http.post("/v1/models/ml:score", json=body, headers={"x-request-id": rid})
                assert r.status_code == 200, r.text
                assert r.json()["unknown_candidates"] == 0
                answered[rid] = np.float32(r.json()["scores"])
                return answered[rid]

            def hits() -> float:
                return metric(http.get("/metrics").text, "offgraph_candidate_cache_hits_total")

            first = send("joined")  # every candidate new: joined by this request
            before = hits()
            assert np.array_equal(send("cached"), first)  # every candidate held by the candidate cache
            assert hits() - before == len(cands)
            with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
                db.write([row_key(movie0)], [{**items[movie0], "release_year": new_year}], [1])
            polls = 0

            def changed() -> bool:
                nonlocal polls
                polls += 1
                return not np.array_equal(send(f"poll-{polls}"), first)

            wait_for(changed, 30, "the rewritten row served")
            after = send("after")  # held again, under the new table state
            assert np.array_equal(after[1:], first[1:]) and after[0] != first[0]
            wait_for(lambda: metric(http.get("/metrics").text, WRITTEN) == len(answered), 30, "every record written")
    finally:
        stop_server(proc, 60)

    rows = {r["request_id"]: r for r in read_served(tmp_path / "served").drop_columns(["time"]).to_pylist()}
    assert sorted(rows) == sorted(answered)
    old = [{"movie_id": c["movie_id"], **items[c["movie_id"]]} for c in cands]
    new = [{**old[0], "release_year": new_year}, *old[1:]]
    for rid in ("joined", "cached", "after", f"poll-{polls}"):
        logged = [json.loads(c) for c in rows[rid]["candidates"]]
        assert logged == (new if rid in ("after", f"poll-{polls}") else old), rid
        assert json.loads(rows[rid]["request"]) == request, rid  # the user table's values: the source row's
    for i in range(1, polls):  # polls before the catch-up scored with the old row, none with a mix
        logged = [json.loads(c) for c in rows[f"poll-{i}"]["candidates"]]
        assert logged in (old, new), i
    copy_version(models / "ml" / "1", tmp_path / "plain" / "ml" / "1", manifest_edit=_no_tables)
    with Scorer(tmp_path / "plain" / "ml" / "1") as lib:
        assert not lib.spec.tables
        for rid, row in rows.items():
            candidates = [json.loads(c) for c in row["candidates"]]
            served = np.float32(row["scores"])
            np.testing.assert_array_equal(served, answered[rid], err_msg=rid)
            rescored = np.float32(lib.score(json.loads(row["request"]), candidates))
            np.testing.assert_array_equal(rescored, served, err_msg=rid)

"""The join at serving time (offgraph/feature_tables/join.py): ids-only requests on a real exported model, real RocksDB
feature tables, the library scorer and a real uvicorn server."""

import time

import httpx
import msgspec
import numpy as np
import pytest
from server_helpers import ThreadServer, copy_models, copy_version, score, server_config

from offgraph.feature_tables.build import build_feature_tables
from offgraph.feature_tables.db import FeatureDB, decode_row, row_key, table_dir
from offgraph.feature_tables.join import IdsOnlyError
from offgraph.scoring.scorer import Scorer


@pytest.fixture()
def models(tiny_model, tmp_path):
    """The tiny model, with its user and item tables loaded from every row of its table."""
    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    s = Scorer(models / "ml" / "1", verify=False)
    spec = s.spec
    s.close()
    build_feature_tables(models / "ml", spec, table, progress=False)
    return models


def _ids_only(request, cands):
    return {"user_id": request["user_id"]}, [{"movie_id": c["movie_id"]} for c in cands]


def test_ids_only_scores_exactly_as_full_features(models, requests_):
    with Scorer(models / "ml" / "1") as s:
        for request, cands in requests_[:30]:
            full = s.score(request, cands)
            r, c = _ids_only(request, cands)
            ids, joined = s.score_joined(r, c)
            assert joined.unknown_candidates == 0 and not joined.unknown_request
            np.testing.assert_array_equal(ids, full)  # |delta| = 0, not a tolerance


def test_body_values_override_stored_ones(models, requests_):
    request, cands = requests_[0]
    with Scorer(models / "ml" / "1") as s:
        r, c = _ids_only(request, cands)
        c[0]["release_year"] = 1931  # sent: wins over the stored year
        c[1]["genres"] = None  # sent as null: no value, not the stored genres
        r["gender"] = "F" if request["gender"] == "M" else "M"
        got = s.score(r, c)
        changed = [dict(x) for x in cands]
        changed[0]["release_year"] = 1931
        changed[1]["genres"] = None
        want = s.score({**request, "gender": r["gender"]}, changed)
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, s.score(request, cands))  # the override did change scores


def test_unknown_keys_fill_nothing_and_are_counted(models, requests_):
    request, cands = requests_[0]
    with Scorer(models / "ml" / "1") as s:
        r, c = _ids_only(request, cands)
        c[1] = {"movie_id": 987654321}
        c.append({"genres": ["Drama"]})  # no key: nothing looked up, not counted
        got, joined = s.score_joined({"user_id": 99999999}, c)
        assert joined.unknown_candidates == 1 and joined.unknown_request
        no_values = [dict(x) for x in cands] + [{"genres": ["Drama"]}]
        no_values[1] = {"movie_id": 987654321, "genres": None, "title_words": None, "release_year": None}
        want = s.score({"user_id": 99999999}, no_values)
        np.testing.assert_array_equal(got, want)


def test_changed_item_row_is_served_through_the_item_cache(models, requests_):
    """FG's item cache is keyed by the joined raw values: a changed row is a new key (no stale hashed ids)."""
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    with Scorer(models / "ml" / "1", store_mode="follow") as s:
        before = s.score(r, c)
        assert s.fg.cache_misses > 0
        with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
            new = {**{k: cands[0][k] for k in ("genres", "title_words")}, "release_year": 1931}
            db.write([row_key(cands[0]["movie_id"])], [new], [1])
        want = s.score(request, [{**cands[0], "release_year": 1931}, *cands[1:]])
        t0 = time.monotonic()
        while not np.array_equal(got := s.score(r, c), want):
            assert time.monotonic() - t0 < 1.0, "the change was not served within 1 s"
            time.sleep(0.02)
        assert got[0] != before[0] and np.array_equal(got[1:], before[1:])


def _drop_tables(m):
    m["spec"].pop("tables")
    m.pop("feature_tables")


def test_http_ids_only_and_the_422_of_a_model_without_tables(models, requests_):
    copy_version(models / "ml" / "1", models / "plain" / "1", manifest_edit=_drop_tables)
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            full = score(client, {"request": request, "candidates": cands}).json()
            got = score(client, {"request": r, "candidates": c + [{"movie_id": 987654321}]})
            assert got.status_code == 200, got.text
            body = got.json()
            assert body["scores"][:-1] == full["scores"] and body["unknown_candidates"] == 1
            assert full["unknown_candidates"] == 0 and body["unknown_request"] is False
            refused = score(client, {"request": r, "candidates": c}, name="plain")
            assert refused.status_code == 422, refused.text
            assert "no feature table keyed by 'movie_id'" in refused.json()["detail"]
            assert score(client, {"request": request, "candidates": cands}, name="plain").status_code == 200
            metrics = client.get("/metrics").text
            assert 'offgraph_unknown_candidates_total{model="ml"} 1.0' in metrics, metrics[-3000:]
            # the model status says which tables fill what (and the model without tables: none)
            tables = {t["name"]: t for t in client.get("/v1/models/ml").json()["feature_tables"]}
            assert tables["item"] == {
                "name": "item",
                "scope": "item",
                "key": "movie_id",
                "present": True,
                "columns": ["genres", "title_words", "release_year"],
            }, tables
            assert tables["user"]["key"] == "user_id" and tables["user"]["present"]
            assert client.get("/v1/models/plain").json()["feature_tables"] == []
    finally:
        srv.stop()


def test_library_scorer_refuses_ids_only_without_tables(models, requests_):
    copy_version(models / "ml" / "1", models / "plain" / "1", manifest_edit=_drop_tables)
    request, cands = requests_[0]
    with Scorer(models / "plain" / "1") as s:
        with pytest.raises(IdsOnlyError, match="'user_id'"):
            s.score({"user_id": 1}, cands)  # full candidates, a bare user id: the user side is refused
        s.score(request, cands + [{"movie_id": 5}])  # a full request with a candidate lacking values still scores


def test_check_ids_only_parity_on_held_out_rows_fp32(models, tiny_model):
    """`offgraph check --ids-only`: the held-out rows of the fp32 model, ids-only vs every feature sent: |dp| = 0."""
    from offgraph.export.check import run_check

    pristine, table = tiny_model
    res = run_check(models / "ml" / "1", pristine.parent / "run", table, limit=0, rows="held-out", ids_only=True)
    assert res["quant"] == "fp32" and res["rows"] > 1000
    assert res["ids_only_max_abs_dp"] == 0.0 and res["ids_only_unknown_candidates"] == 0
    assert res["max_abs_dp"] <= 1e-5 and res["ids_only_vs_keras_max_abs_dp"] <= 1e-5


def test_exporter_builds_tables_from_the_training_rows_only(tiny_model, tmp_path):
    """The latest value per key BEFORE the cut: keys seen only in held-out rows are not loaded (unknown)."""
    from offgraph.export.export import export_run
    from offgraph.export.run_split import run_held_out_mask

    pristine, table = tiny_model
    run = pristine.parent / "run"
    export_run(run, tmp_path / "m" / "ml" / "1", shards=1, quant="fp32", progress=False, feature_data=table)
    with Scorer(tmp_path / "m" / "ml" / "1") as s:
        held = run_held_out_mask(run, s.spec, table)
    train_movies = set(table.filter(~held).column("movie_id").to_pylist())
    only_held = set(table.filter(held).column("movie_id").to_pylist()) - train_movies
    assert only_held  # the per-user time split leaves some movies to held-out rows only
    with FeatureDB(table_dir(tmp_path / "m" / "ml", "item"), "r") as db:
        assert sum(1 for _ in db.rows()) == len(train_movies)
        assert db.get([row_key(m) for m in sorted(only_held)]) == [None] * len(only_held)


def test_a_missing_table_serves_unknown_until_it_is_created(tiny_model, requests_, tmp_path):
    """A version copied without its model's offgraph/features/ still loads (every key unknown, counted), and a follower
    picks the table up once it is created, rather than refusing the version for good."""
    pristine, table = tiny_model
    copy_version(pristine / "ml" / "1", tmp_path / "models" / "ml" / "1")
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    with Scorer(tmp_path / "models" / "ml" / "1", store_mode="follow") as s:
        _, joined = s.score_joined(r, c)
        assert joined.unknown_candidates == len(c) and joined.unknown_request
        build_feature_tables(tmp_path / "models" / "ml", s.spec, table, progress=False)
        want = s.score(request, cands)
        t0 = time.monotonic()
        while not np.array_equal(s.score(r, c), want):
            assert time.monotonic() - t0 < 5.0, "the created table was not picked up"
            time.sleep(0.05)


def test_a_scope_without_a_table_is_still_refused_ids_only(models, requests_):
    """A model with an item table but no user table: ids-only candidates are joined, a bare user id is a 422."""

    def item_only(m):
        m["spec"]["tables"].pop("user")
        m["feature_tables"] = [t for t in m["feature_tables"] if t["name"] != "user"]

    copy_version(models / "ml" / "1", models / "ml" / "2", manifest_edit=item_only)
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    with Scorer(models / "ml" / "2") as s:
        with pytest.raises(IdsOnlyError, match="no feature table keyed by 'user_id'"):
            s.score(r, c)
        with Scorer(models / "ml" / "1") as full:
            np.testing.assert_array_equal(s.score(request, c), full.score(request, cands))


def test_a_stored_row_fg_refuses_is_scored_as_unknown_never_a_422(models, requests_):
    """Bad stored values at read time: rows written around the writers' checks (straight through FeatureDB.write) with
    values FG refuses: the candidate (or the request's user row) is scored exactly as an unknown key, counted on
    /metrics, and the other candidates score as before; a value the CALLER sends that FG refuses is still a 422."""
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    bad_item, bad_genres = cands[0]["movie_id"], cands[1]["movie_id"]
    with Scorer(models / "ml" / "1") as s:
        rest = s.score(request, cands[2:]).tolist()  # the same batch as served (its size moves the last float bits)
        none = {"genres": None, "title_words": None, "release_year": None}
        as_unknown = s.score(
            request, [{"movie_id": bad_item, **none}, {"movie_id": bad_genres, **none}, *cands[2:]]
        ).tolist()
        user_unknown = s.score(
            {"user_id": request["user_id"], "age": None, "gender": None, "occupation": None, "zip_prefix": None},
            cands[2:],
        ).tolist()
    with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
        db.write(
            [row_key(bad_item), row_key(bad_genres)],
            [
                {**{k: cands[0][k] for k in ("genres", "title_words")}, "release_year": "abc"},
                {"genres": [f"g{i}" for i in range(5000)], "title_words": [], "release_year": 1990},
            ],
            [1, 1],
        )
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            others = score(client, {"request": r, "candidates": c[2:]})
            assert others.status_code == 200 and others.json()["scores"] == rest  # other items: unaffected
            got = score(client, {"request": r, "candidates": c})
            assert got.status_code == 200, got.text
            assert got.json()["scores"] == as_unknown and got.json()["unknown_candidates"] == 2
            with FeatureDB(table_dir(models / "ml", "user"), "w") as db:  # the request's own row
                db.write([row_key(request["user_id"])], [{"age": "abc", "gender": "M"}], [1])
            t0 = time.monotonic()
            while (got := score(client, {"request": r, "candidates": c[2:]})).json().get("unknown_request") is not True:
                assert time.monotonic() - t0 < 5, got.text  # the server follows the table (0.2 s catch-ups)
                time.sleep(0.05)
            assert got.status_code == 200 and got.json()["scores"] == user_unknown, got.text
            sent = score(client, {"request": r, "candidates": [{**c[2], "release_year": "abc"}]})
            assert sent.status_code == 422 and "expected a number, got 'abc'" in sent.json()["detail"], sent.text
            metrics = client.get("/metrics").text
            # 2 items, the user row, and the user row again in the 422 (screened before the body was found at fault)
            assert 'offgraph_unusable_feature_rows_total{model="ml"} 4.0' in metrics, metrics[-3000:]
            # a rewritten row is read again (the server remembers a bad row by its value's hash, not its key)
            with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
                db.write(
                    [row_key(bad_item)], [{k: cands[0][k] for k in ("genres", "title_words", "release_year")}], [2]
                )
            t0 = time.monotonic()
            while (got := score(client, {"request": r, "candidates": c[:1]})).json()["unknown_candidates"] != 0:
                assert time.monotonic() - t0 < 5, got.text
                time.sleep(0.05)
    finally:
        srv.stop()


def test_a_stored_record_that_cannot_be_decoded_or_read_is_scored_as_unknown(models, requests_):
    """Records written around every writer (straight into the table's RocksDB): bytes that are no record at all,
    and a record whose value is bytes that are not UTF-8 (FG could not read either). Each candidate is scored
    exactly as an unknown key and counted as unusable, the others as before: never an exception (a 500)."""
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    garbage, not_utf8 = cands[0]["movie_id"], cands[1]["movie_id"]
    with Scorer(models / "ml" / "1") as s:
        none = {"genres": None, "title_words": None, "release_year": None}
        want = s.score(request, [{"movie_id": garbage, **none}, {"movie_id": not_utf8, **none}, *cands[2:]]).tolist()
    with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
        db._db[row_key(garbage)] = b"\xc1 not a msgpack record"
        db._db[row_key(not_utf8)] = msgspec.msgpack.encode(
            (1, {"genres": [b"\xff\xfe"], "title_words": [], "release_year": 1990})
        )
    with Scorer(models / "ml" / "1") as s:
        got, joined = s.score_joined(r, c)
        assert got.tolist() == want
        assert joined.unknown_candidates == 2 and joined.unusable == 2
        again, joined = s.score_joined(r, c)  # the second time too (the bad record is remembered or re-read)
        assert again.tolist() == want and joined.unusable == 2


class _Int(int):
    pass


EDGE_KEYS = [True, False, np.bool_(True), 0, 1, -5, 3, 3.0, -0.0, np.int64(3), np.float32(3.0), _Int(7), 2**70]
EDGE_KEYS += [float(2**70), -(2**70), 0.5, float("inf"), float("-inf"), float("nan"), "", "3", "0.5", "inf", "true"]
EDGE_KEYS += ["ünï 🎬", "-5", " 3", b"3", b"", None, [3], (3,), {}]


def test_row_keys_are_row_key_on_edge_values():
    from offgraph.feature_tables.db import row_keys

    assert row_keys(EDGE_KEYS) == [row_key(v) for v in EDGE_KEYS]
    assert row_keys([True, 1, 3.0, "3", -0.0]) == [b"ktrue", b"k1", b"k3", b"k3", b"k0"]
    for bad in ("\ud800", object()):  # what row_key refuses, row_keys refuses alike
        with pytest.raises((UnicodeEncodeError, TypeError)) as want:
            row_key(bad)
        with pytest.raises(want.type):
            row_keys([1, bad])


def _reference_fill(join, request, candidates):
    """The join's rules (module docstring) one table and one candidate at a time, with row_key and one read each."""

    def read(t, body):
        """(looked up and no usable row, the row's values the body lacks)."""
        k = row_key(body[t.key]) if t.key in body else None
        db = join.dbs.get(t.name)
        v = db.get_raw([k])[0] if k is not None and db is not None else None
        if v is None:
            return k is not None, {}
        if all(c in body for c in t.columns):  # nothing to fill: the row is not read
            return False, {}
        try:
            row = decode_row(v)
        except msgspec.DecodeError:
            return True, {}
        return False, {c: row[c] for c in t.columns if c not in body and c in row}

    request, unknown_request = dict(request), False
    for t in join.request_tables:
        lacking, filled = read(t, request)
        unknown_request |= lacking
        request.update(filled)
    out, unknown = [], 0
    for cand in candidates:
        cand, lacking = dict(cand), False
        for t in join.item_tables:
            no_row, filled = read(t, cand)
            lacking |= no_row
            cand.update(filled)
        out.append(cand)
        unknown += lacking
    return request, out, unknown, unknown_request


def _typed(rows):
    """Rows compared by value and type (True is not 1, 3.0 is not 3, NaN is NaN), in any key order."""
    return [{k: repr(v) for k, v in r.items()} for r in rows]


def test_join_equals_a_per_candidate_reference_on_edge_keys_and_values(models, requests_):
    """The batched join (row_keys, one multi_get, rows read only for candidates lacking a column) against the
    reference above: every edge key type, known, unknown, no value, a list, an absent key; bodies sending none,
    some or all of the columns, extra columns, nulls; a record that cannot be decoded."""
    request, cands = requests_[0]
    stored = [True, 0, 1, -5, 3, 2**70, -(2**70), 0.5, float("inf"), "ünï 🎬", "true-ish"]
    corrupt = 424242
    with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
        db.write(
            [row_key(k) for k in stored],
            [
                {"genres": [f"g{i}", "Drama"], "title_words": [f"w{i}"], "release_year": 1900 + i}
                if i % 3
                else {"genres": [f"g{i}"], "release_year": float(1900 + i)}  # a row lacking a column: no value
                for i in range(len(stored))
            ],
            [1] * len(stored),
        )
        db._db[row_key(corrupt)] = b"\xc1 not a msgpack record"
    bodies = [
        {},
        {"genres": ["Sent"]},
        {"genres": None, "title_words": [], "release_year": 1931},  # every column sent: the body wins whole
        {"release_year": None, "extra": "x"},
    ]
    keys = [*EDGE_KEYS[:-5], corrupt, 987654321, [3]]  # (bytes and mappings aside: FG reads neither as an id)
    cands = [{"movie_id": k, **b} for k in keys for b in bodies]
    cands += [{"genres": ["Drama"]}, {"title_words": ["no", "key"], "release_year": 1990}]
    sent = [dict(c) for c in cands]
    with Scorer(models / "ml" / "1") as s:
        for req in ({"user_id": request["user_id"]}, {"user_id": 99999999, "gender": "F"}, dict(request), {}):
            want_req, want, want_unknown, want_unknown_req = _reference_fill(s.join, req, cands)
            got = s.join.fill(req, cands)
            assert _typed(got.candidates) == _typed(want)
            assert _typed([got.request]) == _typed([want_req])
            assert (got.unknown_candidates, got.unknown_request) == (want_unknown, want_unknown_req)
            assert got.unusable == sum(1 for c in cands if c.get("movie_id") == corrupt and len(c) < 4)
            assert _typed(cands) == _typed(sent)  # the caller's dicts are never changed

"""The candidate cache (offgraph/scoring/candidate_cache.py): candidates scored from their bytes as sent, on a real
exported model with real RocksDB feature tables, against the same scorer given dicts (the library's ``score`` on
decoded candidates: the one path, nothing held); its refusals, its bound, and what a changed feature table does to it."""

import gc
import json
import time
import tracemalloc

import numpy as np
import pytest
from server_helpers import copy_models

from offgraph.feature_tables.build import build_feature_tables
from offgraph.feature_tables.db import FeatureDB, row_key, table_dir
from offgraph.feature_tables.join import IdsOnlyError
from offgraph.features.fg import FeatureValueError, ScopeError
from offgraph.scoring.candidate_cache import CandidateCache, entry_bytes
from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.scoring.scorer import Scorer
from offgraph.server.api.schemas import ScoreRequest
from offgraph.server.api.score_body import ScoreBodyParser
from offgraph.server.http.errors import BodyValidationError

RAW = ScoreBodyParser(ScoreRequest, 2000)


@pytest.fixture()
def models(tiny_model, tmp_path):
    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    s = Scorer(models / "ml" / "1", verify=False)
    spec = s.spec
    s.close()
    build_feature_tables(models / "ml", spec, table, progress=False)
    return models


def _body(request, cands) -> bytes:
    return json.dumps({"request": request, "candidates": cands}).encode()


def _both(raw_scorer, dict_scorer, request, cands):
    """(raw path's scores and join result, dict path's), each body parsed as the server parses it."""
    body = _body(request, cands)
    raw = RAW.validate(body)
    assert isinstance(raw.candidates, RawCandidates)
    plain = json.loads(body)  # the library's dicts: the same path, no bytes to hold them by
    return raw_scorer.score_joined(raw.request, raw.candidates), dict_scorer.score_joined(
        plain["request"], plain["candidates"]
    )


def _ids_only(request, cands):
    return {"user_id": request["user_id"]}, [{"movie_id": c["movie_id"]} for c in cands]


def test_raw_candidates_score_exactly_as_decoded_ones_cold_and_cached(models, requests_):
    with Scorer(models / "ml" / "1") as raw, Scorer(models / "ml" / "1") as plain:
        for _ in range(2):  # cold, then every candidate held
            for request, cands in requests_[:30]:
                for r, c in ((request, cands), _ids_only(request, cands)):
                    (got, gj), (want, wj) = _both(raw, plain, r, c)
                    np.testing.assert_array_equal(got, want)  # bit for bit, not a tolerance
                    assert (gj.unknown_candidates, gj.unknown_request) == (wj.unknown_candidates, wj.unknown_request)
        assert raw.candidates.hits > 0 and len(raw.candidates) > 0
        assert raw.stats()["ignored_keys"] == plain.stats()["ignored_keys"]


def test_edge_candidates_unknown_keys_repeats_extras_and_bools(models, requests_):
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    odd = [
        c[0],
        c[0],  # the same candidate twice in one request
        {"movie_id": 987654321},  # a key with no row: unknown, counted
        {"genres": ["Drama"]},  # no key: nothing looked up, not counted
        {**cands[1], "not_an_input": 3, "also_not": [1, 2]},  # ignored keys, counted
        {"movie_id": cands[2]["movie_id"], "genres": [True, "Drama"]},  # a bool: FG's exact item-cache key
        {"movie_id": cands[3]["movie_id"], "genres": None, "release_year": 1931.0},  # sent values win
        {"movie_id": True},
    ]
    with Scorer(models / "ml" / "1") as raw, Scorer(models / "ml" / "1") as plain:
        for _ in range(2):
            (got, gj), (want, wj) = _both(raw, plain, r, odd)
            np.testing.assert_array_equal(got, want)
            assert gj.unknown_candidates == wj.unknown_candidates == 2
            assert got[0] == got[1]
        assert raw.stats()["ignored_keys"] == plain.stats()["ignored_keys"] == 4


def test_refusals_are_the_dict_paths_even_beside_held_candidates(models, requests_):
    request, cands = requests_[0]
    with Scorer(models / "ml" / "1") as s:
        s.score_joined(request, RAW.validate(_body(request, cands)).candidates)  # every candidate now held
        cases = [
            ({**cands[1], "gender": "M"}, ScopeError, "input 'gender' sent in candidates[1]"),
            ({**cands[1], "release_year": "abc"}, FeatureValueError, "candidates[1]: expected a number, got 'abc'"),
        ]
        for bad, err, words in cases:
            body = RAW.validate(_body(request, [cands[0], bad, *cands[2:]]))
            with pytest.raises(err, match=words.replace("[", r"\[").replace("]", r"\]")):
                s.score_joined(body.request, body.candidates)
        # a candidate the body's schema refuses: the 422 of the whole body, as the server words it
        body = RAW.validate(_body(request, [cands[0], {"genres": {"nested": 1}}]))
        with pytest.raises(BodyValidationError) as e:
            s.score_joined(body.request, body.candidates)
        assert any(err["loc"][:3] == ("body", "candidates", 1) for err in e.value.errors()), e.value.errors()


def test_ids_only_candidates_of_a_model_without_an_item_table_are_refused(models, requests_):
    from server_helpers import copy_version

    def no_item_table(m):
        m["spec"]["tables"].pop("item")
        m["feature_tables"] = [t for t in m["feature_tables"] if t["name"] != "item"]

    copy_version(models / "ml" / "1", models / "ml" / "2", manifest_edit=no_item_table)
    request, cands = requests_[0]
    ids = [{"movie_id": c["movie_id"]} for c in cands]
    with Scorer(models / "ml" / "2") as s:
        for _ in range(2):  # refused again once its candidates are held
            body = RAW.validate(_body(request, ids))
            with pytest.raises(IdsOnlyError, match="no feature table keyed by 'movie_id'"):
                s.score_joined(body.request, body.candidates)
        body = RAW.validate(_body(request, [*ids, cands[0]]))  # one full candidate: scored
        assert len(s.score_joined(body.request, body.candidates)[0]) == len(ids) + 1


def test_a_changed_item_row_is_served_not_the_held_candidate(models, requests_):
    """Follow mode: a streamed item row changes what an ids-only candidate joins to; the held candidate is dropped
    (the join's generation moved) and the new row is served within the join's bound."""
    request, cands = requests_[0]
    r, c = _ids_only(request, cands)
    with Scorer(models / "ml" / "1", store_mode="follow") as s:
        before = s.score_joined(r, RAW.validate(_body(r, c)).candidates)[0]
        assert len(s.candidates) == len({json.dumps(x) for x in c})
        gen = s.join.generation
        with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
            new = {**{k: cands[0][k] for k in ("genres", "title_words")}, "release_year": 1931}
            db.write([row_key(cands[0]["movie_id"])], [new], [1])
        want = s.score(request, [{**cands[0], "release_year": 1931}, *cands[1:]])
        t0 = time.monotonic()
        while not np.array_equal(got := s.score_joined(r, RAW.validate(_body(r, c)).candidates)[0], want):
            assert time.monotonic() - t0 < 1.0, "the change was not served within 1 s"
            time.sleep(0.02)
        assert s.join.generation > gen
        assert got[0] != before[0] and np.array_equal(got[1:], before[1:])


def test_an_entry_made_before_a_table_change_is_not_held():
    gen = [0]
    cache = CandidateCache(1 << 20, lambda: gen[0])
    entry = ((), b"\0" * 8, b"\0" * 16, 0, b"", False, False)
    seen, got = cache.lookup([b"a"])
    assert got == [None]
    gen[0] += 1  # the tables changed while the request joined
    cache.put(seen, [b"a"], [entry])
    assert len(cache) == 0
    seen, _ = cache.lookup([b"a"])
    cache.put(seen, [b"a"], [entry])
    assert cache.lookup([b"a"])[1] == [entry]
    gen[0] += 1
    assert cache.lookup([b"a"])[1] == [None] and cache.nbytes == 0  # a lookup under a new generation empties it


def test_the_cache_stays_within_its_bound_and_counts_what_it_holds(models, requests_):
    """What the cache counts bounds what it holds (tracemalloc, with FG's item cache emptied so that the entries
    are the candidate cache's alone), and a small bound evicts instead of growing."""
    with Scorer(models / "ml" / "1") as s:
        tracemalloc.start()
        try:
            for request, cands in requests_:
                s.score_joined(request, RAW.validate(_body(request, cands)).candidates)
            counted, held = s.candidates.nbytes, len(s.candidates)
            assert held > 500
            s.fg.release()
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            assert s.candidates.release(lambda: None) == held
            gc.collect()
            freed = before - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert freed <= counted <= 2.5 * freed, (freed, counted, held)
        assert s.memory_in_use()["item_cache"] >= 0
    with Scorer(models / "ml" / "1", item_cache_size=100) as small:
        bound = small.candidates.max_bytes
        for request, cands in requests_:
            small.score_joined(request, RAW.validate(_body(request, cands)).candidates)
            assert small.candidates.nbytes <= bound
        assert 0 < len(small.candidates) < 200


def test_requests_skip_a_full_cache_while_few_candidates_come_back_and_look_again():
    entry = ((), b"\0" * 8, b"\0" * 16, 0, b"", False, False)
    cache = CandidateCache(50 * entry_bytes(b"0-0", entry, ()), lambda: 0)  # room for about 50
    looked = 0
    for r in range(200):  # every request new candidates: looking them up and holding them costs more than it saves
        if cache.worth_it():
            looked += 1
            keys = [b"%d-%d" % (r, i) for i in range(10)]
            gen, _ = cache.lookup(keys)
            cache.put(gen, keys, [entry] * len(keys))
    assert looked < 30, looked  # until it is full, then one in PROBE_EVERY
    same = [b"same-%d" % i for i in range(10)]
    for _ in range(100):  # the same candidates again and again: the probes find them held, and requests look again
        if cache.worth_it():
            gen, got = cache.lookup(same)
            cache.put(gen, same, [entry] * len(same))
    assert all(cache.worth_it() for _ in range(20))


def test_the_score_route_serves_from_the_cache_as_the_library_scores(models, requests_):
    import httpx
    from server_helpers import ThreadServer, score, server_config

    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as client, Scorer(models / "ml" / "1") as lib:
            for request, cands in requests_[:10] * 2:
                for r, c in ((request, cands), _ids_only(request, cands)):
                    got = score(client, {"request": r, "candidates": c})
                    assert got.status_code == 200, got.text
                    assert got.json()["scores"] == lib.score(r, c).tolist()
            metrics = client.get("/metrics").text
        hits = [ln for ln in metrics.splitlines() if ln.startswith('offgraph_candidate_cache_hits_total{model="ml"}')]
        assert hits and float(hits[0].split()[-1]) >= sum(len(c) for _, c in requests_[:10]), metrics[-2000:]
    finally:
        srv.stop()


def _metric(text: str, name: str) -> float:
    line = [ln for ln in text.splitlines() if ln.startswith(f'{name}{{model="ml"}}')]
    assert line, text[-2000:]
    return float(line[0].split()[-1])


def test_the_score_route_decodes_the_bodies_a_full_cache_skips_and_scores_them_alike(models, requests_):
    """Candidates that never come back (a per-request key the model ignores) fill a small cache; then the route
    parses most bodies as plain dicts (its gate says skip), which neither look up nor count, and scores them as
    the library does; bodies that carry the held candidates again are looked up again."""
    import httpx
    from server_helpers import ThreadServer, score, server_config

    srv = ThreadServer(server_config(models, item_cache_size=40))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as client, Scorer(models / "ml" / "1") as lib:

            def looked() -> float:
                text = client.get("/metrics").text
                return _metric(text, "offgraph_candidate_cache_hits_total") + _metric(
                    text, "offgraph_candidate_cache_misses_total"
                )

            k = 0
            for request, cands in (requests_ * 4)[:64]:  # new candidates each request: the cache fills
                k += 1
                body = [{**c, "nonce": f"{k}-{i}"} for i, c in enumerate(cands)]
                got = score(client, {"request": request, "candidates": body})
                assert got.status_code == 200, got.text
            before, sent = looked(), 0
            for request, cands in (requests_ * 4)[:48]:
                k += 1
                body = [{**c, "nonce": f"{k}-{i}"} for i, c in enumerate(cands)]
                got = score(client, {"request": request, "candidates": body})
                assert got.status_code == 200, got.text
                assert got.json()["scores"] == lib.score(request, cands).tolist()
                sent += len(body)
            skipped = looked() - before
            assert skipped <= sent / 4, (skipped, sent)  # one request in PROBE_EVERY looks its candidates up
            request, cands = requests_[0]
            for _ in range(40):  # the same candidates again and again: probes find them held, lookups resume
                got = score(client, {"request": request, "candidates": cands})
                assert got.status_code == 200, got.text
            before = looked()
            got = score(client, {"request": request, "candidates": cands})
            assert got.json()["scores"] == lib.score(request, cands).tolist()
            assert looked() - before == len(cands)
    finally:
        srv.stop()


def test_keyed_candidates_score_exactly_as_decoded_ones_and_come_back_from_the_cache(models, requests_):
    """Rows of named tensors and TF Serving bodies (``RawCandidates.keyed``: their JSON as the key): the same scores,
    bit for bit, as the same candidates given decoded, cold and held; a candidate that comes back is a cache hit."""
    odd = [{"movie_id": 7, "genres": ["Drama", True]}, {"movie_id": 7.0}, {"movie_id": "7"}, {"movie_id": True}]
    with Scorer(models / "ml" / "1") as keyed, Scorer(models / "ml" / "1") as plain:
        for round_ in range(2):  # cold, then every candidate held
            hits = keyed.candidates.hits
            for request, cands in [*requests_[:20], (requests_[0][0], odd)]:
                got, gj = keyed.score_joined(request, RawCandidates.keyed(cands))
                want, wj = plain.score_joined(request, cands)
                np.testing.assert_array_equal(got, want)
                assert (gj.unknown_candidates, gj.unknown_request) == (wj.unknown_candidates, wj.unknown_request)
            if round_:
                assert keyed.candidates.hits - hits == sum(len(c) for _, c in requests_[:20]) + len(odd)
        assert keyed.stats()["ignored_keys"] == plain.stats()["ignored_keys"]


def test_keyed_candidates_have_one_key_per_value_and_none_where_json_cannot_say_it():
    keys = RawCandidates.keyed([{"a": 1}, {"a": 1.0}, {"a": "1"}, {"a": True}, {"a": None}, {"a": [1]}]).raws
    assert keys is not None and len(set(keys)) == 6
    for values in ({"a": float("nan")}, {"a": b"x"}, {"a": [float("inf")]}, {"a": {"b": 1}}, {"a": (1,)}):
        assert RawCandidates.keyed([{"a": 1}, values]).raws is None  # NaN and None, bytes and text: one JSON

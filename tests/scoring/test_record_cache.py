"""The feature join's record cache (offgraph/feature_tables/record_cache.py): bounded and counted, and never stale past a
followed table's catch-up, on a real exported model and real RocksDB feature tables."""

import gc
import time
import tracemalloc

import numpy as np
import pytest
from server_helpers import copy_models

from offgraph.feature_tables.build import build_feature_tables
from offgraph.feature_tables.db import FeatureDB, decode_row, encode_row, row_key, table_dir
from offgraph.feature_tables.record_cache import NO_ROW, Entry, RecordCache, decode_entries
from offgraph.scoring.memory_budget import JOIN_RECORD_BYTES
from offgraph.scoring.scorer import Scorer


@pytest.fixture()
def models(tiny_model, tmp_path):
    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    s = Scorer(models / "ml" / "1", verify=False)
    spec = s.spec
    s.close()
    build_feature_tables(models / "ml", spec, table, progress=False)
    return models


def _entries(n: int, size: int) -> dict[bytes, Entry]:
    return {b"k%07d" % i: (NO_ROW if i % 5 == 0 else (bytes([i % 251]) * size, {"x": i})) for i in range(n)}


def test_reads_only_what_it_does_not_hold_and_keeps_the_answers():
    stored = _entries(100, 40)
    asked: list[list[bytes]] = []

    def fetch(keys):
        asked.append(list(keys))
        return [stored[k] for k in keys]

    c = RecordCache(1 << 20)
    keys = list(stored)[:60]
    assert c.read(keys, fetch) == [stored[k] for k in keys]
    assert c.read(list(stored), fetch) == list(stored.values())  # the 40 not held, in order, in one call
    assert asked == [keys, list(stored)[60:]]
    assert c.read(list(reversed(stored)), fetch) == list(reversed(stored.values())) and len(asked) == 2
    assert c.hits == 60 + 100 and c.misses == 100  # a key with no row is held as well


def test_the_bytes_counted_stay_within_the_bound_oldest_out_first():
    stored = _entries(1000, 100)
    c = RecordCache(40_000)
    c.read(list(stored), lambda ks: [stored[k] for k in ks])
    assert 0 < c.nbytes <= 40_000 and 0 < len(c) < 1000
    last = list(stored)[-len(c) :]  # FIFO: the newest ones are held
    assert c.read(last, lambda ks: pytest.fail(f"read again: {ks[:3]}")) == [stored[k] for k in last]
    c.resize(5_000)
    assert c.nbytes <= 5_000 and len(c) > 0
    c.clear()
    assert c.nbytes == 0 and len(c) == 0
    assert RecordCache(0).read([b"a"], lambda ks: [(b"x", {})]) == [(b"x", {})]  # 0: holds nothing
    with pytest.raises(ValueError, match="max_bytes"):
        RecordCache(-1)


def test_entries_are_decoded_once_and_an_undecodable_record_says_why():
    rec = encode_row(3, {"genres": ["a", "b"], "release_year": 1995})
    assert decode_entries([rec, None, b"\xc1"], decode_row)[:2] == [(rec, decode_row(rec)), NO_ROW]
    v, why = decode_entries([b"\xc1"], decode_row)[0]
    assert v == b"\xc1" and isinstance(why, str) and "cannot be decoded" in why


def test_the_bytes_counted_are_at_least_what_python_holds(models):
    """What an entry is counted covers what it holds: tracemalloc of the real catalog's records, decoded."""
    with FeatureDB(table_dir(models / "ml", "item"), "r") as db:
        stored = [k for k, _ in db.rows()]
        raw = db.get_raw(stored)
    assert len(stored) > 20
    keys = [bytes(k) for k in stored]  # fresh objects: held by the cache alone
    c = RecordCache(1 << 30)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    c.read(keys, lambda ks: decode_entries([bytes(r) for r in raw], decode_row))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(c) == len(keys) and held <= c.nbytes, (held, c.nbytes)
    assert c.nbytes / len(c) <= JOIN_RECORD_BYTES  # the budget counts an item of this catalog at no less


def test_a_followed_table_is_served_fresh_a_new_key_by_an_ingested_file_too(models, requests_):
    """The cache holds a key with no row as None: a row ingested for it later (``offgraph features load``'s path,
    whose file takes no sequence number when its keys are new) is served after the next catch-up; so is a
    rewritten row."""
    request, cands = requests_[0]
    new = {"movie_id": 0, **{k: cands[0][k] for k in ("genres", "title_words", "release_year")}}
    with Scorer(models / "ml" / "1", store_mode="follow") as s:
        _, joined = s.score_joined(
            {"user_id": request["user_id"]}, [{"movie_id": 0}, {"movie_id": cands[1]["movie_id"]}]
        )
        assert joined.unknown_candidates == 1
        cache = s.join._caches["item"]  # noqa: SLF001
        assert len(cache) == 2 and cache.nbytes > 0
        misses = cache.misses
        s.score_joined({"user_id": request["user_id"]}, [{"movie_id": 0}, {"movie_id": cands[1]["movie_id"]}])
        assert cache.misses == misses  # both held: nothing read from the table
        want = s.score(request, [new])
        with FeatureDB(table_dir(models / "ml", "item"), "w") as db:
            seq = db.change_mark()[0]
            n = db.ingest_sorted(
                [(row_key(0), encode_row(1, {k: v for k, v in new.items() if k != "movie_id"}))], models
            )
            assert n == 1 and db.change_mark()[0] == seq  # the case meant: a file that took no sequence number
        t0 = time.monotonic()
        while s.score_joined({"user_id": request["user_id"]}, [{"movie_id": 0}])[1].unknown_candidates:
            assert time.monotonic() - t0 < 5.0, "the ingested row was not served"
            time.sleep(0.05)
        assert np.allclose(s.score({**request}, [{"movie_id": 0}]), want, atol=1e-6)


def test_the_cache_is_within_the_item_share_and_resized_with_it(models, requests_):
    request, cands = requests_[0]
    with Scorer(models / "ml" / "1", item_cache_size=3) as s:  # a snapshot: never cleared
        s.score({"user_id": request["user_id"]}, [{"movie_id": c["movie_id"]} for c in cands])
        assert 0 < s.join.cache_bytes <= 3 * JOIN_RECORD_BYTES
        assert s.memory_in_use()["item_cache"] >= s.join.cache_bytes
        s.resize_memory(1.0, 8, 1)
        assert s.join.cache_bytes <= JOIN_RECORD_BYTES

"""The row cache's policy (offgraph.store._row_cache) on skewed key traces, and the offline simulation that
chose it (offgraph.export.cache_sim)."""

import numpy as np
import pytest

from bench.lib.traffic import item_uniform, ranks
from offgraph.export.cache_sim import lru_hit_ratio, perfect_lfu_hit_ratio, replay, s3fifo_hit_ratio, trace_of
from offgraph.store import RowCache, get_codec
from offgraph.store.keys import combine_keys

INT8 = get_codec("int8", 16)


def skewed_trace(n_requests: int, seed: int = 0, popularity: str = "zipf"):
    """Requests shaped like the bench's (bench.lib.traffic) without FG: a user and 200 items drawn with
    the popularity, each item's author and 3 tags fixed functions of it, 8 small uniform tables; each
    request's unique combined keys."""
    rng = np.random.default_rng(seed)
    lists = []
    for _ in range(n_requests):
        items = ranks(rng.random(200), 300_000, popularity)
        parts = [
            combine_keys(0, ranks(rng.random(1), 400_000, popularity)),
            combine_keys(1, items),
            combine_keys(2, ranks(item_uniform(items, 0), 100_000, popularity)),
        ]
        parts += [combine_keys(3, ranks(item_uniform(items, 1 + k), 50_000, popularity)) for k in range(3)]
        parts += [combine_keys(4 + t, rng.integers(0, 64 << t, 1)) for t in range(8)]
        lists.append(np.unique(np.concatenate(parts)))
    return trace_of(lists)


@pytest.fixture(scope="module")
def zipf_trace():
    return skewed_trace(1500)


def test_tinylfu_beats_lru_and_comes_within_3_points_of_perfect_lfu(zipf_trace):
    mb = 1.0  # ~28k rows for ~84k distinct keys of 715k lookups
    cache = RowCache(mb, INT8)
    assert cache.policy == "tinylfu"  # the default
    tiny = replay(cache, zipf_trace)
    lru = replay(RowCache(mb, INT8, policy="lru"), zipf_trace)
    best = perfect_lfu_hit_ratio(zipf_trace, cache.capacity_rows)
    assert tiny > lru + 0.015, (tiny, lru)
    assert best - tiny < 0.03, (best, tiny)
    # nor is it the set-associativity: an exact fully associative LRU of the same rows loses too
    assert lru_hit_ratio(zipf_trace, cache.capacity_rows) < tiny - 0.01
    s = cache.stats()
    assert s["entries"] <= s["capacity_rows"] and s["bytes"] <= mb * (1 << 20)


def test_one_off_keys_do_not_push_out_the_hot_set():
    """Scan resistance: a hot set used by every request survives a flood of keys seen once (LRU loses it)."""
    hot = np.arange(1000, dtype=np.int64)
    for policy, survives in (("tinylfu", True), ("lru", False)):
        c = RowCache(0.1, INT8, policy=policy)
        assert c.capacity_rows < 4000
        recs = np.zeros((4000, INT8.record_bytes), np.uint8)
        for _ in range(5):
            hit, _, e = c.lookup_records(0, hot)
            c.insert(0, hot[~hit], recs[: int((~hit).sum())], e)
        for i in range(10):  # 40,000 keys never seen again
            scan = np.arange(10**6 + 4000 * i, 10**6 + 4000 * (i + 1))
            hit, _, e = c.lookup_records(0, scan)
            c.insert(0, scan, recs[: len(scan)], e)
        kept = c.lookup_records(0, hot)[0].mean()
        assert (kept > 0.9) if survives else (kept < 0.3), (policy, kept)


def test_uniform_traffic_is_no_worse_than_lru():
    """Without skew admission has nothing to find: TinyLFU must not lose to LRU by more than its sketch's
    bytes (fewer rows in the same MiB)."""
    tr = skewed_trace(300, seed=3, popularity="uniform")
    tiny = replay(RowCache(0.5, INT8), tr)
    lru = replay(RowCache(0.5, INT8, policy="lru"), tr)
    assert tiny >= lru - 0.01, (tiny, lru)


def test_perfect_lfu_counts_first_sightings_as_misses():
    # keys: a x3, b x2, c x1 over three requests; capacity 1 keeps a: hits are a's 2nd and 3rd sightings
    a, b, c = 1, 2, 3
    tr = trace_of([[a, b], [a, b, c], [a]])
    assert perfect_lfu_hit_ratio(tr, 1) == pytest.approx(2 / 6)
    assert perfect_lfu_hit_ratio(tr, 2) == pytest.approx(3 / 6)
    assert perfect_lfu_hit_ratio(tr, 10) == pytest.approx(3 / 6)
    # measured from the second request on: a and b hit there (cached since the first)
    assert perfect_lfu_hit_ratio(tr, 2, warm_requests=1) == pytest.approx(3 / 4)


def test_reference_policies_on_a_hand_worked_trace():
    # capacity 2; requests [1,2] [3] [1] [2]: LRU holds {2,3} when 1 comes back, then {3,1}: no hits
    tr = trace_of([[1, 2], [3], [1], [2]])
    assert lru_hit_ratio(tr, 2) == 0.0
    assert lru_hit_ratio(tr, 3) == pytest.approx(2 / 5)
    # S3-FIFO: 1 and 2 pass through the small queue once; with room for all it hits as LRU does
    assert s3fifo_hit_ratio(tr, 30) == pytest.approx(2 / 5)
    # the real cache driven by replay: room for all, every second sighting hits
    assert replay(RowCache(0.01, INT8), tr) == pytest.approx(2 / 5)

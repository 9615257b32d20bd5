"""What a version that replaces another starts from (FG item cache, hot rows) and how its load yields
to serving (offgraph.server.models.pacing)."""

from __future__ import annotations

import gc
import time

import pytest
from fg_samples import CANDS, REQUEST, SPEC

from offgraph.features import FeatureGenerator, parse_spec
from offgraph.server.models.pacing import Pacer


def _ids(batch) -> list[list[int]]:
    return [r.ids.tolist() for r in batch.fields]


def _traffic(fg: FeatureGenerator) -> list:
    """Five requests over 40 distinct items (with crosses): their FG output."""
    out = []
    for k in range(5):
        cands = [{"price": 3 * i + k, "title_terms": ["red", f"t{i % 7}"], "cat_id": i % 9} for i in range(40)]
        out.append(_ids(fg.transform({**REQUEST, "user_id": 40 + k}, cands)))
    return out


def test_a_version_of_the_same_spec_adopts_the_item_cache_and_generates_the_same_features():
    old = FeatureGenerator(SPEC, item_cache_size=1000)
    want = _traffic(old)
    new = FeatureGenerator(SPEC, item_cache_size=1000)
    new.transform({}, [{} for _ in range(8)])  # the loader's warm-up runs first: value-set ids 0.. taken
    state = old.item_cache_state(limit=30)
    assert new.adopt_item_cache(state) == 30
    misses = new.cache_misses
    assert _traffic(new) == want  # the same ids as the generator that made the cache
    # the 30 most recent items of the last request came from the adopted cache
    assert new.cache_misses - misses == 5 * 40 - 30
    fresh = FeatureGenerator(SPEC, item_cache_size=1000)
    assert _traffic(fresh) == want and fresh.cache_misses == 5 * 40


def test_the_item_cache_copy_is_in_the_caches_own_order_after_evictions_and_hits():
    """``item_cache_state`` reads the OrderedDict's base dict (no re-hashing of the keys); that is only
    right while the dict's order is the OrderedDict's. A hit that reordered the cache would break it."""
    fg = FeatureGenerator(SPEC, item_cache_size=50)
    cands = [{"price": i, "title_terms": ["red", f"t{i}"], "cat_id": i} for i in range(200)]
    fg.transform(REQUEST, cands)
    assert (fg.cache_misses, len(fg._cache)) == (200, 50)  # 150 evicted
    fg.transform(REQUEST, [cands[150]])  # the oldest item still cached: a hit
    assert (fg.cache_hits, fg.cache_misses) == (1, 200)
    state = fg.item_cache_state()
    assert list(state["keys"]) == list(fg._cache) and list(state["entries"]) == list(fg._cache.values())
    assert list(fg.item_cache_state(limit=10)["keys"]) == list(fg._cache)[-10:]
    # the copy holds 2 x 50 references that the cyclic GC must not walk while the next version loads
    assert not gc.is_tracked(state["keys"]) and not gc.is_tracked(state["entries"])
    new = FeatureGenerator(SPEC, item_cache_size=50)
    assert new.adopt_item_cache(state) == 50
    assert (
        new.transform(REQUEST, cands[150:]).fields[0].ids.tolist()
        == fg.transform(REQUEST, cands[150:]).fields[0].ids.tolist()
        and new.cache_misses == 0
    )


def test_another_spec_or_no_cache_adopts_nothing():
    old = FeatureGenerator(SPEC, item_cache_size=100)
    old.transform(REQUEST, CANDS)
    raw = dict(SPEC.raw)
    raw["fields"] = [dict(f, rows=f["rows"] + 1) if f["name"] == "cat" else f for f in raw["fields"]]
    other = FeatureGenerator(parse_spec(raw), item_cache_size=100)
    assert other.adopt_item_cache(old.item_cache_state()) == 0
    assert (
        other.transform(REQUEST, CANDS).fields[SPEC.field_index("cat")].ids.tolist()
        != old.transform(REQUEST, CANDS).fields[SPEC.field_index("cat")].ids.tolist()
    )
    assert FeatureGenerator(SPEC, item_cache_size=0).adopt_item_cache(old.item_cache_state()) == 0
    assert FeatureGenerator(SPEC, item_cache_size=100).adopt_item_cache(None) == 0


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_pacer_keeps_work_to_its_share_of_the_wall_clock():
    p = Pacer(0.25)
    t0 = time.perf_counter()
    for _ in range(4):
        _busy(0.03)
        p.tick()
    wall = time.perf_counter() - t0
    # 0.12 s of work at a quarter of the time: 0.36 s of pauses (sleep may overshoot a little)
    assert 0.34 <= p.slept_s <= 0.45, p.slept_s
    assert wall >= 0.12 / 0.25 * 0.95
    flat = Pacer(1.0)
    _busy(0.02)
    flat.tick()
    assert flat.slept_s == 0.0


@pytest.mark.parametrize("share", [0, -0.5, 1.5, True, "0.5", float("nan")])
def test_a_pacer_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ValueError, match="share must be a number in"):
        Pacer(share)


def test_cached_items_are_not_walked_by_the_collector():
    """A collection holds the GIL for every tracked object it walks: the item cache (10^5 items a
    version, two versions during a swap) must add none once the collector has seen an item, even
    once: one young collection untracks every new key, entry and memoized cross. (Entries with a
    tuple inside stayed tracked for another collection, and every collection of the middle generation
    walked each item the cache took since.)"""
    fg = FeatureGenerator(SPEC, item_cache_size=1000)
    _traffic(fg)
    gc.collect(0)
    assert len(fg._cache) == 200
    assert not [e for e in fg._cache.values() if gc.is_tracked(e)]
    assert not [k for k in fg._cache if gc.is_tracked(k)]
    memo = [v for table in fg._cross_memo for m in table.values() for v in m.values()]
    assert memo and not [v for v in memo if gc.is_tracked(v)]

"""offgraph.store.RowCache: the server's set-associative hot-row cache of store records."""

import threading
import tracemalloc

import numpy as np
import pytest

from offgraph.store import RowCache, get_codec
from offgraph.store._row_cache import EMPTY

D = 8
FP32 = get_codec("fp32", D)


def codec(dim=D):
    return get_codec("fp32", dim)


def rows_of(keys, dim=D, salt=0.0):
    """A value per key that says which key (and which version) it is."""
    k = np.asarray(keys, dtype=np.float64)
    v = (k[:, None] * 10 + np.arange(dim)[None, :] + salt).astype(np.float32)
    return v, (k + salt).astype(np.float32)


def recs(v, w, dim=D):
    """fp32 records of (vectors, weights): they decode to exactly these values."""
    return codec(dim).encode(v, w)


def records_of(keys, dim=D, salt=0.0):
    return recs(*rows_of(keys, dim, salt), dim=dim)


def test_hits_return_exactly_what_was_inserted_and_misses_read_zeros():
    c = RowCache(1, FP32)
    tids = np.array([0, 1, 2, 2, 7], dtype=np.uint32)
    rows = np.array([5, 5, 0, 2**48 - 1, 123456789], dtype=np.int64)
    hit, vec, w, epoch = c.lookup(tids, rows)
    assert not hit.any() and not vec.any() and not w.any()
    rng = np.random.default_rng(0)
    v = rng.standard_normal((5, D)).astype(np.float32)
    fo = rng.standard_normal(5).astype(np.float32)
    assert c.insert(tids, rows, recs(v, fo), epoch) == 5
    # ask in another order, with duplicates and unknown keys
    q = np.array([4, 0, 3, 3, 1, 2])
    qt = np.append(tids[q], [3, 1])
    qr = np.append(rows[q], [5, 6])
    hit, vec, w, _ = c.lookup(qt, qr)
    assert hit.tolist() == [True] * 6 + [False, False]
    assert np.array_equal(vec[:6], v[q]) and np.array_equal(w[:6], fo[q])
    assert not vec[6:].any() and not w[6:].any()
    s = c.stats()
    assert s["entries"] == 5 and s["hits"] == 6 and s["misses"] == 5 + 2


@pytest.mark.parametrize(
    "capacity_mb,quant,dim,ways,policy",
    [
        (0.01, "fp32", 4, 1, "tinylfu"),
        (0.5, "int8", 16, 4, "tinylfu"),
        (3.3, "int8", 16, 8, "tinylfu"),
        (3.3, "fp16", 16, 8, "lru"),
        (16, "fp32", 64, 2, "tinylfu"),
    ],
)
def test_memory_is_bounded_by_capacity(capacity_mb, quant, dim, ways, policy):
    budget = capacity_mb * (1 << 20)
    cod = get_codec(quant, dim)
    zeros = cod.encode(np.zeros((4096, dim)), np.zeros(4096))
    warm = RowCache(0.01, cod, ways=ways, policy=policy)  # first-call allocations of NumPy / imports are not ours
    _, _, _, e = warm.lookup(0, np.arange(4096))
    warm.insert(0, np.arange(4096), zeros, e)
    warm.invalidate(0, np.arange(0, 4096, 7))
    rng = np.random.default_rng(1)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        c = RowCache(capacity_mb, cod, ways=ways, policy=policy)
        s = c.stats()
        assert s["bytes"] <= budget
        assert s["bytes"] > 0.97 * budget - 1000  # and it uses what it was given
        # the arena holds records as stored (int8 D=16: 21 bytes), plus the key and one byte (LRU: 8) of state
        per_row = 8 + cod.record_bytes + (1 + 6 if policy == "tinylfu" else 8) + 8 / ways
        assert c.bytes_per_row == pytest.approx(per_row)
        assert s["capacity_rows"] % ways == 0 and s["capacity_rows"] > 0.97 * budget / per_row - ways
        # fill it many times over: entries never exceed capacity, nothing grows
        n = s["capacity_rows"] * 3
        for start in range(0, n, 4096):
            keys = np.arange(start, min(n, start + 4096))
            _, _, _, e = c.lookup(0, keys)
            c.insert(0, keys, cod.encode(rng.standard_normal((len(keys), dim)), np.zeros(len(keys))), e)
            c.invalidate(0, keys[::7])
        assert 0.5 * s["capacity_rows"] < c.stats()["entries"] <= s["capacity_rows"]
        assert c.stats()["bytes"] == s["bytes"]
        now = tracemalloc.get_traced_memory()[0]
        assert now - base <= budget + 64 * 1024  # arrays + small Python objects, no hidden copies
    finally:
        tracemalloc.stop()
    assert np.count_nonzero(c._a.keys != EMPTY) == c.stats()["entries"]


def test_capacity_and_key_validation():
    with pytest.raises(ValueError, match="capacity_mb must be a number > 0"):
        RowCache(0, FP32)
    with pytest.raises(ValueError, match="cannot hold one set"):
        RowCache(1e-6, FP32)
    with pytest.raises(ValueError, match="ways must be"):
        RowCache(1, FP32, ways=0)
    with pytest.raises(ValueError, match="codec must be a store codec"):
        RowCache(1, D)
    with pytest.raises(ValueError, match="policy must be one of"):
        RowCache(1, FP32, policy="fifo")
    c = RowCache(1, FP32)
    with pytest.raises(ValueError, match="table id 65535 > 65534"):
        c.lookup([0xFFFF], [1])
    with pytest.raises(ValueError, match="2\\*\\*48"):
        c.lookup([0], [2**48])
    with pytest.raises(ValueError, match=">= 0"):
        c.lookup([0], [-1])
    with pytest.raises(ValueError, match="records must be uint8"):
        c.insert([0], [1], np.zeros((1, FP32.record_bytes + 1), np.uint8), 0)
    with pytest.raises(ValueError, match="needs records"):
        c.insert([0, 1], [1, 1], np.zeros((1, FP32.record_bytes), np.uint8), 0)
    # uncacheable keys are ignored by invalidate (they can never be cached)
    assert c.invalidate([0xFFFF, 0], [1, 2**60]) == 0


def test_invalidate_removes_only_those_keys():
    c = RowCache(1, FP32)
    keys = np.arange(100)
    v, w = rows_of(keys)
    _, _, _, e = c.lookup(3, keys)
    c.insert(3, keys, recs(v, w), e)
    assert c.invalidate(3, [10, 20, 20, 999]) == 2  # 999 was never cached
    hit, vec, ww, _ = c.lookup(3, keys)
    assert hit.sum() == 98 and not hit[10] and not hit[20]
    assert np.array_equal(vec[hit], v[hit]) and np.array_equal(ww[hit], w[hit])
    assert c.stats()["entries"] == 98
    # other tables with the same row numbers are other keys
    _, _, _, e = c.lookup(4, [10])
    c.insert(4, [10], records_of([1]), e)
    c.invalidate(3, [10])
    assert c.lookup(4, [10])[0].all()
    c.clear()
    assert not c.lookup(3, keys)[0].any() and c.stats()["entries"] == 0


def test_insert_after_a_later_invalidation_is_skipped():
    """The stale race: read a row (cache miss, epoch e), the row is updated and
    invalidated, THEN the old value arrives at insert(e): it must not be cached."""
    c = RowCache(1, FP32)
    hit, _, _, e = c.lookup(1, [42])
    assert not hit[0]
    old_v, old_w = rows_of([42])
    c.invalidate(1, [42])  # the update lands while the store read is in flight
    assert c.insert(1, [42], recs(old_v, old_w), e) == 0
    assert not c.lookup(1, [42])[0][0]
    # a lookup after the invalidation gets a newer epoch: its read may be cached
    _, _, _, e2 = c.lookup(1, [42])
    assert e2 > e
    new_v, new_w = rows_of([42], salt=0.5)
    assert c.insert(1, [42], recs(new_v, new_w), e2) == 1
    hit, vec, w, _ = c.lookup(1, [42])
    assert hit[0] and np.array_equal(vec, new_v) and np.array_equal(w, new_w)
    # invalidating an already cached key also refuses older reads of it
    _, _, _, e3 = c.lookup(1, [42])
    c.invalidate(1, [42])
    assert c.insert(1, [42], recs(old_v, old_w), e3) == 0
    # ... but not reads of keys in other sets
    a = c._a
    from offgraph.store.keys import combine_keys, splitmix64

    s42 = int(splitmix64(combine_keys(1, [42]))[0] % np.uint64(a.sets))
    other = next(r for r in range(1000) if int(splitmix64(combine_keys(1, [r]))[0] % np.uint64(a.sets)) != s42)
    assert c.insert(1, [other], records_of([other]), e3) == 1


def test_sequential_ops_match_a_dict_model():
    """Random lookups / inserts / invalidations / clears of a small cache (many
    evictions) against a dict: a hit is always the latest inserted, never
    invalidated value of that key; nothing else ever hits."""
    rng = np.random.default_rng(7)
    c = RowCache(0.002, codec(4), ways=2)  # ~40 rows for ~150 keys
    assert c.capacity_rows < 60
    ref: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
    hits = 0
    for step in range(3000):
        n = int(rng.integers(1, 12))
        t = rng.integers(0, 3, n).astype(np.uint32)
        r = rng.integers(0, 50, n).astype(np.int64)
        op = rng.random()
        if op < 0.5:
            hit, vec, w, e = c.lookup(t, r)
            for i in range(n):
                key = (int(t[i]), int(r[i]))
                if hit[i]:
                    hits += 1
                    assert key in ref, (step, key)
                    assert np.array_equal(vec[i], ref[key][0]) and w[i] == ref[key][1]
                else:
                    assert not vec[i].any() and w[i] == 0
            miss = ~hit
            vals = rng.standard_normal((n, 4)).astype(np.float32)
            ws = rng.standard_normal(n).astype(np.float32)
            # duplicates in one insert: the first occurrence is the one cached
            stored_first = {}
            for i in np.flatnonzero(miss):
                stored_first.setdefault((int(t[i]), int(r[i])), i)
            c.insert(t[miss], r[miss], recs(vals[miss], ws[miss], 4), e)
            for key, i in stored_first.items():
                ref[key] = (vals[i], float(ws[i]))  # may have been evicted: a later miss is fine
        elif op < 0.85:
            c.invalidate(t, r)
            for i in range(n):
                ref.pop((int(t[i]), int(r[i])), None)
        elif op < 0.99:
            # overwrite keys that may be cached (e.g. two readers racing): latest wins
            _, _, _, e = c.lookup(t[:0], r[:0])
            vals = rng.standard_normal((n, 4)).astype(np.float32)
            ws = rng.standard_normal(n).astype(np.float32)
            c.insert(t, r, recs(vals, ws, 4), e)
            first = {}
            for i in range(n):
                first.setdefault((int(t[i]), int(r[i])), i)
            for key, i in first.items():
                ref[key] = (vals[i], float(ws[i]))
        else:
            c.clear()
            ref.clear()
        assert c.stats()["entries"] <= c.capacity_rows
    assert hits > 500  # the test exercised hits, not only misses


def test_interleaved_readers_and_updates_never_serve_a_stale_row():
    """Model of the server: a store whose rows are updated (store write, then
    invalidate), and readers that look up, read the misses from the store some time
    later and insert them with their lookup epoch. At every lookup, a hit must equal
    the store's CURRENT value."""
    rng = np.random.default_rng(3)
    c = RowCache(0.003, codec(2), ways=4)
    store = {k: float(k) for k in range(80)}
    version = 0
    inflight = []  # (keys, epoch, values read or None)
    checked = 0
    for step in range(6000):
        op = rng.random()
        if op < 0.4:
            keys = np.unique(rng.integers(0, 80, int(rng.integers(1, 10))))
            hit, vec, w, e = c.lookup(0, keys)
            for k, h, x in zip(keys.tolist(), hit.tolist(), w.tolist()):
                if h:
                    checked += 1
                    assert x == store[k], (step, k, x, store[k])
                    assert np.array_equal(vec[keys.tolist().index(k)], [x, -x])
            inflight.append((keys[~hit], e, None))
        elif op < 0.85 and inflight:
            i = int(rng.integers(len(inflight)))
            keys, e, vals = inflight[i]
            if vals is None:  # the store read happens now
                inflight[i] = (keys, e, np.array([store[k] for k in keys.tolist()], np.float32))
            else:  # the insert happens now
                inflight.pop(i)
                c.insert(0, keys, recs(np.stack([vals, -vals], 1), vals, 2), e)
        elif op < 0.95:
            keys = np.unique(rng.integers(0, 80, int(rng.integers(1, 4))))
            version += 1
            for k in keys.tolist():
                store[k] = float(k) + version * 1000
            c.invalidate(0, keys)
        elif op < 0.952:
            c.clear()
    assert checked > 1000


def test_concurrent_threads_keep_the_cache_consistent():
    c = RowCache(0.05, FP32)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                keys = np.unique(rng.integers(0, 3000, 64))
                hit, vec, w, e = c.lookup(seed % 3, keys)
                # every value is a pure function of its key: a hit must show it
                want_v, want_w = rows_of(keys)
                if not (np.array_equal(vec[hit], want_v[hit]) and np.array_equal(w[hit], want_w[hit])):
                    errors.append("wrong value")
                c.insert(seed % 3, keys[~hit], recs(want_v[~hit], want_w[~hit]), e)
                if rng.random() < 0.2:
                    c.invalidate(seed % 3, keys[:5])
        except Exception as ex:  # noqa: BLE001
            errors.append(repr(ex))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = c.stats()
    assert s["hits"] > 0 and s["entries"] == np.count_nonzero(c._a.keys != EMPTY) <= s["capacity_rows"]


@pytest.mark.parametrize("policy,want", [("tinylfu", [7, 42]), ("lru", [42, 7])])
def test_hot_keys_are_the_most_frequently_used_first(policy, want):
    """What a new version warms with: the hottest rows first (TinyLFU: most frequent; LRU: most recent)."""
    c = RowCache(1, FP32, policy=policy)
    rows = np.arange(100, dtype=np.int64)
    _, _, _, epoch = c.lookup(np.uint32(3), rows)
    c.insert(np.full(100, 3, np.uint32), rows, records_of(rows), epoch)
    for r in (7, 7, 7, 42):  # 7 used most often, 42 last
        c.lookup(np.uint32(3), rows[[r]])
    t, r = c.hot_keys(2)
    assert t.tolist() == [3, 3] and r.tolist() == want
    t, r = c.hot_keys(1000)
    assert len(r) == 100 and sorted(r.tolist()) == list(range(100)) and r[0] == want[0]
    assert len(c.hot_keys(0)[1]) == 0
    with pytest.raises(ValueError, match="limit must be an int >= 0"):
        c.hot_keys(-1)


@pytest.mark.parametrize("limit", [1, 5, 37, 500, 999, 1000, 5000])
def test_hot_key_selection_equals_a_full_sort(limit):
    """The selection partitions once at the limit-th highest score (ties there, many slots share a
    frequency, and empty slots, -1, included): it must equal sorting every used slot by score."""
    from offgraph.store._row_cache import hot_keys

    rng = np.random.default_rng(limit)
    clock = rng.integers(-1, 60, 1000).astype(np.int64)  # many ties, ~1/61 empty
    keys = rng.permutation(10**6)[:1000].astype(np.uint64)
    used = np.flatnonzero(clock >= 0)
    want = keys[sorted(used.tolist(), key=lambda i: (-clock[i], i))[:limit]]
    np.testing.assert_array_equal(hot_keys(keys, clock, limit), want)


@pytest.mark.parametrize("policy", ["tinylfu", "lru"])
def test_resize_keeps_each_sets_most_used_rows_within_the_new_capacity_and_refuses_stale_inserts(policy):
    c = RowCache(2, FP32, policy=policy)
    before = c.capacity_rows
    n = before // 2
    tids = np.zeros(n, np.uint32)
    rows = np.arange(n, dtype=np.int64)
    _, _, _, epoch = c.lookup(tids, rows)
    c.insert(tids, rows, records_of(rows), epoch)
    hot = rows[: n // 4]
    for _ in range(3):  # the hot quarter: used more often (LFU) and last (LRU)
        c.lookup(tids[: len(hot)], hot)
    _, _, _, stale_epoch = c.lookup(tids[:1], rows[-1:])  # a reader that will insert after the resize
    c.invalidate(tids[:1], rows[-1:])
    assert c.resize(1) < before
    s = c.stats()
    assert s["bytes"] <= 1 << 20 and s["entries"] <= c.capacity_rows
    hit, vec, w, _ = c.lookup(tids[: len(hot)], hot)
    want_v, want_w = rows_of(hot)
    # the hot rows a set can hold at its new ways survived, bit for bit
    assert hit.mean() > 0.9
    assert np.array_equal(vec[hit], want_v[hit]) and np.array_equal(w[hit], want_w[hit])
    # an insert of a row read before an invalidation that came before the resize is refused after it
    c.insert(tids[:1], rows[-1:], records_of(rows[-1:], salt=1.0), stale_epoch)
    assert not c.lookup(tids[:1], rows[-1:])[0].any()
    # growing back gives its capacity back (never more ways than it was made with)
    assert c.resize(2) == before and c.stats()["bytes"] <= 2 << 20
    assert c.lookup(tids[: len(hot)], hot)[0].mean() > 0.9


def test_resize_below_one_way_a_set_starts_afresh_and_refuses_inserts_of_earlier_reads():
    c = RowCache(4, FP32)
    tids, rows = np.zeros(100, np.uint32), np.arange(100, dtype=np.int64)
    _, _, _, epoch = c.lookup(tids, rows)
    c.insert(tids, rows, records_of(rows), epoch)
    c.resize(0.05)
    assert c.stats()["bytes"] <= 0.05 * (1 << 20) and c.stats()["entries"] == 0
    assert c.insert(tids, rows, records_of(rows), epoch) == 0
    with pytest.raises(ValueError, match="capacity_mb"):
        c.resize(0)

"""Offline simulation of the row cache on a key trace: how its policy compares with LRU and the best possible.

    trace = bench_trace(10**9, "zipf")                    # the bench's requests -> unique keys per request
    replay(RowCache(200, get_codec("int8", 16)), trace)   # hit ratio of the REAL cache, driven as the server does
    perfect_lfu_hit_ratio(trace, capacity_rows)           # the best a frequency cache can do on this trace
    lru_hit_ratio(trace, capacity_rows)                   # exact fully associative LRU (reference)
    s3fifo_hit_ratio(trace, capacity_rows)                # S3-FIFO (Yang et al., SOSP'23), fully associative

A trace is what the server's row cache sees: for each request of ``offgraph.export.traffic.build_requests``
(the bench's bodies), the unique combined keys that FG and ``offgraph.scoring.batch.batch_keys`` give for the
synthetic spec (``offgraph.export.synth_spec``: no store is needed). ``replay`` looks each request's keys up,
then inserts the misses, as ``offgraph.scoring.batch`` does.

Perfect LFU here is the static oracle: the ``C`` keys most frequent over the whole trace are cached, each
one from its first request on (that first request is a miss: a row is read before it is held). On a trace
of independent draws (the bench's) no cache that does not see the future does better in expectation.
The reference policies (LRU, S3-FIFO) are exact per-key Python loops: slow, fine offline.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from offgraph.store.keys import split_keys


@dataclass(frozen=True)
class Trace:
    keys: np.ndarray  # uint64 [A]: every request's unique keys, one request after another
    bounds: np.ndarray  # int64 [R + 1]: request i owns keys[bounds[i]:bounds[i + 1]]

    @property
    def requests(self) -> int:
        return len(self.bounds) - 1

    def request(self, i: int) -> np.ndarray:
        return self.keys[self.bounds[i] : self.bounds[i + 1]]


def trace_of(key_lists) -> Trace:
    """A :class:`Trace` from each request's unique keys (uint64 arrays)."""
    key_lists = [np.asarray(k, dtype=np.uint64) for k in key_lists]
    bounds = np.zeros(len(key_lists) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in key_lists], out=bounds[1:])
    keys = np.concatenate(key_lists) if key_lists else np.zeros(0, np.uint64)
    return Trace(keys, bounds)


def bench_trace(
    total_rows: int, popularity: str, n_requests: int = 4502, n_candidates: int = 200, seed: int = 0
) -> Trace:
    """The unique keys of each of ``bench.scale``'s requests (its default warm-up, c1 and c8 bodies:
    ``build_requests(rows, 200 + 300 + 4000 + 2, 200, popularity, seed=0)``), through the server's FG
    and key path for the synthetic spec of ``total_rows`` rows."""
    from offgraph.export.synth_spec import synth_spec
    from offgraph.export.traffic import build_requests
    from offgraph.features.fg import FeatureGenerator
    from offgraph.features.spec import parse_spec
    from offgraph.scoring.batch import batch_keys

    fg = FeatureGenerator(parse_spec(synth_spec(total_rows)))
    lists = [
        batch_keys(fg.transform(r, c)).unique_keys
        for r, c in build_requests(total_rows, n_requests, n_candidates, popularity, seed=seed)
    ]
    return trace_of(lists)


def replay(cache, trace: Trace, warm_requests: int = 0) -> float:
    """Hit ratio of ``cache`` (a ``RowCache``) over the trace's requests after the first ``warm_requests``:
    each request's keys looked up, then its misses inserted (with zero records: the bytes do not matter
    to the policy)."""
    zero = np.zeros((int(np.diff(trace.bounds).max(initial=0)), cache.codec.record_bytes), np.uint8)
    hits = looked = 0
    for i in range(trace.requests):
        t, r = split_keys(trace.request(i))
        hit, _, epoch = cache.lookup_records(t, r)
        miss = ~hit
        cache.insert(t[miss], r[miss], zero[: int(miss.sum())], epoch)
        if i >= warm_requests:
            hits += int(hit.sum())
            looked += len(hit)
    return hits / looked if looked else 0.0


def perfect_lfu_hit_ratio(trace: Trace, capacity_rows: int, warm_requests: int = 0) -> float:
    """The static oracle's hit ratio (see the module docstring) over the requests after ``warm_requests``."""
    start = int(trace.bounds[warm_requests])
    looked = len(trace.keys) - start
    if looked <= 0:
        return 0.0
    uniq, first, inverse, counts = np.unique(trace.keys, return_index=True, return_inverse=True, return_counts=True)
    top = np.zeros(len(uniq), dtype=bool)
    top[np.argsort(-counts, kind="stable")[:capacity_rows]] = True
    # accesses of a top key after the measured part began, less its first access if that falls in it
    after = np.bincount(inverse[start:], minlength=len(uniq))
    hits = after[top].sum() - np.count_nonzero(first[top] >= start)
    return float(hits) / looked


def _key_by_key(trace: Trace, warm_requests: int, access) -> float:
    """Hit ratio of ``access(key) -> hit`` (a reference policy, one key at a time in trace order) over
    the requests after ``warm_requests``."""
    hits = looked = 0
    for i in range(trace.requests):
        keys = trace.request(i).tolist()
        h = sum(map(access, keys))
        if i >= warm_requests:
            hits += h
            looked += len(keys)
    return hits / looked if looked else 0.0


def lru_hit_ratio(trace: Trace, capacity_rows: int, warm_requests: int = 0) -> float:
    """Exact fully associative LRU (each request's keys in order, a miss inserted at once)."""
    cache: OrderedDict[int, None] = OrderedDict()

    def access(k: int) -> bool:
        if k in cache:
            cache.move_to_end(k)
            return True
        cache[k] = None
        if len(cache) > capacity_rows:
            cache.popitem(last=False)
        return False

    return _key_by_key(trace, warm_requests, access)


def s3fifo_hit_ratio(trace: Trace, capacity_rows: int, warm_requests: int = 0, small_share: float = 0.1) -> float:
    """S3-FIFO: a small FIFO (10%) that new keys enter, a main FIFO with 2-bit frequencies and lazy
    promotion (reinsertion while freq > 0), and a ghost FIFO of keys evicted from the small one (as many
    as the main holds); a ghost key comes back straight into the main."""
    small_cap = max(1, int(capacity_rows * small_share))
    main_cap = max(1, capacity_rows - small_cap)
    small: deque[int] = deque()
    main: deque[int] = deque()
    freq: dict[int, int] = {}
    where: dict[int, int] = {}  # key -> 0 small, 1 main
    ghost: OrderedDict[int, None] = OrderedDict()

    def evict_main():
        while main:
            k = main.popleft()
            if freq[k] > 0:
                freq[k] -= 1
                main.append(k)
            else:
                del freq[k], where[k]
                return

    def evict_small():
        if small:
            k = small.popleft()
            if freq[k] > 0:
                main.append(k)
                where[k] = 1
                freq[k] = 0
                if len(main) > main_cap:
                    evict_main()
            else:
                del freq[k], where[k]
                ghost[k] = None
                if len(ghost) > main_cap:
                    ghost.popitem(last=False)

    def access(k: int) -> bool:
        if k in where:
            freq[k] = min(freq[k] + 1, 3)
            return True
        if k in ghost:
            del ghost[k]
            main.append(k)
            where[k], freq[k] = 1, 0
            if len(main) > main_cap:
                evict_main()
        else:
            small.append(k)
            where[k], freq[k] = 0, 0
            if len(small) > small_cap:
                evict_small()
        return False

    return _key_by_key(trace, warm_requests, access)

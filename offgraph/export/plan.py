"""`offgraph plan`: the read time a server will spend per request, predicted from the disk and the hit ratio.

The model: a request's row-cache misses are read from the store with direct reads, split
over the read threads (``EmbeddingStore`` in ``offgraph.store.base``: one ``multi_get`` chunk per shard the keys
fall in at least, shards cut in pieces of at least ``MIN_CHUNK_KEYS`` keys for about ``read_threads``
chunks), each chunk one read after another. So, with ``m`` misses per request over ``S`` shards,

    chunks              = max(S (1 - (1 - 1/S)^m), min(m / MIN_CHUNK_KEYS, read_threads))  (S(..): shards hit)
    reads in flight   q = clamp(chunks, 1, read_threads)
    read time at c1     = (m * reads_per_miss / q) x (the device's mean latency at depth q)
    c8 throughput bound = (the device's reads per second at depth 8) / (m * reads_per_miss)

The device's latency at depth q is the probe's (``offgraph.store.device_probe``) at depth 1 and 8, linear in
between; past 8 the device is taken as saturated (q / reads per second at depth 8). ``reads_per_miss``
is 1 when the version's index fits in the block cache the memory budget gives (``offgraph.scoring.memory_budget``),
one more read for the share of the index that does not.

The hit ratio is simulated: the bench's traffic (``offgraph.export.traffic``) replayed through the real row
cache (``offgraph.store.row_cache.RowCache`` with the synth version's codec) at the row-cache size the budget
gives, in windows of requests until the last two windows' misses per request agree with the two before to
``CONVERGED_SHARE`` or ``CONVERGED_MISSES`` (the steady state). The trace through FG (``offgraph.export.cache_sim.bench_trace``) is too slow per request for the
tens of thousands of requests a cache of millions of rows takes to fill (its cost:
``bench/results/cache-policy/README.md``), so the trace here is its columnar twin (``synth_trace``): the same draws, the small tables' rows as FG
hashes them, a huge table's row its popularity rank instead of the hash of it (hashing only scatters
distinct ids over rows; the cache sees the same repeats, collisions aside). ``tests/export/test_plan.py``
checks that both traces give the same hit ratio.

Nothing heavy at module level (``offgraph --help`` imports it): NumPy and the cache come in ``run``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

MIN_REQUESTS = 4000
WINDOW_REQUESTS = 2000
CONVERGED_SHARE = 0.015  # how much two pairs of windows' misses per request may differ at steady state
CONVERGED_MISSES = 0.5  # ... or by this many misses a request (half a device read: small in the read time)
FILL_LOOKUPS = 4  # lookups (over the cache's rows) before the cache can be at steady state
SAMPLED_ROWS = 1 << 18  # rows of the miniature simulation's cache, at least
DEFAULT_MAX_SECONDS = 25.0  # the simulation's time limit (the trace is cut there; the result says so)
_SAMPLE_SALT = 0x9E3779B97F4A7C15
MAX_REQUESTS = 200_000
CHUNK_REQUESTS = 2000  # requests of the trace built at once (bounds its memory: bench/results/cache-policy/)


@dataclass(frozen=True)
class Device:
    """The device's random direct-read figures at queue depth 1 and 8 (one block a read)."""

    qd1_ms: float
    qd8_ms: float
    qd8_reads_per_s: float
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("qd1_ms", "qd8_ms", "qd8_reads_per_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"device {name} must be a finite number > 0, got {v!r}")

    @classmethod
    def from_profile(cls, profile: dict, source: str = "probe") -> Device:
        """From ``offgraph.store.device_probe.device_profile``'s ``{"qd1": .., "qd8": ..}``."""
        return cls(profile["qd1"]["mean_ms"], profile["qd8"]["mean_ms"], profile["qd8"]["reads_per_s"], source)

    def latency_ms(self, depth: float) -> float:
        """Mean latency of one read with ``depth`` reads in flight."""
        if depth <= 1:
            return self.qd1_ms
        if depth <= 8:
            return self.qd1_ms + (self.qd8_ms - self.qd1_ms) * (depth - 1) / 7
        return max(self.qd8_ms, depth / self.qd8_reads_per_s * 1e3)


def read_time(
    misses_per_request: float,
    device: Device,
    read_threads: int,
    shards: int,
    reads_per_miss: float = 1.0,
    min_chunk_keys: int | None = None,
) -> dict:
    """The model's figures for ``misses_per_request`` (see the module docstring). The c8 bound is None
    (no limit from the disk) when a request misses nothing."""
    if min_chunk_keys is None:
        from offgraph.store.base import MIN_CHUNK_KEYS as min_chunk_keys
    m = misses_per_request
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not (math.isfinite(m) and m >= 0):
        raise ValueError(f"misses per request must be a finite number >= 0, got {m!r}")
    for name, v in (("read_threads", read_threads), ("shards", shards)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    reads = m * reads_per_miss
    chunks = max(shards * (1 - (1 - 1 / shards) ** m), min(m / min_chunk_keys, read_threads))
    in_flight = min(float(read_threads), max(1.0, chunks))
    lat = device.latency_ms(in_flight)
    return {
        "misses_per_request": misses_per_request,
        "reads_per_miss": reads_per_miss,
        "reads_per_request": reads,
        "reads_in_flight": in_flight,
        "latency_at_depth_ms": lat,
        "read_ms_c1": reads / in_flight * lat,
        "c8_bound_req_s": device.qd8_reads_per_s / reads if reads > 0 else None,
    }


def synth_trace(total_rows: int, n_requests: int, n_candidates: int, popularity: str, exponent: float, seed: int = 0):
    """The columnar twin of ``cache_sim.bench_trace`` (see the module docstring): each request's unique
    combined keys, table ids in the spec's field order as ``offgraph.scoring.batch.batch_keys`` numbers them."""
    from offgraph.export.cache_sim import trace_of
    from offgraph.export.traffic import draw_columns

    lists = []
    for start in range(0, n_requests, CHUNK_REQUESTS):
        n = min(CHUNK_REQUESTS, n_requests - start)
        req, cand = draw_columns(total_rows, n, n_candidates, popularity, seed * 1_000_003 + start, exponent)
        lists.extend(request_keys(total_rows, req, cand, n))
    return trace_of(lists)


def request_keys(total_rows: int, req: dict, cand: dict, n: int, exact: bool = False) -> list:
    """Each of ``n`` requests' unique combined keys from ``offgraph.export.traffic.draw_columns``' columns.
    ``exact``: a huge table's rows hashed as FG hashes them (the server's very keys; the distinct ids are
    hashed once each, in Python), else its popularity rank (see the module docstring)."""
    import numpy as np

    from offgraph.export.synth_spec import HUGE_TABLES, synth_spec
    from offgraph.features.hashing import rows_of
    from offgraph.features.ops import bucket_index, log_bucket_index
    from offgraph.store.keys import combine_keys

    spec = synth_spec(total_rows)
    hash_name, huge = spec["model"]["hash"], {n for n, _, _ in HUGE_TABLES}
    cols = []
    for tid, f in enumerate(spec["fields"]):
        v = (req if f["scope"] == "request" else cand)[f["name"]].reshape(n, -1)
        if f["name"] in huge and not exact:  # the rank: a distinct id is a distinct row (collisions aside)
            rows = v.astype(np.int64)
        else:  # what FG computes: the value's class (the id, or its bucket), hashed to a row
            if f["op"] == "log_bucket":
                cls = log_bucket_index(v.astype(np.float64), f["base"])
            elif f["op"] == "bucketize":
                cls = bucket_index(v.astype(np.float64), f["boundaries"])
            else:
                cls = v.astype(np.int64)
            uniq, inv = np.unique(cls, return_inverse=True)
            rows = rows_of((str(c) for c in uniq.tolist()), hash_name, f["rows"])[inv.reshape(cls.shape)]
        cols.append(combine_keys(np.full(rows.size, tid, np.uint32), rows.reshape(-1)).reshape(n, -1))
    k = np.sort(np.concatenate(cols, axis=1), axis=1)
    keep = np.ones(k.shape, dtype=bool)
    keep[:, 1:] = k[:, 1:] != k[:, :-1]
    return [k[i][keep[i]] for i in range(n)]


def sample_rate(capacity_rows: int) -> float:
    """The share of the key space the miniature simulation keeps: a power of 1/2, as small as keeps
    ``SAMPLED_ROWS`` rows in the scaled cache (1: a cache that small is simulated whole)."""
    rate = 1.0
    while capacity_rows * rate / 2 >= SAMPLED_ROWS:
        rate /= 2
    return rate


def sampled(trace, rate: float):
    """The trace's keys whose salted hash falls in the first ``rate`` of the hash space (SHARDS: a key
    is in or out for the whole trace), request bounds kept. Salted: the cache picks a key's set with the
    unsalted hash, so the sample is not one set's keys."""
    import numpy as np

    from offgraph.export.cache_sim import Trace
    from offgraph.store.keys import splitmix64

    if rate >= 1:
        return trace
    keep = (splitmix64(trace.keys ^ np.uint64(_SAMPLE_SALT)) >> np.uint64(11)) < np.uint64(int(rate * 2**53))
    c = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(keep, out=c[1:])
    return Trace(trace.keys[keep], c[trace.bounds])


def _flat(windows: list[dict]) -> bool:
    """The last two windows' misses per request agree with the two before to ``CONVERGED_SHARE``
    (pairs: one window's count is noisy, the sample being a share of the keys), or to
    ``CONVERGED_MISSES`` (a cache that holds nearly every row only loses its last compulsory misses)."""
    if len(windows) < 4:
        return False
    m = [w["misses_per_request"] for w in windows[-4:]]
    now, before = (m[2] + m[3]) / 2, (m[0] + m[1]) / 2
    return abs(now - before) <= max(CONVERGED_SHARE * now, CONVERGED_MISSES)


def steady_hit_ratio(
    capacity_mb: float,
    codec,
    trace_fn,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    min_requests: int = MIN_REQUESTS,
    window: int = WINDOW_REQUESTS,
    max_requests: int = MAX_REQUESTS,
    rate: float | None = None,
    key_space: int | None = None,
    clock=time.monotonic,
) -> dict:
    """The row cache's steady-state misses per request on windows of ``trace_fn(n_requests, i)``.

    A miniature simulation (Waldspurger et al., "Cache Modeling and Optimization using Miniature
    Simulations", USENIX ATC'17): the real ``RowCache`` at ``rate`` of ``capacity_mb`` replays the keys
    of a ``rate`` spatial sample of the trace (``sampled``), so a cache of millions of rows costs what
    one of ``SAMPLED_ROWS`` does; the misses it counts, divided by ``rate``, are the full cache's. A hot
    key, sampled or not, is a hit either way; the misses come from the tail, which the sample covers
    evenly. Windows are replayed until the cache has seen ``FILL_LOOKUPS`` times its rows in lookups and
    the last two windows agree with the two before (``_flat``) (and ``min_requests``), or until
    ``max_requests`` or ``max_seconds``; the last two windows' figures are the steady state's.
    ``key_space``: how many keys there are (a cache bigger than that needs no bigger sample)."""
    from offgraph.export.cache_sim import replay
    from offgraph.store.row_cache import RowCache

    full_rows = int(capacity_mb * (1 << 20) // RowCache(1, codec).bytes_per_row)  # not allocated: its rows
    rate = sample_rate(min(full_rows, key_space or full_rows)) if rate is None else rate
    cache = RowCache(capacity_mb * rate, codec)
    rate = min(1.0, cache.capacity_rows / full_rows)  # the scaled cache's share of the full one's rows
    t0, windows, done, looked = clock(), [], 0, 0
    converged = False
    while done < max_requests:
        full = trace_fn(min(window, max_requests - done), len(windows))
        tr = sampled(full, rate)
        h = replay(cache, tr)
        looked += len(tr.keys)
        keys = len(full.keys) / full.requests
        misses = (1 - h) * len(tr.keys) / rate / full.requests
        windows.append(
            {
                "requests": full.requests,
                "keys_per_request": keys,
                "misses_per_request": misses,
                "hit_ratio": 1 - misses / keys if keys else 1.0,
            }
        )
        done += full.requests
        if done >= min_requests and looked >= FILL_LOOKUPS * cache.capacity_rows and _flat(windows):
            converged = True
            break
        if clock() - t0 > max_seconds:
            break
    last = windows[-2:]  # two windows: half the sampling noise of one
    misses = sum(w["misses_per_request"] for w in last) / len(last)
    keys = sum(w["keys_per_request"] for w in last) / len(last)
    return {
        "misses_per_request": misses,
        "keys_per_request": keys,
        "hit_ratio": 1 - misses / keys if keys else 1.0,
        "requests_measured": sum(w["requests"] for w in last),
        "converged": converged,
        "requests_simulated": done,
        "seconds": clock() - t0,
        "sample_rate": rate,
        "row_cache_rows": full_rows,
        "window_misses_per_request": [w["misses_per_request"] for w in windows],
    }


def predict(
    rows: int,
    memory_mb: float,
    popularity: str = "zipf",
    exponent: float | None = None,
    candidates: int = 200,
    device: Device | None = None,
    read_threads: int | None = None,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_requests: int = MAX_REQUESTS,
    seed: int = 0,
) -> dict:
    """The plan for a synth version of ``rows`` rows served with ``--memory-mb memory_mb`` (one worker)."""
    from offgraph.config import default
    from offgraph.export.synth_config import SynthConfig
    from offgraph.export.synth_spec import huge_table_rows
    from offgraph.export.traffic import ZIPF_EXPONENT
    from offgraph.scoring.memory_budget import BLOCK_DATA_MB, index_mb, split_memory
    from offgraph.store.quant import get_codec

    if device is None:
        raise ValueError("predict needs the device's figures (a probe or given latencies)")
    huge_table_rows(rows)  # refuses a row count the synthetic spec cannot have
    exponent = ZIPF_EXPONENT if exponent is None else exponent
    if popularity == "zipf" and not (math.isfinite(exponent) and exponent > 1):
        raise ValueError(f"the Zipf exponent must be a finite number > 1, got {exponent}")
    dim, quant, shards = (default(SynthConfig, k) for k in ("dim", "quant", "shards"))
    if read_threads is None:
        from offgraph.store.config import DEFAULT_READ_THREADS as read_threads
    codec = get_codec(quant, dim)
    split = split_memory(memory_mb, 1, index_mb=index_mb(rows, codec.record_bytes))
    if split.row_cache_mb <= 0:
        raise ValueError(f"--memory-mb {memory_mb:g} leaves no row cache ({split.describe()})")
    held = (split.block_cache_mb - BLOCK_DATA_MB) / split.index_mb if split.index_mb > 0 else 1.0
    reads_per_miss = 1.0 + (1.0 - min(1.0, max(0.0, held)))

    def trace_fn(n, i):
        return synth_trace(rows, n, candidates, popularity, exponent, seed=seed * 7919 + i)

    window = min(WINDOW_REQUESTS, max(50, max_requests // 4))
    hits = steady_hit_ratio(
        split.row_cache_mb,
        codec,
        trace_fn,
        max_seconds,
        min(MIN_REQUESTS, max_requests),
        window,
        max_requests,
        key_space=rows,
    )
    model = read_time(hits["misses_per_request"], device, read_threads, shards, reads_per_miss)
    return {
        "inputs": {
            "rows": rows,
            "memory_mb": memory_mb,
            "popularity": popularity,
            "zipf_exponent": exponent if popularity == "zipf" else None,
            "candidates": candidates,
            "read_threads": read_threads,
            "shards": shards,
            "quant": quant,
            "dim": dim,
            "device": asdict(device),
        },
        "budget": split.to_dict(),
        "row_cache_rows": hits["row_cache_rows"],
        "hit": hits,
        **model,
    }


def describe(plan: dict) -> str:
    i, h, b = plan["inputs"], plan["hit"], plan["budget"]
    d = i["device"]
    pop = f"Zipf {i['zipf_exponent']:g}" if i["popularity"] == "zipf" else "uniform"
    c8 = plan["c8_bound_req_s"]
    lines = [
        f"plan: {i['rows']:,} rows ({i['quant']}, D={i['dim']}), {pop}, {i['candidates']} candidates, "
        f"--memory-mb {i['memory_mb']:g}, {i['shards']} shards, {i['read_threads']} read threads",
        f"  device ({d['source']}): qd1 {d['qd1_ms']:.3f} ms, qd8 {d['qd8_ms']:.3f} ms, "
        f"{d['qd8_reads_per_s']:,.0f} reads/s at qd8",
        f"  budget: row cache {b['row_cache_mb']:.1f} MiB = {plan['row_cache_rows']:,} rows; block cache "
        f"{b['block_cache_mb']} MiB (index {b['index_mb']:.1f} MiB): {plan['reads_per_miss']:.2f} reads a miss",
        f"  hit ratio {h['hit_ratio']:.2%} over {h['keys_per_request']:.0f} unique keys a request: "
        + (
            f"steady after {h['requests_simulated']:,} simulated requests"
            if h["converged"]
            else f"NOT yet steady after {h['requests_simulated']:,} simulated requests (misses still falling: more "
            f"--max-seconds gives a higher hit ratio)"
        )
        + f" ({h['seconds']:.0f} s, {h['sample_rate']:.3g} of the keys; misses a request by window of "
        f"{h['requests_measured'] // 2:,}: " + " ".join(f"{m:.0f}" for m in h["window_misses_per_request"][-8:]) + ")",
        f"  misses per request {plan['misses_per_request']:.1f}, {plan['reads_in_flight']:.1f} reads in flight "
        f"at {plan['latency_at_depth_ms']:.3f} ms",
        f"  predicted read time per request (c1): {plan['read_ms_c1']:.2f} ms",
        "  c8 throughput bound (disk): " + ("none (no misses)" if c8 is None else f"{c8:,.0f} req/s"),
    ]
    return "\n".join(lines)

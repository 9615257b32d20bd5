"""What the scale bench predicts from the disk and the cache model, per cell: row-cache misses per request
from ``/metrics`` deltas, the read time the disk's probe predicts for them (``offgraph.export.plan``'s model),
perfect LFU on the cell's key trace (``offgraph.export.cache_sim``) and ``offgraph plan``'s own prediction."""

from __future__ import annotations

PROBE_DEPTHS = (1, 8)
SHARDS = 8  # offgraph synth's


def reads_per_request(before: dict[str, float], after: dict[str, float], requests: int) -> dict:
    """Row-cache misses per request between two ``BenchServer.counters`` (each miss reads a row from the
    store), and the store reads' measured wall time per request (``offgraph_store_read_seconds``; None
    where the server does not record it)."""
    n = max(1, requests)
    read_count = after["read_count"] - before["read_count"]
    return {
        "misses_per_request": (after["row_misses"] - before["row_misses"]) / n,
        "read_ms_per_request": (after["read_s_sum"] - before["read_s_sum"]) * 1e3 / n if read_count else None,
    }


def predicted_read(
    misses_per_request: float | None, read_threads: int, device: dict | None, shards: int = SHARDS
) -> dict | None:
    """The read time per request the disk predicts for the measured misses: ``offgraph.export.plan.read_time``
    (the one model, ``offgraph plan``'s): (misses per request / reads in flight) x the device's MEAN
    latency at that depth (its probe at depths 1 and 8, linear between), reads in flight = the
    ``multi_get`` chunks a request's misses make, at least 1 and at most the read threads. Also the c8
    bound: reads/s at depth 8 / misses per request. None without a probe."""
    if misses_per_request is None or not device:
        return None
    from offgraph.export.plan import Device, read_time

    return read_time(misses_per_request, Device.from_profile(device), int(read_threads), shards)


def perfect_lfu(rows: int, args, warm: list[tuple[int, int, int]], sent: list[range], capacity_rows: int) -> float:
    """Perfect LFU's hit ratio (``offgraph.export.cache_sim``'s static oracle) at ``capacity_rows`` on the key
    trace the server's row cache saw: the warm-up (its first ``--warmup-requests`` bodies, then for each
    later round ``(k, bodies drawn, requests sent)``, bodies cycled as ``run_cell`` sends them), then the
    measured requests (``sent``: ranges of the measured bodies' indices), counted over the measured ones
    only. The keys are those the server computes from the same draws as ``measure``'s bodies
    (``build_requests``' columns, same seeds), built as columns (``offgraph.export.plan.request_keys``, exact:
    ``tests/export/test_plan.py`` checks them against the FG's), not through FG request by request (minutes)."""
    from offgraph.export.cache_sim import perfect_lfu_hit_ratio, trace_of
    from offgraph.export.plan import request_keys
    from offgraph.export.traffic import draw_columns

    def keys(n: int, seed: int) -> list:
        req, cand = draw_columns(rows, n, args.candidates, "zipf", seed)
        return request_keys(rows, req, cand, n, exact=True)

    full = keys(args.warmup_requests + args.c1_requests + args.c8_requests + 2, args.seed)
    lists = full[: args.warmup_requests]
    for k, drawn, requests in warm:
        tr = keys(drawn, args.seed + 1000 + k)
        lists += [tr[i % drawn] for i in range(requests)]
    warm_requests = len(lists)
    lists += [full[i] for r in sent for i in r]
    return perfect_lfu_hit_ratio(trace_of(lists), capacity_rows, warm_requests=warm_requests)


def plan_for(run: dict, memory_mb: float | None, args) -> dict | None:
    """``offgraph plan``'s prediction for the cell (``offgraph.export.plan.predict``, from the cell's own device
    probe, at the cell's memory budget): its simulated hit ratio and read time, beside the measured ones.
    None without a probe or where ``--plan-max-s`` is 0."""
    if not run.get("device") or args.plan_max_s <= 0:
        return None
    from offgraph.export.plan import Device, predict
    from offgraph.scoring.memory_budget import DEFAULT_MEMORY_MB

    got = predict(
        run["rows"],
        memory_mb or DEFAULT_MEMORY_MB,
        run["popularity"],
        candidates=args.candidates,
        device=Device.from_profile(run["device"]),
        read_threads=int(run["read_threads"]),
        max_seconds=args.plan_max_s,
    )
    return {
        "hit_ratio": got["hit"]["hit_ratio"],
        "converged": got["hit"]["converged"],
        "misses_per_request": got["misses_per_request"],
        "read_ms": got["read_ms_c1"],
        "c8_bound_req_s": got["c8_bound_req_s"],
        "row_cache_rows": got["row_cache_rows"],
        "memory_mb": got["inputs"]["memory_mb"],
        "reads_per_miss": got["reads_per_miss"],
    }

"""Swap under load: v1 serves steady traffic, v2 appears (a directory renamed into MODELS), then an admin
rollback to v1; every request's time, latency, status and version is kept, PSS is sampled 4x a second.

``run_swap`` drives one experiment against a running server; ``summarize`` turns its trace into the
figures of the report: failed requests, p99 in 1-s bins against the steady p99, the PSS peak, how
long each version took from its trigger (the rename, the rollback call) to serving, and the server's
major page faults and the kernel's page-cache refaults per bin (sampled with PSS).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import orjson

from bench.lib.client import Conn


async def _stream(
    host: str, port: int, path: str, bodies: list[bytes], k: int, step: int, stop: asyncio.Event, trace: list, t0: float
) -> None:
    conn, j = None, k
    while not stop.is_set():
        body = bodies[j % len(bodies)]
        j += step
        t = time.perf_counter()
        try:
            if conn is None:
                conn = await Conn.open(host, port)
            status, payload = await conn.post(path, body)
            version = orjson.loads(payload).get("version", -1) if status == 200 else -1
        except (OSError, asyncio.IncompleteReadError, RuntimeError) as e:  # a failed request, counted
            status, version = -1, -1
            if conn is not None:
                conn.close()
            conn = None
            trace.append((t - t0, time.perf_counter() - t, status, version, repr(e)[:200]))
            continue
        trace.append((t - t0, time.perf_counter() - t, status, version, None))
    if conn is not None:
        conn.close()


async def run_swap(
    server,
    model: str,
    models: Path,
    hidden_v2: Path,
    bodies: list[bytes],
    *,
    concurrency: int = 8,
    steady_s: float = 20.0,
    after_s: float = 15.0,
    timeout_s: float = 300.0,
    warm_s: float = 0.0,
    steady_requests: int = 0,
    steady_max_s: float = 120.0,
) -> dict:
    """Against ``server`` (a ready ``BenchServer`` serving version 1 of ``model``): ``warm_s`` of traffic
    that is not measured (the steady p99 is that of a warm server), steady traffic for ``steady_s`` and
    until ``steady_requests`` were sent in it (at most ``steady_max_s``: a p99 needs enough requests), rename ``hidden_v2`` to ``MODELS/model/2`` (it appears), wait until responses come
    from version 2 and ``after_s`` more, then ``:rollback``, wait until responses come from version 1
    and ``after_s`` more. Returns the raw trace and the event times (seconds from the start)."""
    path = f"/v1/models/{model}:score"
    trace: list = []
    pss: list[tuple[float, int]] = []
    faults: list[tuple[float, int, int]] = []  # (t, the server's major faults, page-cache refaults), cumulative
    stop = asyncio.Event()
    t0 = time.perf_counter()
    events: dict[str, float] = {}

    async def sample_pss():
        # in a thread: reading smaps_rollup walks the server's page tables (tens of ms, longer while the
        # server maps or unmaps memory); on the event loop it would delay every in-flight request's
        # response by as much and charge it to the server
        while not stop.is_set():
            t = time.perf_counter()
            b = await asyncio.to_thread(server.pss_bytes)
            pss.append((t - t0, b, time.perf_counter() - t))
            faults.append((t - t0, *await asyncio.to_thread(server.fault_counters)))
            await asyncio.sleep(0.25)

    async def until_version(v: int, since: float) -> float:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            got = [row for row in trace[-4 * concurrency :] if row[0] >= since and row[3] == v]
            if got:  # when its first answer arrived: from then on requests are sent to it
                return min(row[0] + row[1] for row in got)
            await asyncio.sleep(0.05)
        raise RuntimeError(f"version {v} did not serve within {timeout_s:g} s")

    streams = [
        asyncio.create_task(_stream("127.0.0.1", server.port, path, bodies, k, concurrency, stop, trace, t0))
        for k in range(concurrency)
    ]
    sampler = asyncio.create_task(sample_pss())
    try:
        if warm_s > 0:  # not measured: v1's working set into the page cache and its caches
            await asyncio.sleep(warm_s)
        events["steady_from"] = max(time.perf_counter() - t0, 5.0)  # after the first seconds of connections
        await asyncio.sleep(max(0.0, events["steady_from"] + steady_s - (time.perf_counter() - t0)))
        while (
            sum(row[0] >= events["steady_from"] for row in trace) < steady_requests
            and time.perf_counter() - t0 < events["steady_from"] + steady_max_s
        ):
            await asyncio.sleep(0.25)
        events["v2_appears"] = time.perf_counter() - t0
        os.rename(hidden_v2, models / model / "2")
        events["v2_serving"] = await until_version(2, events["v2_appears"])
        await asyncio.sleep(after_s)
        events["rollback_called"] = time.perf_counter() - t0
        await server.admin_async(model, "rollback")
        events["rollback_answered"] = time.perf_counter() - t0
        events["v1_serving"] = await until_version(1, events["rollback_called"])
        await asyncio.sleep(after_s)
    finally:
        stop.set()
        await asyncio.gather(*streams, sampler, return_exceptions=True)
    events["end"] = time.perf_counter() - t0
    return {"trace": trace, "pss": pss, "faults": faults, "events": events}


def _fault_sums(bins: list[dict]) -> dict:
    """Bins, and their major faults and page-cache refaults in total and per bin (None: not sampled)."""
    out: dict = {"bins": len(bins)}
    for key in ("major_faults", "page_cache_refaults"):
        vals = [b[key] for b in bins if b.get(key) is not None]
        out[key] = sum(vals) if vals else None
        out[key + "_per_bin"] = round(sum(vals) / len(vals), 1) if vals else None
    return out


SWAP_WINDOW_S = 15.0  # the swap's window: from v2 appearing until this long after v2 serves


def summarize(raw: dict, window_s: float = SWAP_WINDOW_S) -> dict:
    """Figures of one swap run (see the module docstring). ``window_p99_ms``: the p99 of every request
    sent from v2 appearing until ``window_s`` after v2's first answer, failed ones included (their time
    to fail counts), in one percentile, not per bin: what a client sees across the swap."""
    ev = raw["events"]
    t = np.array([r[0] for r in raw["trace"]])
    lat = np.array([r[1] for r in raw["trace"]]) * 1e3
    status = np.array([r[2] for r in raw["trace"]])
    ok = status == 200
    steady = ok & (t >= ev.get("steady_from", 5.0)) & (t < ev["v2_appears"])
    steady_p99 = float(np.percentile(lat[steady], 99)) if steady.any() else float("nan")
    window = (t >= ev["v2_appears"]) & (t < ev["v2_serving"] + window_s)
    window_p99 = float(np.percentile(lat[window], 99)) if window.any() else float("nan")
    fl = np.array(raw.get("faults") or [], dtype=float).reshape(-1, 3)

    def faults_in(b: int, col: int) -> float | None:
        """Counter ``col`` of the fault samples over [b, b+1) s, interpolated (None: not sampled)."""
        if len(fl) < 2 or not fl[0, 0] <= b + 1 <= fl[-1, 0] + 1:
            return None
        return round(float(np.interp(b + 1, fl[:, 0], fl[:, col]) - np.interp(b, fl[:, 0], fl[:, col])), 1)

    bins = []
    for b in range(int(np.ceil(ev["end"]))):
        m = (t >= b) & (t < b + 1) & ok
        if m.any():
            bins.append(
                {
                    "t": b,
                    "requests": int(m.sum()),
                    "p50_ms": float(np.percentile(lat[m], 50)),
                    "p99_ms": float(np.percentile(lat[m], 99)),
                    "major_faults": faults_in(b, 1),
                    "page_cache_refaults": faults_in(b, 2),
                }
            )
    after = [b for b in bins if b["t"] >= int(ev["v2_appears"])]
    # the same statistic over the steady phase's own bins, where no version loads: how far single 1-s bins
    # of plain traffic stray from the steady p99 on this machine (a baseline for the bins of the swap)
    steady_bins = [b for b in bins if ev.get("steady_from", 5.0) <= b["t"] and b["t"] + 1 <= ev["v2_appears"]]
    version = np.array([r[3] for r in raw["trace"]])

    def first_on(v: int, since: float, n: int = 100) -> float:
        """p99 of the first ``n`` requests sent after ``since`` (the first answer of the newcomer) and
        answered by version ``v``: the warm-up's test (requests queued while the version loaded are
        in the 1-s bins, not here)."""
        m = np.flatnonzero(ok & (version == v) & (t >= since))[:n]
        return float(np.percentile(lat[m], 99)) if len(m) else float("nan")

    pss = np.array([p for _, p, *_ in raw["pss"]]) if raw["pss"] else np.zeros(1)
    swap_pss = [p for ts, p, *_ in raw["pss"] if ts >= ev["v2_appears"]]
    return {
        "requests": int(len(t)),
        "failed_requests": int((~ok).sum()),
        "failures": sorted({str(r[4] or r[2]) for r in raw["trace"] if r[2] != 200})[:10],
        "steady_p99_ms": steady_p99,
        "steady_requests": int(steady.sum()),
        "steady_s": ev["v2_appears"] - ev.get("steady_from", 5.0),
        "window_s": window_s,
        "window_requests": int(window.sum()),
        "window_p99_ms": window_p99,
        "window_p99_over_steady": window_p99 / steady_p99,
        "max_bin_p99_ms_after_v2_appears": max((b["p99_ms"] for b in after), default=float("nan")),
        "max_bin_p99_over_steady": max((b["p99_ms"] for b in after), default=float("nan")) / steady_p99,
        "steady_max_bin_p99_over_steady": max((b["p99_ms"] for b in steady_bins), default=float("nan")) / steady_p99,
        "bins_over_2x_steady": {
            "steady": [sum(b["p99_ms"] > 2 * steady_p99 for b in steady_bins), len(steady_bins)],
            "after_v2_appears": [sum(b["p99_ms"] > 2 * steady_p99 for b in after), len(after)],
        },
        # what the slow bins had that the others did not: pages read back from disk by the server (code,
        # mapped files) and page-cache pages read again after eviction (e.g. by a proactive reclaim)
        "faults_in_bins_over_2x": _fault_sums([b for b in after if b["p99_ms"] > 2 * steady_p99]),
        "faults_in_other_bins_after_v2_appears": _fault_sums([b for b in after if b["p99_ms"] <= 2 * steady_p99]),
        "pss_steady_mb": float(
            np.median([p for ts, p, *_ in raw["pss"] if ev.get("steady_from", 0.0) <= ts < ev["v2_appears"]] or [0])
        )
        / 2**20,
        "pss_peak_mb": float(max(swap_pss or [0])) / 2**20,
        "pss_peak_whole_run_mb": float(pss.max()) / 2**20,
        "first_100_on_v2_p99_ms": first_on(2, ev["v2_serving"]),
        "first_100_on_v1_again_p99_ms": first_on(1, ev["v1_serving"]),
        "v2_appears_to_serving_s": ev["v2_serving"] - ev["v2_appears"],
        "rollback_to_v1_serving_s": ev["v1_serving"] - ev["rollback_called"],
        "events": ev,
        "bins": bins,
        "pss_samples": [(round(ts, 3), p) for ts, p, *_ in raw["pss"]],
    }

"""Warm a scale-bench server up until its disk reads level off, and record how it got there.

A table that fits in memory is warm after a few hundred requests: its rows are in the row cache,
block cache or page cache. A table bigger than memory serves the rows its caches miss from the
page cache, which only traffic fills: the first requests of a cold server each read MBs from disk.
A fixed warm-up of 200 requests therefore measures a server that just started, not one in service.
So after its first requests the warm-up goes on in rounds of ``round_s`` seconds at concurrency 8,
every request a new one, while the server reads from the disk, until a round reads less than ``FLOOR_KIB`` per
request, or no more than ``level`` less than the round ``WINDOW`` rounds before (the page cache holds
what traffic keeps in it), or ``max_s`` have passed. Rounds are compared ``WINDOW`` apart because one
round's reads move by several percent with its request rate: at 10^9 rows they fell 8% a round on
average, and a rule comparing neighbours stopped at 390 KiB a request, after a round that fell 3.5%,
where a server given more traffic later read 24. Every round's req/s, p99 and disk KiB per request is kept:
the cold start's figures are part of the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.lib.client import run_cell

FLOOR_KIB = 16.0  # less than one data block (16 KiB) per request: nothing left to warm
WINDOW = 3  # rounds between the two compared for "leveled"


def kib_per_request(read_bytes: int, requests: int) -> float:
    """Disk KiB read per request (0 requests: per 1)."""
    return read_bytes / 1024 / max(1, requests)


def stop_reason(kib_per_request: list[float], elapsed_s: float, max_s: float, level: float) -> str | None:
    """Why the warm-up stops after these rounds, or None to go on: ``"no disk reads"``, ``"leveled"``
    (the last round read at least ``1 - level`` times what the round ``WINDOW`` rounds before read),
    ``"time"``."""
    if not kib_per_request:
        return None
    if kib_per_request[-1] < FLOOR_KIB:
        return "no disk reads"
    if len(kib_per_request) > WINDOW and kib_per_request[-1] >= (1.0 - level) * kib_per_request[-1 - WINDOW]:
        return "leveled"
    if elapsed_s >= max_s:
        return "time"
    return None


async def warm_until_steady(
    server,
    path: str,
    first: list[bytes],
    more: Callable[[int, int], list[bytes]],
    candidates: int,
    round_s: float,
    max_s: float,
    level: float,
) -> dict:
    """Warm ``server`` (a ``bench.lib.server.BenchServer``): the ``first`` bodies, then rounds of
    ``round_s`` seconds with ``more(k, n)``'s ``n`` fresh bodies for round ``k`` (every warm-up request
    is distinct, as in service: a repeated pool would warm the caches for its own rare rows only).
    ``max_s`` <= 0: the first bodies only. Returns ``{"seconds", "stopped", "rounds": [{"requests",
    "seconds", "rps", "p99_ms", "disk_kib_per_request"}]}``."""
    rounds: list[dict] = []
    t0 = time.perf_counter()
    while True:
        if not rounds:  # the first round: the ``first`` bodies, once each
            bodies, n, seconds = first, len(first), 600.0
        else:  # about 1.5 rounds' worth at the last round's rate (run_cell cycles them if short)
            bodies = more(len(rounds), int(min(4000, 1.5 * rounds[-1]["rps"] * round_s + 50)))
            n, seconds = 10**9, round_s
        d0 = server.disk_read_bytes()
        cell = await run_cell("127.0.0.1", server.port, path, bodies, 8, n, seconds, 1, candidates, server.pid)
        rounds.append(
            {
                "requests": cell["requests"],
                "seconds": cell["seconds"],
                "rps": cell["rps"],
                "p99_ms": cell["p99_ms"],
                "disk_kib_per_request": kib_per_request(server.disk_read_bytes() - d0, cell["requests"]),
            }
        )
        elapsed = time.perf_counter() - t0
        reason = (
            "fixed" if max_s <= 0 else stop_reason([r["disk_kib_per_request"] for r in rounds], elapsed, max_s, level)
        )
        if reason:
            return {"seconds": elapsed, "stopped": reason, "rounds": rounds}

"""Event-loop lag: how late the server's event loop runs a timer (``offgraph_event_loop_lag_seconds``).

Every request passes through the event loop twice (its body is read there, its response written
there), so a blocked loop delays every in-flight request by as much, whatever the scoring threads
do. The loop is blocked by code that should run in a thread, by a system call that stalls, or by
the GIL held elsewhere (a collection, a load step). The lag tells such a tail apart from slow
scoring. Lags of ``SLOW_LAG_S`` or more are logged at DEBUG: a load step or a collection makes
them on an idle server, and the histogram already counts them. A lag of ``STALL_S`` or more is a
WARNING: every in-flight request waited that long, far beyond any scoring latency, which no
normal step of the server explains (a stalled system call, swapping, a starved process).
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("offgraph.server")

INTERVAL_S = 0.05
SLOW_LAG_S = 0.1
STALL_S = 1.0


async def watch_loop_lag(histogram, interval_s: float = INTERVAL_S, stall_s: float = STALL_S) -> None:
    """Sleep ``interval_s`` again and again, observing how late each wake-up is. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(interval_s)
        lag = max(0.0, loop.time() - t - interval_s)
        histogram.observe(lag)
        if lag >= SLOW_LAG_S:
            level = logging.WARNING if lag >= stall_s else logging.DEBUG
            log.log(level, "event loop: a timer ran %.0f ms late (the loop or the GIL was held)", lag * 1e3)

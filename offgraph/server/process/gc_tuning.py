"""Keep Python's cyclic GC off the request path's tail.

* TensorFlow, Keras and friends leave hundreds of thousands of long-lived objects in the process;
  a full (generation 2) collection walks all of them and holds the GIL long enough to be a
  server's p99 (bench/results/serve-latency/README.md). ``gc.freeze()`` after the imports moves them to the permanent
  generation: collections then walk only what the server created since (loaded versions,
  requests), and a swapped-out version's cyclic garbage is still collected.
* Pauses are measured (``GcPauses``): ``offgraph_gc_pause_seconds{generation}`` on /metrics, and
  a collection that holds the GIL for ``SLOW_GC_S`` or more is logged (DEBUG; a WARNING from
  ``STALL_S``, as a stalled event loop), so that a tail caused by the collector is told apart from
  one caused by the request path.
* A score request of N candidates holds ~9 objects per candidate alive at once (the
  validated candidates, FG values); with the default generation-0 threshold (700) a
  1000-candidate request runs several young collections. A threshold of 10,000 net
  allocations makes them rare; the request's garbage is freed by reference counting anyway.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from typing import Any

from offgraph.server.process.loop_lag import STALL_S

log = logging.getLogger("offgraph.server")

GEN0_THRESHOLD = 10_000
SLOW_GC_S = 0.05
YOUNG_INTERVAL_S = 0.25
"""How often the server collects the young generation itself (``collect_young_forever``). Each collection
walks every young object alive at that moment, and under load that is mostly the requests in flight,
whatever the interval: collecting more often than this costs the GIL more than the items it saves from
piling up (``bench/results/scale-baseline-gc/README.md``)."""


def tune_gc() -> int:
    """Collect once, freeze every object alive now, raise the young-generation threshold.

    Returns how many objects were frozen.
    """
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, g1, g2)
    n = gc.get_freeze_count()
    log.debug(
        "gc: froze %d start-up objects (%.0f ms), generation-0 threshold %d",
        n,
        (time.perf_counter() - t0) * 1e3,
        GEN0_THRESHOLD,
    )
    return n


async def collect_young_forever(interval_s: float = YOUNG_INTERVAL_S) -> None:
    """Collect generation 0 every ``interval_s`` (on the event loop; runs until cancelled).

    The generation-0 threshold counts allocations minus deallocations of GC objects, young or not.
    A full FG item cache evicts an old item for each new one, so the count stays flat while the new
    items (tracked until a collection sees them) pile up in generation 0, and the collection that
    some burst of allocations finally sets off walks them all (bench/results/scale-swap/README.md).
    Collected every ``YOUNG_INTERVAL_S``, the young generation holds what that much traffic made
    (a few milliseconds to walk), and a cached item is untracked the first time.
    """
    while True:
        await asyncio.sleep(interval_s)
        gc.collect(0)


class GcPauses:
    """Times every collection of the cyclic GC (``gc.callbacks``); ``flush()`` puts them into
    ``histogram`` (labelled by generation) and logs the slow ones. ``start()`` / ``stop()``: the
    server's lifespan.

    The callback runs wherever a collection starts: possibly inside a lock held by the code that
    allocated, such as prometheus_client's multiprocess value lock, which is not re-entrant
    (observing a metric there deadlocked a worker), or logging's. So it only appends to a deque
    (no lock); the server flushes it from its poll loop and before /metrics is rendered.
    """

    def __init__(self, histogram, pending: int = 4096):
        self.histogram = histogram
        self._t0 = 0.0
        self._pending: deque[tuple[int, float, int, float]] = deque(maxlen=pending)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            seconds = time.perf_counter() - self._t0
            self._pending.append((info["generation"], seconds, info["collected"], time.time() - seconds))

    def flush(self) -> None:
        """Observe (and log the slow ones of) the collections since the last flush. The log line says
        when the collection ran: a flush can come seconds later (the poll loop waits for a load)."""
        while True:
            try:
                generation, seconds, collected, at = self._pending.popleft()
            except IndexError:
                return
            self.histogram.labels(str(generation)).observe(seconds)
            if seconds >= SLOW_GC_S:
                log.log(
                    logging.WARNING if seconds >= STALL_S else logging.DEBUG,
                    "gc: generation-%d collection held the GIL for %.0f ms at %s.%03d (%d objects collected)",
                    generation,
                    seconds * 1e3,
                    time.strftime("%H:%M:%S", time.localtime(at)),
                    int(at % 1 * 1000),
                    collected,
                )

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

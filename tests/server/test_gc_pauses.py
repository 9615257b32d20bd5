"""GC pauses on /metrics: the collector's callback must never wait for a lock (it runs wherever a
collection starts, possibly inside the metrics code's own non-reentrant locks)."""

from __future__ import annotations

import gc
import threading

from prometheus_client import CollectorRegistry, Histogram

from offgraph.server.process.gc_tuning import GcPauses


def _count(hist: Histogram, generation: str) -> float:
    for metric in hist.collect():
        for s in metric.samples:
            if s.name.endswith("_count") and s.labels.get("generation") == generation:
                return s.value
    return 0.0


def test_a_collection_inside_a_metrics_lock_neither_waits_nor_is_lost():
    hist = Histogram("gc_pause_test_seconds", "test", ["generation"], registry=CollectorRegistry())
    pauses = GcPauses(hist)
    pauses.start()
    done = threading.Event()

    def collect_inside_the_lock() -> None:
        # as when a metric's first child is made (its lock held) and the allocation starts a collection
        with hist._lock:
            gc.collect()
        done.set()

    try:
        t = threading.Thread(target=collect_inside_the_lock, daemon=True)
        t.start()
        t.join(10)
    finally:
        pauses.stop()
    assert done.is_set(), "the gc callback waited for the histogram's lock (a deadlock in a real server)"
    assert _count(hist, "2") == 0  # not observed yet: only recorded
    pauses.flush()
    assert _count(hist, "2") >= 1
    gc.collect()  # stopped: no longer recorded
    pauses.flush()
    assert _count(hist, "2") == 1


def test_the_young_generation_is_collected_on_a_timer_whatever_the_allocation_count():
    """A full FG item cache frees an old item for each new one, so the generation-0 count stays flat
    while new items pile up young; the server collects generation 0 every 50 ms itself. Here the
    automatic collection is off (a threshold no count reaches): only the timer collects."""
    import asyncio

    from offgraph.server.process.gc_tuning import collect_young_forever

    seen: list[int] = []

    def cb(phase, info):
        if phase == "stop":
            seen.append(info["generation"])

    old = gc.get_threshold()
    gc.set_threshold(10**9, old[1], old[2])
    gc.callbacks.append(cb)
    try:

        async def main():
            task = asyncio.create_task(collect_young_forever(0.01))
            await asyncio.sleep(0.2)
            task.cancel()

        asyncio.run(main())
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*old)
    assert seen.count(0) >= 10, seen

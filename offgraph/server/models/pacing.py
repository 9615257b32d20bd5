"""Keep a background job (loading the next version while another serves) to a share of the time.

A load's steps (opening the store, the dense model, verification seeks, warm-up) hold the GIL
and a CPU that the serving version's requests need: on a busy server, a load running flat out
raises every request's latency for its duration. The loader calls ``tick()`` between chunks of
its work; each tick sleeps long enough that, since the previous tick, work took at most
``share`` of the wall clock. Time spent waiting for the GIL counts as work, so a contended load
backs off further.
"""

from __future__ import annotations

import time


class Pacer:
    """``tick()`` after each chunk of work; ``share`` in (0, 1] (1: never sleeps)."""

    def __init__(self, share: float = 1.0):
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"share must be a number in (0, 1], got {share!r}")
        self.share = float(share)
        self.slept_s = 0.0
        self._last = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        if self.share < 1.0:
            pause = (now - self._last) * (1.0 - self.share) / self.share
            time.sleep(pause)
            self.slept_s += pause
        self._last = time.perf_counter()

    def skip(self) -> None:
        """The time since the last tick was spent waiting, not working: no pause is owed for it."""
        self._last = time.perf_counter()

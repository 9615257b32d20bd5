"""Bounded waits on a condition, for tests: poll, never sleep a fixed time hoping it holds."""

from __future__ import annotations

import time


def wait_for(pred, timeout: float, what: str, interval: float = 0.01):
    """``pred()``'s first truthy value, polled every ``interval`` s; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)

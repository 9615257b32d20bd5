"""A log line that may repeat many times a second (a broker that refuses every call, a disk that
fails every write) logged at most once per interval, with the count of the repeats held back:

    retire_log = RepeatLimiter(log)
    retire_log.log(logging.WARNING, "spool %s: could not retire %s: %s", d, name, e, key=e.errno)

    WARNING ... spool /s: could not retire 0001.delta.arrow: [Errno 17] File exists
    WARNING ... spool /s: could not retire 0733.delta.arrow: [Errno 17] File exists (731 more like it in the last 60s)

The repeats are told apart by ``key`` (by default the message's format string, so that a file name
or an offset in its arguments does not make each line new).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

REPEAT_S = 60.0  # the updater's interval: the same error at most once a minute
MAX_KEYS = 1000  # distinct keys remembered; past it the oldest are forgotten (their next line is logged)


class RepeatLimiter:
    def __init__(
        self, logger: logging.Logger, interval_s: float = REPEAT_S, *, clock: Callable[[], float] = time.monotonic
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._seen: dict[Hashable, tuple[float, int]] = {}  # key -> (when last logged, repeats held back since)

    def log(self, level: int, msg: str, *args: object, key: Hashable = None) -> bool:
        """Log ``msg % args`` unless a line of the same ``key`` and level was logged less than
        ``interval_s`` ago (then count it); whether it was logged."""
        k = (level, msg if key is None else key)
        now = self.clock()
        last = self._seen.get(k)
        if last is not None and now - last[0] < self.interval_s:
            self._seen[k] = (last[0], last[1] + 1)
            return False
        held = last[1] if last is not None else 0
        if held:
            msg, args = f"{msg} (%d more like it in the last %.0fs)", (*args, held, now - last[0])  # type: ignore[index]
        self._seen.pop(k, None)
        self._seen[k] = (now, 0)  # newest last: the oldest is forgotten first
        if len(self._seen) > MAX_KEYS:
            del self._seen[next(iter(self._seen))]
        self.logger.log(level, msg, *args)
        return True

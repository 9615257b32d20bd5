"""When a call is tried again (``Retries``), as tenacity retry settings shared by the sync and async clients.

A call says what may be retried (``routes.Call``): a 503 for the score and read calls, a
connection failure for the read (GET) calls only. A 503's Retry-After is the wait; without
one, an exponential backoff with full jitter. Attempts and total time are both bounded: the client
gives up before a wait that would end past ``total_seconds`` (counted from the first attempt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tenacity

from offgraph.client.errors import ApiError, ConnectionFailed, Unavailable


@dataclass(frozen=True)
class Retries:
    """Bounds of the retries of one call.

    Attributes:
        attempts: tries in all, the first included (1: no retries).
        total_seconds: no retry starts past this, counted from the first attempt.
        backoff_seconds: the bound of the first wait when the server gives no Retry-After (or on a
            connection failure): a random wait up to it, the bound doubled at each retry.
        max_backoff_seconds: the largest such bound (a Retry-After is honoured as sent).
    """

    attempts: int = 4
    total_seconds: float = 30.0
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        for name in ("total_seconds", "backoff_seconds", "max_backoff_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be a non-negative number, got {getattr(self, name)!r}")

    def tenacity_kwargs(self, on_unavailable: bool, on_connection: bool) -> dict[str, Any]:
        """Keyword arguments of ``tenacity.Retrying`` / ``AsyncRetrying`` for a call retried on a 503
        (``on_unavailable``) and on a connection failure (``on_connection``). The last error is raised
        as it is, its ``attempts`` set."""
        # "full jitter": a random wait up to the doubled bound, so that clients turned away together spread out
        backoff = tenacity.wait_random_exponential(multiplier=self.backoff_seconds, max=self.max_backoff_seconds)

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, Unavailable) and exc.retry_after is not None:
                return exc.retry_after
            return backoff(state)

        def retried(exc: BaseException) -> bool:
            return (on_unavailable and isinstance(exc, Unavailable)) or (
                on_connection and isinstance(exc, ConnectionFailed)
            )

        def count(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, ApiError):
                exc.attempts = state.attempt_number

        return {
            "retry": tenacity.retry_if_exception(retried),
            # the wait is computed before the stop: stop_before_delay counts it in the total
            "stop": tenacity.stop_after_attempt(self.attempts) | tenacity.stop_before_delay(self.total_seconds),
            "wait": wait,
            "after": count,
            "reraise": True,
        }


NO_RETRIES = Retries(attempts=1)

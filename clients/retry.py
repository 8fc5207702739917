"""When the clients try a failed call again, and how long they wait first.

Only two outcomes are worth another try: UNAVAILABLE (no server answered, or it is draining for a restart)
and RESOURCE_EXHAUSTED (its queue is full). Both say nothing about the request, which the server has not
started, so sending it again is safe. The waits grow exponentially with a random part ("jitter"), so that
many clients refused at the same moment do not all come back at the same moment; no wait runs past the
call's deadline. A stream is retried only while it has not delivered a message, so a caller never sees a
token twice.
"""

from __future__ import annotations

import dataclasses
import random

import grpc

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # tries in all, the first included; 1 = never retry
    initial_backoff: float = 0.1  # seconds before the first retry, before jitter
    max_backoff: float = 2.0  # the longest wait between two tries
    multiplier: float = 2.0  # each wait is this many times the previous one
    jitter: float = 0.5  # fraction of each wait drawn at random: the wait is in [(1 - jitter) * w, w]

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if not 0 <= self.initial_backoff <= self.max_backoff:
            raise ValueError(
                f"RetryPolicy needs 0 <= initial_backoff <= max_backoff, got {self.initial_backoff} and "
                f"{self.max_backoff}"
            )
        if self.multiplier < 1:
            raise ValueError(f"RetryPolicy.multiplier must be at least 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (0 = the first retry)."""
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier**retry)
        draw = (rng or random).random()
        return ceiling * (1 - self.jitter * draw)

    def delay(self, failed_attempts: int, code: grpc.StatusCode, remaining: float | None) -> float | None:
        """How long to wait before trying again, or None to give up.

        Args:
            failed_attempts: tries made so far, all failed (1 after the first failure).
            code: the status of the last failure.
            remaining: seconds left before the call's deadline; None = no deadline.
        """
        if code not in RETRYABLE_CODES or failed_attempts >= self.attempts:
            return None
        wait = self.backoff(failed_attempts - 1)
        if remaining is not None and wait >= remaining:
            return None  # the next try could not even start before the deadline
        return wait


NO_RETRY = RetryPolicy(attempts=1)

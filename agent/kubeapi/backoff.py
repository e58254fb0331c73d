"""How the agent's and the controller's API loops wait after a failure, and what they log meanwhile.

`Backoff(initial, factor, cap, jitter).delay(failures, rand)`: client-go's `wait.Backoff` as a pure
value; `API_BACKOFF` (1 s doubling to 30 s, plus up to 10 %) is every API loop's policy.
`Outage(what, log, ...)`: `.failed(error) -> seconds to wait`, `.recovered()`; it logs one WARNING
when an outage starts, a reminder every `remind_seconds`, and one INFO when it ends.
agent/kubeapi/README.md, "Backoff and outage logs".
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

REMIND_SECONDS = 60.0  # while an outage lasts, how often the log says it still does


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off with jitter, capped (see README.md beside this module)."""

    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.cap and self.factor >= 1 and self.jitter >= 0):
            raise ValueError(f"back-off wants 0 < initial <= cap, factor >= 1, jitter >= 0: {self}")

    def delay(self, failures: int, rand: float = 0.0) -> float:
        """Seconds to wait after the `failures`-th failure in a row (1 = the first)."""
        step = self.initial
        for _ in range(max(failures, 1) - 1):  # a loop, not a power: no overflow after a long outage
            step *= self.factor
            if step >= self.cap:
                break
        step = min(step, self.cap)
        return step + step * self.jitter * min(max(rand, 0.0), 1.0)


API_BACKOFF = Backoff()


def duration_text(seconds: float) -> str:
    """`seconds` as 45s, 3m05s or 2h03m."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Outage:
    """One loop's failures in a row: the wait before each retry and a log that stays quiet."""

    def __init__(self, what: str, log: logging.Logger, backoff: Backoff = API_BACKOFF, *,
                 clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random,
                 remind_seconds: float = REMIND_SECONDS) -> None:
        self.what = what
        self.log = log
        self.backoff = backoff
        self.clock = clock
        self.rand = rand
        self.remind_seconds = remind_seconds
        self.failures = 0
        self.since: float | None = None  # when the outage began; None while the loop works
        self._told = 0.0  # when the log last said so

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, error: object) -> float:
        """Count one failure; log when the outage starts or a reminder is due; the seconds to wait."""
        now = self.clock()
        self.failures += 1
        delay = self.backoff.delay(self.failures, self.rand())
        if self.since is None:
            self.since = self._told = now
            self.log.warning("%s: %s; retrying until it works (the log reminds every %s)", self.what,
                             error, duration_text(self.remind_seconds))
        elif now - self._told >= self.remind_seconds:
            self._told = now
            self.log.warning("%s: still failing after %s (%d attempts): %s", self.what,
                             duration_text(now - self.since), self.failures, error)
        else:
            self.log.debug("%s: %s; retrying in %.1fs", self.what, error, delay)
        return delay

    def recovered(self) -> None:
        """The loop worked again: log the end of an outage once, and start the back-off afresh."""
        if self.since is not None:
            self.log.info("%s: working again after %s (%d failed attempts)", self.what,
                          duration_text(self.clock() - self.since), self.failures)
        self.since = None
        self.failures = 0

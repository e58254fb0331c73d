"""Which pod warnings become Kubernetes Events: `WarningLimiter`, a bounded, per-pod rate limit.

A pod's owner controls its annotations, and so the text of its warnings: a
pod cycling bad values must cost a bounded number of Events and bounded memory.  Each distinct
warning goes out once per pod; a pod gets `WARN_BURST` Events at once, then one per
`WARN_REFILL_SECONDS`; a warning held back by that limit is offered again every reconcile while the
pod still says it, so the pod's current problem is always told in the end.  At most
`WARN_KEYS_PER_POD` warnings are remembered per pod and `WARN_KEYS_TOTAL` in all (the least recently
warned pod is forgotten first); a pod's are forgotten when it goes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

WARN_BURST = 5  # Events a pod may get at once...
WARN_REFILL_SECONDS = 60.0  # ...then one more per this many seconds
WARN_KEYS_PER_POD = 16  # distinct warnings remembered per pod (each is sent once while remembered)
WARN_KEYS_TOTAL = 4096  # and across every pod
WARN_PODS_TOTAL = 1024  # pods remembered (a node runs a few hundred at most)


@dataclass(slots=True)
class _PodWarnings:
    tokens: float  # Events the pod may get now (a token bucket)
    stamp: float  # when `tokens` was last brought up to date
    sent: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)  # (reason, message)


class WarningLimiter:
    """Which pod warnings become Events: each once per pod, at most `burst` at once and one per
    `refill_seconds` after that, per pod, with a bounded memory (see the module docstring)."""

    def __init__(self, *, burst: int = WARN_BURST, refill_seconds: float = WARN_REFILL_SECONDS,
                 keys_per_pod: int = WARN_KEYS_PER_POD, keys_total: int = WARN_KEYS_TOTAL,
                 pods_total: int = WARN_PODS_TOTAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.keys_per_pod = keys_per_pod
        self.keys_total = keys_total
        self.pods_total = pods_total
        self._clock = clock
        self._pods: OrderedDict[str, _PodWarnings] = OrderedDict()  # least recently warned first
        self._keys = 0
        self.held: set[str] = set()  # uids with a warning held back by the rate limit
        self.suppressed = 0  # warnings held back, all told

    @property
    def keys(self) -> int:
        """Warnings remembered across every pod."""
        return self._keys

    def remembered(self, uid: str) -> int:
        """Warnings remembered for pod `uid`."""
        pod = self._pods.get(uid)
        return 0 if pod is None else len(pod.sent)

    def admit(self, uid: str, reason: str, message: str) -> bool:
        """True when this warning should become an Event now: not sent before, and within the limit."""
        now = self._clock()
        pod = self._pods.get(uid)
        if pod is None:
            pod = self._pods[uid] = _PodWarnings(tokens=float(self.burst), stamp=now)
        else:
            self._pods.move_to_end(uid)
        key = (reason, message)
        if key in pod.sent:
            pod.sent.move_to_end(key)
            return False
        pod.tokens = min(float(self.burst), pod.tokens + max(now - pod.stamp, 0.0) / self.refill_seconds)
        pod.stamp = now
        if pod.tokens < 1.0:
            self.held.add(uid)
            self.suppressed += 1
            return False
        pod.tokens -= 1.0
        pod.sent[key] = None
        self._keys += 1
        if len(pod.sent) > self.keys_per_pod:
            pod.sent.popitem(last=False)
            self._keys -= 1
        while len(self._pods) > 1 and (self._keys > self.keys_total or len(self._pods) > self.pods_total):
            oldest = next(iter(self._pods))
            self.forget(oldest)
        return True

    def forget(self, uid: str) -> None:
        """Drop everything remembered about pod `uid`."""
        pod = self._pods.pop(uid, None)
        if pod is not None:
            self._keys -= len(pod.sent)
        self.held.discard(uid)

    def take_held(self) -> set[str]:
        """The pods with a warning held back since the last call (the caller offers them again)."""
        held, self.held = self.held, set()
        return held

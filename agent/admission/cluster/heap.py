"""The controller's garbage-collection policy: a big heap of API objects, scanned rarely.

`Heap(full_every=600.0, clock=time.monotonic)`: `.after_pass()` collects the young generations and
freezes the survivors, with one full collection every `full_every` seconds; `.full_collections`.
`paused()` (thread-safe, nestable) wraps a big list's decoding: no automatic collection inside.
Why (40% of the CPU on a 1,000-node cluster): agent/admission/cluster/README.md, "Garbage collection".
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

FULL_EVERY_SECONDS = 600.0
_paused = 0
_paused_lock = threading.Lock()
_was_enabled = True  # the collector's state when the first pause began


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside (see README.md beside this module); what was made is frozen after."""
    global _paused, _was_enabled
    with _paused_lock:
        _paused += 1
        if _paused == 1:
            _was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()
                gc.freeze()


class Heap:
    """See README.md beside this module."""

    def __init__(self, full_every: float = FULL_EVERY_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every = full_every
        self.clock = clock
        self._last_full = clock()
        self.full_collections = 0

    def after_pass(self) -> None:
        now = self.clock()
        if now - self._last_full >= self.full_every:
            gc.unfreeze()
            gc.collect()
            self._last_full = now
            self.full_collections += 1
        else:
            gc.collect(1)
        gc.freeze()

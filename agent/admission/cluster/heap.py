"""The controller's garbage-collection policy: a big heap of API objects, scanned rarely.

The controller holds every Job, pod, Node and NRT of the cluster as decoded JSON: millions of
container objects that live for the object's lifetime and never form reference cycles (reference
counting frees them).  CPython's collector would still walk all of them on every full collection,
which came to 40% of the controller's CPU on a 1,000-node cluster.  So after each pass
`Heap.after_pass()` collects the young generations (short-lived cycles die there) and freezes the
survivors out of the collector's sight (`gc.freeze`); every `full_every` seconds it thaws them and
runs one full collection, so a cycle that outlived a pass is still freed, only later.

A list of a big collection (100,000 pods) decodes into millions of objects at once, and the
collector's rule of a full collection each time the heap grows by a quarter makes that cost several
full scans of a growing heap: most of the controller's start-up.  `paused()` wraps such a list: no
automatic collection while any list is decoding (reference counting still frees what dies), and the
decoded objects are frozen at the end.

Public API: `Heap(full_every=600.0, clock=time.monotonic)` with `.after_pass()`; `.full_collections`
counts the full ones.  `paused()`: a context manager (thread-safe, nestable).
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
    """No automatic collection inside (see the module docstring); what was made is frozen after."""
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
    """See the module docstring."""

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

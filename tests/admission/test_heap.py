"""The controller's collection policy: survivors frozen after a pass, cycles still freed by the periodic
full collection, and no automatic collection while a big list decodes."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from agent.admission.cluster import heap


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_survivors_are_frozen_and_a_dead_cycle_waits_for_the_full_collection() -> None:
    now = [0.0]
    h = heap.Heap(full_every=600.0, clock=lambda: now[0])
    c = Cycle()
    dead = weakref.ref(c)
    h.after_pass()  # c survives the young collection: it is frozen
    assert gc.get_freeze_count() > 0
    del c
    gc.collect()  # a frozen cycle is out of the collector's sight
    assert dead() is not None
    now[0] = 599.0
    h.after_pass()
    assert dead() is not None and h.full_collections == 0
    now[0] = 600.0
    h.after_pass()  # thawed, collected in full, the survivors frozen again
    assert dead() is None and h.full_collections == 1


def test_a_young_cycle_dies_at_the_pass() -> None:
    h = heap.Heap(clock=lambda: 0.0)
    gc.unfreeze()
    c = Cycle()
    dead = weakref.ref(c)
    del c
    h.after_pass()
    assert dead() is None


def test_paused_lists_nest_across_threads() -> None:
    gc.enable()
    inside = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with heap.paused():
            inside.set()
            leave.wait(5)

    t = threading.Thread(target=other)
    with heap.paused():
        assert not gc.isenabled()
        t.start()
        assert inside.wait(5)
    assert not gc.isenabled()  # the other list is still decoding
    leave.set()
    t.join(5)
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    with heap.paused():
        pass
    assert not gc.isenabled()

"""When a pod warning becomes an Event (`agent.kube.pods.warnings.WarningLimiter`): once per distinct
warning,
a burst then one per refill period per pod, bounded memory, forgotten with the pod.

The pinner rows run a real `PodPinner` over a `RecordingEngine` (no cgroups) on a hardware dump, as
in test_numa_zone.py; the clock is the test's, so no row waits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.api.podplan import PodPlan, plan_pod
from agent.enforce.state_file import StateFile
from agent.kube.pods.pinner import PodPinner
from agent.kube.pods.warnings import WarningLimiter
from agent.kube.pods.watch import Changed, Gone, Synced
from agent.metrics.registry import Metrics
from agent.pinning.recording import RecordingEngine
from agent.topology.discover import discover
from tests.kube.test_numa_zone import DUMP, Recorder
from tests.kube.test_pods import g, pod


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(clock: Clock, **kw: Any) -> WarningLimiter:
    return WarningLimiter(clock=clock, **({"burst": 3, "refill_seconds": 60.0} | kw))


def test_the_same_warning_is_sent_once() -> None:
    lim = limiter(Clock())
    assert lim.admit("u", "InvalidAnnotation", "x") is True
    assert [lim.admit("u", "InvalidAnnotation", "x") for _ in range(10)] == [False] * 10
    assert lim.admit("u", "NotEligible", "x") is True  # another reason is another warning
    assert lim.admit("v", "InvalidAnnotation", "x") is True  # and another pod another key
    assert not lim.held


def test_a_pod_gets_a_burst_then_one_per_refill_period() -> None:
    clock = Clock()
    lim = limiter(clock)
    sent = [lim.admit("u", "InvalidAnnotation", f"value {i}") for i in range(10)]
    assert sent == [True] * 3 + [False] * 7
    assert lim.held == {"u"} and lim.suppressed == 7
    assert lim.admit("v", "InvalidAnnotation", "value 0") is True  # the limit is per pod
    clock.now += 59.0
    assert lim.admit("u", "InvalidAnnotation", "value 10") is False
    clock.now += 1.0
    assert lim.admit("u", "InvalidAnnotation", "value 11") is True
    assert lim.admit("u", "InvalidAnnotation", "value 12") is False
    clock.now += 3600.0  # a quiet hour refills the burst, never beyond it
    assert [lim.admit("u", "InvalidAnnotation", f"later {i}") for i in range(5)] == [True] * 3 + [False] * 2


def test_a_held_warning_is_not_remembered_as_sent() -> None:
    clock = Clock()
    lim = limiter(clock, burst=1)
    assert lim.admit("u", "R", "a") is True
    assert lim.admit("u", "R", "b") is False
    assert lim.take_held() == {"u"} and lim.take_held() == set()
    clock.now += 60.0
    assert lim.admit("u", "R", "b") is True  # offered again, it goes out now


def test_memory_is_bounded_per_pod_and_in_all() -> None:
    lim = limiter(Clock(), burst=10**9, keys_per_pod=4, keys_total=50, pods_total=20)
    for i in range(100):
        assert lim.admit("u", "R", f"v{i}")
    assert lim.remembered("u") == 4 and lim.keys == 4
    assert lim.admit("u", "R", "v99") is False  # the most recent ones are the ones remembered
    for p in range(100):
        for i in range(4):
            lim.admit(f"pod-{p}", "R", f"v{i}")
    assert lim.keys <= 50
    assert lim.remembered("pod-99") == 4  # the least recently warned pods went first
    assert lim.remembered("pod-0") == 0 and lim.remembered("u") == 0
    lim2 = limiter(Clock(), burst=10**9, keys_per_pod=1, keys_total=10**6, pods_total=20)
    for p in range(100):
        lim2.admit(f"pod-{p}", "R", "v")
    assert lim2.keys == 20  # pods, not only keys, are capped


def test_forget_drops_a_pods_warnings() -> None:
    lim = limiter(Clock(), burst=1)
    lim.admit("u", "R", "a")
    lim.admit("u", "R", "b")
    lim.forget("u")
    assert lim.remembered("u") == 0 and lim.keys == 0 and not lim.held
    assert lim.admit("u", "R", "a") is True  # a pod that comes back starts afresh


# -- the pinner: cycling annotation values ----------------------------------------------------------


U1 = "11111111-2222-3333-4444-555555555555"  # pod uids are UUIDs: the cgroup path is built from them
U2 = "11111111-2222-3333-4444-666666666666"


def bad(value: str, uid: str = U1) -> PodPlan:
    obj = pod([g(cpu="2")], qos="Guaranteed", annotations={"topolet.io/smt": value})
    obj["metadata"].update(uid=uid, name=uid)
    return plan_pod(obj)


def cycling_pinner(dump_root: Any, tmp: Path, clock: Clock) -> tuple[PodPinner, Recorder]:
    topo = discover(str(dump_root(DUMP)))
    warned = Recorder()
    p = PodPinner(RecordingEngine(topo, StateFile(str(tmp / "state"))), Metrics(), warned, enforce=False,
                  warnings=WarningLimiter(burst=3, refill_seconds=60.0, keys_per_pod=8, clock=clock))
    return p, warned


def test_cycling_bad_values_costs_a_bounded_number_of_events(dump_root: Any, tmp_path: Path) -> None:
    clock = Clock()
    p, warned = cycling_pinner(dump_root, tmp_path, clock)
    for i in range(50):
        p.handle(Changed(bad(f"v{i}")))
    assert len(warned.warnings) == 3
    assert all(w.reason == "InvalidAnnotation" for _, w in warned.warnings)
    assert p.warnings.remembered(U1) == 3 and p.warnings.keys == 3
    assert not p.engine.state_file.load(missing_ok=True).allocations  # shared throughout
    # The pod settles on its last bad value: the next reconcile after the refill tells it.
    p.offer_held_warnings()
    assert len(warned.warnings) == 3
    clock.now += 60.0
    p.offer_held_warnings()
    assert len(warned.warnings) == 4 and "'v49'" in warned.warnings[-1][1].message
    p.offer_held_warnings()
    assert len(warned.warnings) == 4  # told once


def test_a_pod_that_goes_is_forgotten(dump_root: Any, tmp_path: Path) -> None:
    clock = Clock()
    p, warned = cycling_pinner(dump_root, tmp_path, clock)
    for i in range(5):
        p.handle(Changed(bad(f"v{i}")))
        p.handle(Changed(bad(f"v{i}", uid=U2)))
    assert p.warnings.remembered(U1) == 3
    p.handle(Gone(U1))
    assert p.warnings.remembered(U1) == 0
    p.handle(Synced({}))  # a relist without u-2: it went while the watch was down
    assert p.warnings.keys == 0 and not p.warnings.held


def test_a_good_pod_is_still_pinned_and_unwarned(dump_root: Any, tmp_path: Path) -> None:
    clock = Clock()
    p, warned = cycling_pinner(dump_root, tmp_path, clock)
    for i in range(10):
        p.handle(Changed(bad(f"v{i}")))
    p.handle(Changed(bad("full-cores")))  # fixed: pinned at once, nothing more to tell
    (a,) = p.engine.state_file.load().allocations
    assert len(a.cpus) == 2 and len(warned.warnings) == 3

"""Queue order and the StrictFIFO / BestEffortFIFO admission pass, as tables."""

from __future__ import annotations

import pytest

from agent.admission.engine.model import Gang, Placement, PodSet, Refusal, Resources
from agent.admission.jobs.queues import Blocked, Pending, admission_pass, parse_queue_modes
from agent.errors import ConfigError


def _pending(name: str, queue: str = "q", *, cpus: int = 1, priority: int = 0,
             created: str = "2026-01-01T00:00:00Z") -> Pending:
    gang = Gang(key=f"ns/{name}", priority=priority,
                pod_sets=(PodSet("main", 1, Resources(cpu_milli=cpus * 1000)),))
    return Pending(gang, queue, created, name)


def T(n: str) -> str:
    """A creation time; later n sorts later."""
    return f"2026-01-01T00:00:{n}Z"


def _engine(free_cpus: int, never_over: int = 100):  # type: ignore[no-untyped-def]
    """A stand-in decide(): one pool of CPUs; it counts what it admits, as the controller's does."""
    left = [free_cpus * 1000]

    def decide(gang: Gang) -> Placement | Refusal:
        need = gang.pod_sets[0].requests.cpu_milli
        if need > never_over * 1000:
            return Refusal(gang.key, "never", "bigger than the cluster")
        if need > left[0]:
            return Refusal(gang.key, "not-now", f"needs {need}, {left[0]} free")
        left[0] -= need
        return Placement(gang.key, ())

    return decide


def _summary(outcomes: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    out = []
    for o in outcomes:
        r = o.result
        kind = ("admitted" if isinstance(r, Placement) else f"blocked:{r.head}" if isinstance(r, Blocked)
                else r.kind)
        out.append((o.pending.name, kind))
    return out


CASES = [
    # (what, pending, modes, free CPUs, expected [(name, result)] in decision order)
    ("order by priority then time then name",
     [_pending("c", created=T(12)), _pending("b", created=T(11)),
      _pending("a", created=T(12)), _pending("hi", priority=10, created=T(20))],
     {}, 100, [("hi", "admitted"), ("b", "admitted"), ("a", "admitted"), ("c", "admitted")]),
    ("best effort: later gangs pass a head that does not fit",
     [_pending("big", cpus=8, created=T(10)), _pending("small", cpus=2, created=T(11))],
     {}, 4, [("big", "not-now"), ("small", "admitted")]),
    ("strict: the head blocks the rest of its queue",
     [_pending("big", cpus=8, created=T(10)), _pending("small", cpus=2, created=T(11))],
     {"q": "StrictFIFO"}, 4, [("big", "not-now"), ("small", "blocked:ns/big")]),
    ("strict: a never-fitting head is rejected and does not block",
     [_pending("huge", cpus=500, created=T(10)), _pending("small", cpus=2, created=T(11))],
     {"q": "StrictFIFO"}, 4, [("huge", "never"), ("small", "admitted")]),
    ("strict blocks only its own queue",
     [_pending("big", "s", cpus=8, created=T(10)), _pending("s2", "s", cpus=1, created=T(11)),
      _pending("other", "b", cpus=2, created=T(12))],
     {"s": "StrictFIFO"}, 4, [("big", "not-now"), ("s2", "blocked:ns/big"), ("other", "admitted")]),
    ("capacity taken by an earlier admission is seen by later gangs",
     [_pending("a", cpus=3, created=T(10)), _pending("b", cpus=3, created=T(11)),
      _pending("c", cpus=1, created=T(12))],
     {}, 4, [("a", "admitted"), ("b", "not-now"), ("c", "admitted")]),
    ("priority crosses queues", [_pending("low", "x", cpus=4), _pending("high", "y", cpus=4, priority=5)],
     {}, 4, [("high", "admitted"), ("low", "not-now")]),
]


@pytest.mark.parametrize(("what", "pending", "modes", "free", "expected"), CASES, ids=[c[0] for c in CASES])
def test_admission_pass(what: str, pending: list[Pending], modes: dict[str, str], free: int,
                        expected: list[tuple[str, str]]) -> None:
    assert _summary(admission_pass(pending, modes, _engine(free))) == expected


@pytest.mark.parametrize(("flags", "expected"), [
    ([], {}),
    (["gpu=StrictFIFO", "cpu=BestEffortFIFO"], {"gpu": "StrictFIFO", "cpu": "BestEffortFIFO"}),
    ([" a = StrictFIFO "], {"a": "StrictFIFO"}),
])
def test_parse_queue_modes(flags: list[str], expected: dict[str, str]) -> None:
    assert parse_queue_modes(flags) == expected


@pytest.mark.parametrize("flags", [["a"], ["=StrictFIFO"], ["a=Fifo"], ["a=StrictFIFO", "a=BestEffortFIFO"]])
def test_parse_queue_modes_rejects(flags: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_queue_modes(flags)

"""The operator's queues (parsing, who may enter), queue order and the StrictFIFO / BestEffortFIFO
admission pass, as tables."""

from __future__ import annotations

import pytest

from agent.admission.engine.model import Gang, Placement, PodSet, Refusal, Resources
from agent.admission.jobs.queues import (
    DEFAULT_QUEUE,
    Blocked,
    Pending,
    QueueConfig,
    admission_pass,
    parse_queues,
    queue_refusal,
)
from agent.errors import ConfigError


def _pending(name: str, queue: str = "q", *, cpus: int = 1, priority: int = 0,
             created: str = "2026-01-01T00:00:00Z", namespace: str = "ns") -> Pending:
    gang = Gang(key=f"{namespace}/{name}", priority=priority,
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


def _queues(modes: dict[str, str]) -> dict[str, QueueConfig]:
    return {name: QueueConfig(name, mode) for name, mode in modes.items()}


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
    assert _summary(admission_pass(pending, _queues(modes), _engine(free))) == expected


def _team(*namespaces: str) -> frozenset[str]:
    return frozenset(namespaces)


@pytest.mark.parametrize(("flags", "expected"), [
    ([], {"default": DEFAULT_QUEUE}),
    (["gpu=StrictFIFO", "cpu=BestEffortFIFO"],
     {"gpu": QueueConfig("gpu", "StrictFIFO"), "cpu": QueueConfig("cpu", "BestEffortFIFO")}),
    ([" a = StrictFIFO "], {"a": QueueConfig("a", "StrictFIFO")}),
    (["research=StrictFIFO:team-a"], {"research": QueueConfig("research", "StrictFIFO", _team("team-a"))}),
    (["research=BestEffortFIFO: team-a , team-b"],
     {"research": QueueConfig("research", "BestEffortFIFO", _team("team-a", "team-b"))}),
    # Naming any queue replaces the built-in one: `default` exists only where the operator names it.
    (["default=StrictFIFO:ops"], {"default": QueueConfig("default", "StrictFIFO", _team("ops"))}),
])
def test_parse_queues(flags: list[str], expected: dict[str, QueueConfig]) -> None:
    assert parse_queues(flags) == expected


@pytest.mark.parametrize(("flags", "says"), [
    (["a"], "wants NAME=MODE"),
    (["=StrictFIFO"], "wants NAME=MODE"),
    (["a=Fifo"], "mode must be one of StrictFIFO, BestEffortFIFO, got 'Fifo'"),
    (["a=StrictFIFO:team-a=x"], "is not a namespace name"),
    (["a=StrictFIFO", "a=BestEffortFIFO"], "--queue a given twice"),
    (["a=StrictFIFO:"], "an empty namespace"),
    (["a=StrictFIFO:team-a,,team-b"], "an empty namespace"),
    (["a=StrictFIFO:Team-A"], "'Team-A' is not a namespace name"),
    (["a=StrictFIFO:team.a"], "'team.a' is not a namespace name"),
    ([f"a=StrictFIFO:{'n' * 64}"], "is not a namespace name"),
    (["a=StrictFIFO:team-a,team-a"], "namespace team-a listed twice"),
    (["bad name=StrictFIFO"], "a queue name is a label value"),
    (["a=StrictFIFO:*"], "'*' is not a namespace name"),
])
def test_parse_queues_refuses(flags: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_queues(flags)
    assert says in str(caught.value)


QUEUES = parse_queues(["research=StrictFIFO:team-a,team-b", "shared=BestEffortFIFO", "ops=StrictFIFO:ops"])


@pytest.mark.parametrize(("queue", "namespace", "reason", "says"), [
    ("research", "team-a", None, ""),
    ("shared", "anyone", None, ""),
    ("ops", "ops", None, ""),
    ("research", "team-c", "QueueNotAllowed",
     "queue 'research' does not take Jobs from namespace team-c (namespace team-c may use: shared)"),
    ("nope", "team-a", "UnknownQueue",
     "queue 'nope' is not configured (namespace team-a may use: research, shared)"),
    ("default", "ops", "UnknownQueue", "(namespace ops may use: ops, shared)"),
])
def test_queue_refusal(queue: str, namespace: str, reason: str | None, says: str) -> None:
    refusal = queue_refusal(QUEUES, queue, namespace)
    assert (refusal.reason if refusal else None) == reason
    if refusal is not None:
        assert says in refusal.message and "stays suspended" in refusal.message


def test_a_namespace_no_queue_takes_is_told_so_and_long_lists_are_cut() -> None:
    only = parse_queues(["a=StrictFIFO:team-a"])
    assert "no queue takes namespace team-b" in queue_refusal(only, "a", "team-b").message  # type: ignore[union-attr]
    many = parse_queues([f"q{i:02}=BestEffortFIFO" for i in range(25)])
    message = queue_refusal(many, "x", "ns").message  # type: ignore[union-attr]
    assert "q09 and 15 more" in message and "q10" not in message


def _admitted(jobs: list[tuple[str, str, str]], queues: dict[str, QueueConfig],
              free: int) -> list[tuple[str, str]]:
    """What the intake and the pass make of (namespace, name, queue) Jobs: refused ones never reach the
    pass (they are told apart as "refused:REASON"), the rest go through it in queue order."""
    refused, pending = [], []
    for i, (namespace, name, queue) in enumerate(jobs):
        why = queue_refusal(queues, queue, namespace)
        if why is not None:
            refused.append((name, f"refused:{why.reason}"))
        else:
            pending.append(_pending(name, queue, cpus=8 if name.startswith("big") else 1,
                                    created=T(f"{10 + i}"), namespace=namespace))
    return refused + _summary(admission_pass(pending, queues, _engine(free)))


PASS_CASES = [
    # (what, queues, (namespace, name, queue) Jobs in creation order, free CPUs, expected)
    ("another namespace cannot block a StrictFIFO queue open to team-a only",
     parse_queues(["research=StrictFIFO:team-a"]),
     [("team-b", "big-head", "research"), ("team-a", "small", "research")], 4,
     [("big-head", "refused:QueueNotAllowed"), ("small", "admitted")]),
    ("today's block, between two namespaces the queue takes",
     parse_queues(["research=StrictFIFO:team-a,team-b"]),
     [("team-b", "big-head", "research"), ("team-a", "small", "research")], 4,
     [("big-head", "not-now"), ("small", "blocked:team-b/big-head")]),
    ("a queue nobody configured holds nothing and blocks nothing",
     parse_queues(["research=StrictFIFO"]),
     [("team-b", "big-x", "r4nd0m"), ("team-a", "small", "research")], 4,
     [("big-x", "refused:UnknownQueue"), ("small", "admitted")]),
    ("the built-in queue takes every namespace, best effort",
     parse_queues([]),
     [("team-b", "big-head", "default"), ("team-a", "small", "default"), ("team-c", "other", "q")], 4,
     [("other", "refused:UnknownQueue"), ("big-head", "not-now"), ("small", "admitted")]),
]


@pytest.mark.parametrize(("what", "queues", "jobs", "free", "expected"), PASS_CASES,
                         ids=[c[0] for c in PASS_CASES])
def test_queues_decide_who_enters_the_pass(what: str, queues: dict[str, QueueConfig],
                                           jobs: list[tuple[str, str, str]], free: int,
                                           expected: list[tuple[str, str]]) -> None:
    assert _admitted(jobs, queues, free) == expected

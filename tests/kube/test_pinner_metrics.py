"""What the in-cluster pinner counts: refusals (with their reason) apart from errors, releases.

A real `PodPinner` over a `RecordingEngine` (no cgroups) on the 64-CPU, 4-NUMA dump
tests/data/hwloc/dumps/64fake-4n2s2ca2c2t (16 CPUs per NUMA node), wired to the metrics as
`agent.kube.daemon.KubeAgent` wires them; no root, no cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.api.podplan import PodPlan, PodWarning, plan_pod
from agent.enforce.state_file import StateFile
from agent.errors import StateError
from agent.kube.pods.pinner import PodPinner
from agent.kube.pods.watch import Changed
from agent.metrics.registry import ALLOCATION_RESULTS, REFUSAL_REASONS, Metrics
from agent.pinning.recording import RecordingEngine
from agent.pinning.refusal import ALIGNMENT, CAPACITY, INVALID
from agent.pinning.usage import cpu_rows
from agent.topology.discover import discover
from tests.kube.test_pods import g, pod

DUMP = "64fake-4n2s2ca2c2t"


def counts(m: Metrics) -> dict[str, float]:
    """Every allocation result and refusal reason, as the registry would be scraped now."""
    out = {r: m.registry.get_sample_value("topolet_allocations_total", {"result": r})
           for r in ALLOCATION_RESULTS}
    out |= {f"refused:{r}": m.registry.get_sample_value("topolet_allocation_refusals_total", {"reason": r})
            for r in REFUSAL_REASONS}
    assert None not in out.values(), out  # every series exists, counted or not
    return {k: float(v or 0) for k, v in out.items()}


def zero(**changed: float) -> dict[str, float]:
    base = {r: 0.0 for r in ALLOCATION_RESULTS} | {f"refused:{r}": 0.0 for r in REFUSAL_REASONS}
    return base | {k.replace("_", ":"): v for k, v in changed.items()}


def made(dump_root: Any, tmp: Path) -> tuple[PodPinner, Metrics]:
    metrics = Metrics()
    engine = RecordingEngine(discover(str(dump_root(DUMP))), StateFile(str(tmp / "state")))
    engine.on_release = metrics.released
    metrics.watch_cpus(lambda: cpu_rows(engine.usage()))

    def warn(_plan: PodPlan, _w: PodWarning) -> None:
        return None

    return PodPinner(engine, metrics, warn, enforce=False), metrics


def guaranteed(uid: str, cpus: str, **notes: Any) -> PodPlan:
    obj = pod([g(cpu=cpus)], qos="Guaranteed",
              annotations={f"topolet.io/{k.replace('_', '-')}": v for k, v in notes.items()})
    obj["metadata"].update(uid=uid, name=uid)
    return plan_pod(obj)


# (CPUs asked, annotations, the refusal's reason): none of these is an error of ours.
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("65", {}, CAPACITY),  # more than the node's 64
    ("17", {"numa_policy": "single-numa-node"}, ALIGNMENT),  # 64 free, but no NUMA node has 17
    ("17", {"numa_zone": "1"}, ALIGNMENT),  # the controller's zone has 16
    ("2", {"numa_zone": "9"}, ALIGNMENT),  # no such zone on this node
    ("4", {"numa_policy": "nearest"}, INVALID),  # not a policy: the pod stays on the pool
    ("4", {"numa_zone": "-1"}, INVALID),
]


@pytest.mark.parametrize(("cpus", "notes", "reason"), REFUSALS)
def test_a_refusal_counts_refused_with_its_reason_once_not_error(dump_root: Any, tmp_path: Path, cpus: str,
                                                                 notes: dict[str, Any], reason: str) -> None:
    p, m = made(dump_root, tmp_path)
    assert counts(m) == zero()
    p.handle(Changed(guaranteed("a", cpus, **notes)))
    assert not p.engine.state_file.load(missing_ok=True).allocations
    assert counts(m) == zero(refused=1, **{f"refused_{reason}": 1})
    # Tried again each reconcile and refused alike: still one refusal (the count follows requests).
    for _ in range(3):
        p.retry()
        p.apply(p.pods["a"], force=True)
    assert counts(m) == zero(refused=1, **{f"refused_{reason}": 1})


def test_a_refused_pod_pinned_later_counts_once_each_and_its_release(dump_root: Any, tmp_path: Path) -> None:
    p, m = made(dump_root, tmp_path)
    p.handle(Changed(guaranteed("b1", "60")))
    p.handle(Changed(guaranteed("c2", "8")))  # 4 left: refused for capacity
    assert counts(m) == zero(allocated=1, refused=1, refused_capacity=1)
    p.forget("b1")  # released: the refused pod is tried again at once and pinned
    p.retry()
    assert counts(m) == zero(allocated=2, refused=1, refused_capacity=1, released=1)
    p.forget("c2")
    assert counts(m) == zero(allocated=2, refused=1, refused_capacity=1, released=2)
    assert not p.engine.state_file.load(missing_ok=True).allocations


def test_a_state_that_cannot_be_written_is_an_error_not_a_refusal(dump_root: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    p, m = made(dump_root, tmp_path)

    def fail(_self: StateFile, _state: Any) -> Any:
        raise StateError("disk full")

    monkeypatch.setattr(StateFile, "commit", fail)
    p.handle(Changed(guaranteed("a", "4")))
    assert counts(m) == zero(error=1)
    p.retry()  # an error is counted each time it happens: a failing system stays visible
    assert counts(m) == zero(error=2)


def test_cpu_gauge_follows_the_state_at_scrape_time(dump_root: Any, tmp_path: Path) -> None:
    p, m = made(dump_root, tmp_path)

    def exclusive() -> float:
        return sum(m.registry.get_sample_value("topolet_cpus", {"numa": str(n), "state": "exclusive"}) or 0
                   for n in range(4))

    assert exclusive() == 0
    assert m.registry.get_sample_value("topolet_cpus", {"numa": "0", "state": "shared"}) == 16
    p.handle(Changed(guaranteed("a", "6")))
    assert exclusive() == 6  # no reconcile, no gauge update: read when scraped
    p.forget("a")
    assert exclusive() == 0

"""The ledger's clearing rules, one row each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from agent.admission.cluster.ledger import Entry, Ledger, agent_pins, job_slot
from agent.admission.cluster.podindex import PodIndex
from agent.admission.engine.model import Placement, PodPlacement, Resources
from agent.api.fingerprint import pod_set_fingerprint

REQ = Resources(cpu_milli=2000, memory=1 << 30)


def pod(name: str, node: str | None, *, index: str = "0", job: str = "j", phase: str = "Running",
        cpu: str = "2", running: bool = True) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi"}
    status: dict[str, Any] = {"phase": phase}
    if running:
        status["containerStatuses"] = [{"name": "main", "containerID": f"containerd://{name}",
                                        "state": {"running": {}}}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": res, "limits": res}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "labels": {"batch.kubernetes.io/job-name": job},
                         "annotations": {"batch.kubernetes.io/job-completion-index": index}},
            "spec": spec,
            "status": status}


def nrt(node: str, fingerprint: str | None) -> dict[str, Any]:
    attrs = [] if fingerprint is None else [{"name": "nodeTopologyPodsFingerprint", "value": fingerprint}]
    return {"metadata": {"name": node}, "attributes": attrs}


def entry(slot: str = "0", node: str = "n1", zone: int | None = 0, added_at: float = 100.0,
          gang: str = "ns/j") -> Entry:
    return Entry(gang, slot, node, zone, REQ, added_at)


OTHER = pod("other", "n1", job="x")
MINE = pod("j-0", "n1")


@dataclass(frozen=True)
class Row:
    name: str
    entry: Entry
    pods: tuple[dict[str, Any], ...]
    nrts: tuple[dict[str, Any], ...]
    kept: bool
    now: float = 110.0
    live: frozenset[str] | None = None


ROWS = [
    Row("pod not created yet: kept", entry(), (), (nrt("n1", pod_set_fingerprint([])),), kept=True),
    Row("timed out", entry(added_at=0.0), (), (), kept=False, now=120.0),
    Row("gang gone", entry(), (), (), kept=False, live=frozenset({"ns/other"})),
    Row("gang live", entry(), (), (), kept=True, live=frozenset({"ns/j"})),
    Row("pod bound elsewhere", entry(), (pod("j-0", "n2"),), (), kept=False),
    Row("pod finished", entry(), (pod("j-0", "n1", phase="Succeeded"),), (), kept=False),
    Row("pod pending (not bound yet)", entry(), (pod("j-0", None),), (), kept=True),
    Row("bound, no zone counted: the pods list counts it", entry(zone=None), (MINE,), (), kept=False),
    Row("bound and the NRT fingerprint covers every pinned pod", entry(), (MINE, OTHER),
        (nrt("n1", pod_set_fingerprint([("ns", "j-0"), ("ns", "other")])),), kept=False),
    Row("bound but the NRT fingerprint predates the pod", entry(), (MINE, OTHER),
        (nrt("n1", pod_set_fingerprint([("ns", "other")])),), kept=True),
    Row("bound, not running yet: not pinned, kept", entry(), (pod("j-0", "n1", running=False),),
        (nrt("n1", pod_set_fingerprint([])),), kept=True),
    Row("bound but no NRT", entry(), (MINE,), (), kept=True),
    Row("bound, NRT of another node matches: kept", entry(), (MINE,),
        (nrt("n2", pod_set_fingerprint([("ns", "j-0")])),), kept=True),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_settle(row: Row) -> None:
    ledger = Ledger((row.entry,), timeout=20.0)
    after = ledger.settle(row.nrts, row.pods, row.now, live_gangs=row.live)
    assert (after.entries == (row.entry,)) is row.kept


# Three of our pods bound to n1 beside a pod of another gang; the NRT's fingerprint is of the set
# `shown` (the agent lags the newest binds).  Which entries stay: exactly those the NRT does not count.
OURS = tuple(pod(f"j-{i}", "n1", index=str(i)) for i in range(3))
LAGS = [
    ("every pod counted: all clear", [("ns", "j-0"), ("ns", "j-1"), ("ns", "j-2")], []),
    ("the newest not counted yet: only it stays", [("ns", "j-0"), ("ns", "j-1")], ["2"]),
    ("two not counted: both stay", [("ns", "j-1")], ["0", "2"]),
    ("none of ours counted: all stay", [], ["0", "1", "2"]),
    ("a pod the controller has not seen counted: no set matches, all stay",
     [("ns", "j-0"), ("ns", "j-1"), ("ns", "j-2"), ("ns", "unseen")], ["0", "1", "2"]),
]
# j-3 is bound to n1 but not running yet as the controller sees it (not pinned-eligible); the agent
# may have pinned it and published before the controller saw its status.
NOT_RUNNING = pod("j-3", "n1", index="3", running=False)
LEADS = [
    ("the NRT counts the pod not seen running: it clears too",
     [("ns", "j-0"), ("ns", "j-1"), ("ns", "j-2"), ("ns", "j-3")], []),
    ("the NRT counts it but lags another: that one stays", [("ns", "j-0"), ("ns", "j-1"), ("ns", "j-3")],
     ["2"]),
    ("the NRT does not count it: it stays, the others clear", [("ns", "j-0"), ("ns", "j-1"), ("ns", "j-2")],
     ["3"]),
]


@pytest.mark.parametrize(("shown", "stay"), [(s, k) for _, s, k in LEADS], ids=[n for n, _, _ in LEADS])
def test_an_nrt_that_leads_the_pod_status_seen_clears_the_pods_it_counts(
        shown: list[tuple[str, str]], stay: list[str]) -> None:
    ledger = Ledger(tuple(entry(str(i)) for i in range(4)), timeout=20.0)
    after = ledger.settle([nrt("n1", pod_set_fingerprint([*shown, ("ns", "other")]))],
                          (*OURS, NOT_RUNNING, OTHER), 110.0)
    assert [e.slot for e in after.entries] == stay


@pytest.mark.parametrize(("shown", "stay"), [(s, k) for _, s, k in LAGS], ids=[n for n, _, _ in LAGS])
def test_an_nrt_that_lags_the_newest_binds_clears_the_entries_it_counts(
        shown: list[tuple[str, str]], stay: list[str]) -> None:
    """The NRT counts OTHER (another gang's pod) and `shown` of ours; an entry clears only when its own
    pod is among those the NRT's figures were computed over, never on a guess."""
    ledger = Ledger(tuple(entry(str(i)) for i in range(3)), timeout=20.0)
    after = ledger.settle([nrt("n1", pod_set_fingerprint([*shown, ("ns", "other")]))], (*OURS, OTHER), 110.0)
    assert [e.slot for e in after.entries] == stay


def test_from_records_record_and_lookups() -> None:
    ledger = Ledger.from_records([("ns/a", "0", "n1", 0, REQ), ("ns/b", "1", "n2", None, REQ)], now=5.0)
    assert [e.added_at for e in ledger.entries] == [5.0, 5.0] and len(ledger) == 2
    placement = Placement("ns/c", (PodPlacement("w", 0, "n1", 1), PodPlacement("w", 1, "n2", None)))
    grown = ledger.record(placement, {"w": REQ}, now=6.0)
    assert [(e.gang, e.slot, e.node, e.zone) for e in grown.on_node("n1")] == [("ns/a", "0", "n1", 0),
                                                                               ("ns/c", "w#0", "n1", 1)]
    assert [e.gang for e in grown.without_gang("ns/a").entries] == ["ns/b", "ns/c", "ns/c"]
    assert ledger.settle([], [], 6.0) is ledger  # nothing cleared: the same ledger


def test_job_slot_and_pinned_eligible() -> None:
    assert job_slot(MINE) == ("ns/j", "0")
    assert job_slot({"metadata": {"name": "p", "namespace": "ns"}}) is None
    shared = pod("shared", "n1", job="s", cpu="500m")
    index = PodIndex(lambda p: None, agent_pins).update([MINE, OTHER, shared, pod("j-1", "n2", index="1")],
                                                         job_slot)
    assert index.eligible("n1") == (("ns", "j-0"), ("ns", "other"))


class _Store:
    """A store with nothing in it (Nodes, NRTs): what `Capacity` reads besides the decisions."""

    def snapshot(self) -> list[dict[str, Any]]:
        return []


@pytest.mark.parametrize("written", ["2999-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "not a time"])
def test_ledger_ages_run_on_the_controllers_clock_not_the_records(written: str) -> None:
    """An entry is as old as the pass that first saw its decision, whatever `time` the record says: a
    time in the future never holds the slots for ever, one in the past never frees them at once."""
    from agent.admission.cluster.capacity import Capacity
    from agent.admission.gangs.record import AdmissionRecord, SlotPlacement
    from agent.admission.report.metrics import AdmissionMetrics

    now = [1000.0]
    capacity = Capacity(_Store(), _Store(), AdmissionMetrics(), 120.0, lambda: now[0])  # type: ignore[arg-type]
    slots = {0: SlotPlacement("n1", 0), 1: SlotPlacement("n2", 1)}
    record = AdmissionRecord("admitted", "d1", written, slots)
    held = [("ns/j", record, lambda: REQ)]
    capacity.view(held, [], lambda pod: None)
    assert [e.added_at for e in capacity.ledger.entries] == [1000.0, 1000.0]
    now[0] = 1119.0  # within the timeout of the pass that saw it
    capacity.view(held, [], lambda pod: None)
    assert len(capacity.ledger) == 2
    now[0] = 1120.0  # one timeout later: cleared, the record's time notwithstanding
    capacity.view(held, [], lambda pod: None)
    assert len(capacity.ledger) == 0


def test_a_pod_the_nrt_counts_before_its_bind_is_seen_keeps_only_its_node_totals() -> None:
    """j-1 is not bound yet as the pods list shows it, but the NRT (read after the pods) counts it
    already: its entry stops counting its zone (the NRT does) and keeps counting its node totals until
    the bind is seen, then clears; an NRT that does not count it changes nothing."""
    ledger = Ledger((entry("0"), entry("1")), timeout=20.0)
    unbound = pod("j-1", None, index="1")
    counting = nrt("n1", pod_set_fingerprint([("ns", "j-0"), ("ns", "j-1"), ("ns", "other")]))
    after = ledger.settle([counting], (OURS[0], unbound, OTHER), 110.0)
    assert [(e.slot, e.zone) for e in after.entries] == [("1", None)]
    bound = after.settle([counting], (OURS[0], OURS[1], OTHER), 111.0)
    assert bound.entries == ()
    lagging = nrt("n1", pod_set_fingerprint([("ns", "j-0"), ("ns", "other")]))
    assert [(e.slot, e.zone) for e in ledger.settle([lagging], (OURS[0], unbound, OTHER), 110.0).entries] \
        == [("1", 0)]

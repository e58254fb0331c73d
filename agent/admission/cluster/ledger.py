"""The ledger: placements the admission controller made that the nodes' NRTs do not show yet.

Public API:

- `Entry(gang, slot, node, zone, request, added_at)`: one pod placed by the controller.  `gang` is
  the gang key, `slot` names the pod within it (the controller's choice: a completion index, or
  `PodPlacement`'s "<pod set>#<index>" as `Ledger.record` writes it).
- `Ledger(entries=(), timeout=120.0)`, immutable:
  - `Ledger.from_records(records, now, timeout=...)`: rebuilt from `(gang, slot, node, zone,
    request)` tuples (what the controller reads back from its Job annotations after a restart);
  - `.record(placement, requests, now)`: adds a Placement's pods (`requests`: pod set -> Resources);
  - `.without_gang(gang)`, `.on_node(node)`, `len(ledger)`;
  - `.settle(nrts, pods, now, live_gangs=None, slot_of=job_slot, pinned=None, index=None)`: the
    ledger less every entry that cleared (the rule below); `index`, a `PodIndex` of this pass's pods,
    saves re-reading them.
- `job_slot(pod) -> (gang, slot) | None`: the default way a pod names its entry: gang
  `<namespace>/<job name>` (label `batch.kubernetes.io/job-name`, else `job-name`), slot its
  completion index (annotation `batch.kubernetes.io/job-completion-index`), else the pod's name.
  It reads what a pod's creator writes, so it is only the default for callers whose pods are trusted
  (tests, tools): the controller passes the slots `agent.admission.gangs.slots.job_slots` gave each
  admitted Job's own pods.
- `agent_pins(pod) -> bool`: whether the node's agent pins the pod (running, not terminal, with a
  container owed exclusive CPUs); the pods bound to a node that it pins are
  `agent.admission.cluster.podindex.PodIndex.eligible(node)`.

When an entry clears (each rule is checked in order by `settle`):

1. its gang is not live any more (`live_gangs` given and the gang not in it): deleted or finished;
2. it is older than `timeout` seconds (the NRT never caught up: the agent is slow or gone);
3. its pod is terminal, or is bound to another node than the entry's (the pods list counts it there);
4. its pod is bound to the entry's node and the entry has no zone (nor containers' zones): node
   totals come from the pods list from now on, and no zone figure was ever counted;
5. its pod is bound to the entry's node, the pod is pinned-eligible, and that node's NRT attribute
   `nodeTopologyPodsFingerprint` equals `pod_set_fingerprint` of *all* the pinned-eligible pods the
   controller sees on the node.  The agent computes that fingerprint over the pods it has pinned
   (method "with-exclusive-resources": the pods holding an allocation in its state, see
   `agent.kube.daemon`), so equality with a set that includes the pod means the NRT's `available`
   figures were computed after the pod's CPUs were taken.  A mismatch (the agent has not pinned
   it yet, or pinned something the controller does not see) keeps the entry: overcounting for a
   while is safe, undercounting is not.

Until an entry clears, `agent.admission.cluster.view.build_view` subtracts its request from its zone
(from each of its containers' zones, for a pod the container scope split), and
from the node's totals while its pod is not yet bound there (a bound pod's requests are already in
the node's used figures).  Pure: no I/O; `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.admission.cluster.podindex import PodIndex
from agent.admission.engine.model import Placement, Resources
from agent.api.fingerprint import pod_set_fingerprint
from agent.api.nrt import ATTR_FINGERPRINT
from agent.api.objects import as_mapping
from agent.api.podplan import PodError, plan_pod

DEFAULT_TIMEOUT = 120.0
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Entry:
    """One pod the controller placed: where, on which zone (None: node totals), and what it asks."""

    gang: str
    slot: str
    node: str
    zone: int | None
    request: Resources
    added_at: float
    # A pod the container scope split (zone None): its containers' zones.  Its whole request is
    # counted on each of them until it clears (the ledger holds no per-container figures, and
    # overcounting for a while is safe).
    zones: tuple[int, ...] = ()


Record = tuple[str, str, str, int | None, Resources]
SlotOf = Callable[[Mapping[str, Any]], tuple[str, str] | None]


def job_slot(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(gang, slot) of a Job's pod: `<namespace>/<job name>` and its completion index (or name)."""
    meta = as_mapping(pod.get("metadata"))
    labels = as_mapping(meta.get("labels"))
    job = next((labels[k] for k in JOB_NAME_LABELS if isinstance(labels.get(k), str)), None)
    namespace, name = meta.get("namespace"), meta.get("name")
    if job is None or not isinstance(namespace, str) or not isinstance(name, str):
        return None
    index = as_mapping(meta.get("annotations")).get(COMPLETION_INDEX)
    return f"{namespace}/{job}", index if isinstance(index, str) else name


def _terminal(pod: Mapping[str, Any]) -> bool:
    return as_mapping(pod.get("status")).get("phase") in TERMINAL_PHASES


def agent_pins(pod: Mapping[str, Any]) -> bool:
    """Whether the node's agent holds exclusive CPUs for this pod (it pins running containers)."""
    if _terminal(pod) or as_mapping(pod.get("metadata")).get("deletionTimestamp"):
        return False
    try:
        plan = plan_pod(dict(pod))
    except (PodError, TypeError, ValueError):
        return False
    return any(c.exclusive for c in plan.containers)


def nrt_fingerprint(nrt: Mapping[str, Any]) -> str | None:
    """The NRT's `nodeTopologyPodsFingerprint` attribute, None when absent."""
    attrs = nrt.get("attributes")
    if not isinstance(attrs, list):
        return None
    for attr in attrs:
        if isinstance(attr, Mapping) and attr.get("name") == ATTR_FINGERPRINT:
            value = attr.get("value")
            return value if isinstance(value, str) else None
    return None


@dataclass(frozen=True, slots=True)
class Ledger:
    """Placements not yet visible in the nodes' NRTs; every change returns a new ledger."""

    entries: tuple[Entry, ...] = ()
    timeout: float = DEFAULT_TIMEOUT

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def from_records(cls, records: Iterable[Record], now: float,
                     timeout: float = DEFAULT_TIMEOUT) -> Ledger:
        """A ledger of `(gang, slot, node, zone, request)` records, each added at `now`."""
        return cls(tuple(Entry(g, s, n, z, r, now) for g, s, n, z, r in records), timeout)

    def record(self, placement: Placement, requests: Mapping[str, Resources], now: float) -> Ledger:
        """This ledger plus every pod of `placement` (slot "<pod set>#<index>")."""
        added = tuple(Entry(placement.gang, f"{p.pod_set}#{p.index}", p.node, p.zone,
                            requests[p.pod_set], now, p.zones) for p in placement.pods)
        return replace(self, entries=self.entries + added)

    def without_gang(self, gang: str) -> Ledger:
        """This ledger less the entries of `gang`."""
        return replace(self, entries=tuple(e for e in self.entries if e.gang != gang))

    def on_node(self, node: str) -> tuple[Entry, ...]:
        """The entries counted on `node`."""
        return tuple(e for e in self.entries if e.node == node)

    def settle(self, nrts: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
               now: float, live_gangs: Collection[str] | None = None,
               slot_of: SlotOf = job_slot,
               pinned: Callable[[Mapping[str, Any]], bool] | None = None,
               index: PodIndex | None = None) -> Ledger:
        """This ledger less the entries that cleared (see the module docstring for the rule).

        `index`: the pods already indexed for this pass (`PodIndex.update(pods, slot_of)`); then
        `pods`, `slot_of` and `pinned` are not read."""
        if not self.entries:
            return self
        if index is None:
            index = PodIndex(lambda pod: None, pinned or agent_pins).update(pods, slot_of)
        prints: dict[str, str | None] = {}
        for nrt in nrts:
            name = as_mapping(nrt.get("metadata")).get("name")
            if isinstance(name, str):
                prints[name] = nrt_fingerprint(nrt)
        shown: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {}  # node -> (eligible, its print)
        kept = []
        for e in self.entries:
            if live_gangs is not None and e.gang not in live_gangs:
                continue
            if now - e.added_at >= self.timeout:
                continue
            mine = index.slot((e.gang, e.slot))
            if mine is not None:
                if mine.terminal or (mine.node is not None and mine.node != e.node):
                    continue
                if mine.node == e.node:
                    if e.zone is None and not e.zones:
                        continue
                    fp = prints.get(e.node)
                    if fp is not None:
                        if e.node not in shown:
                            eligible = index.eligible(e.node)
                            shown[e.node] = (eligible, pod_set_fingerprint(eligible))
                        eligible, expected = shown[e.node]
                        if mine.ident in eligible and fp == expected:
                            continue
            kept.append(e)
        if len(kept) == len(self.entries):
            return self
        return replace(self, entries=tuple(kept))

"""The ledger: placements the admission controller made that the nodes' NRTs do not show yet.

Pure: no I/O; `now` is passed in.  `Entry`, `Ledger` (immutable: `from_records`, `.record`,
`.without_gang`, `.on_node`, `.settle`), `job_slot(pod)` (a default for trusted pods only),
`agent_pins(pod)`.  An entry clears when its gang ends, it times out, or its pod is bound and the
node's NRT fingerprint shows the agent pinned it (a fingerprint of the node's pods less a few newest
of ours names which it counts); no match keeps it, since overcounting for a while
is safe and undercounting is not.  The rules in order: agent/admission/cluster/README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from agent.admission.cluster.podindex import PodIndex
from agent.admission.engine.model import Placement, Resources
from agent.api.fingerprint import counted_set
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


@lru_cache(maxsize=4096)
def _counted(eligible: tuple[tuple[str, str], ...], fingerprint: str,
             ours: tuple[tuple[str, str], ...]) -> frozenset[tuple[str, str]] | None:
    """The pods the node's NRT counts: the pinned-eligible ones with the fewest of ours (the pods of
    entries held there) flipped in or out; None when its fingerprint is of no set tried.  Kept across
    passes, since a node's pods and NRT stay the same for many passes."""
    return counted_set(eligible, fingerprint, ours)


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
        """This ledger less the entries that cleared (the rules: README.md beside this module).

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
        # Our pods on each entry's node, by node: bound there (the entry clears when that node's NRT
        # counts its pod, README.md beside this module, rule 5), or not bound yet as the pods list
        # shows it (the NRT, read after the pods, may count it already: then only its zone figure is
        # in the NRT, and the entry keeps counting its node totals until the bind is seen, rule 6).
        ours: dict[str, list[tuple[int, tuple[str, str], bool]]] = {}
        gone: set[int] = set()
        for at, e in enumerate(self.entries):
            if live_gangs is not None and e.gang not in live_gangs:
                gone.add(at)
            elif now - e.added_at >= self.timeout:
                gone.add(at)
            elif (mine := index.slot((e.gang, e.slot))) is not None:
                if mine.terminal or (mine.node is not None and mine.node != e.node):
                    gone.add(at)
                elif e.zone is None and not e.zones:
                    if mine.node == e.node:
                        gone.add(at)
                elif prints.get(e.node) is not None:
                    ours.setdefault(e.node, []).append((at, mine.ident, mine.node == e.node))
        zoneless: set[int] = set()
        for node, entries in ours.items():
            toggles = tuple(sorted({ident for _, ident, _ in entries}))
            counted = _counted(index.eligible(node), str(prints[node]), toggles)
            if counted is not None:
                for at, ident, bound in entries:
                    if ident in counted:
                        (gone if bound else zoneless).add(at)
        kept = [replace(e, zone=None, zones=()) if at in zoneless else e
                for at, e in enumerate(self.entries) if at not in gone]
        if not gone and not zoneless:
            return self
        return replace(self, entries=tuple(kept))

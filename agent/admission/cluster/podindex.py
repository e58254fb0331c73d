"""The pods as the view and the ledger read them: by node and by ledger slot, kept across passes.

Pure: no I/O.  `PodIndex(requests_of, pins_of).update(pods, slot_of)`, then `.slot(key)`,
`.version(node)`, `.used(node)`, `.eligible(node)`, `.unreadable()`; `PodFacts`, `NodeUse`.
A pod is read again only when its resourceVersion changed (or it has none), and `requests_of` /
`pins_of` are asked once per pod version, only when a node's figures are needed.  A pod whose
requests cannot be read costs only itself, never its node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.admission.engine.model import Resources
from agent.api.objects import as_mapping

TERMINAL_PHASES = ("Succeeded", "Failed")
_REQUESTS_FROM = ("containers", "initContainers", "resources", "overhead")  # the pod spec's parts
Ident = tuple[str, str]
SlotOf = Callable[[Mapping[str, Any]], tuple[str, str] | None]


@dataclass(slots=True)
class PodFacts:
    """What the view and the ledger read of one pod version.

    version: its resourceVersion (None: it has none, read again each pass); node: `spec.nodeName`
    (None: unbound); terminal: Succeeded or Failed; ident: (namespace, name)."""

    version: str | None
    node: str | None
    terminal: bool
    ident: Ident
    pod: Mapping[str, Any]
    requests: Resources | None = None
    requests_read: bool = False
    pinned: bool | None = None
    seen: int = 0  # the last update that saw it


@dataclass(frozen=True, slots=True)
class NodeUse:
    """The bound, non-terminal pods of a node: their summed requests and count; `unreadable`: those
    whose requests cannot be read, counted as pods that request nothing.

    Such a pod costs only itself (a tenant can bind one with `cpu: 1e33`): no quantity the API server
    takes and this reader cannot read fits on any node, so the kubelet refuses to run the pod."""

    requests: Resources = field(default_factory=Resources)
    pods: int = 0
    unreadable: tuple[Mapping[str, Any], ...] = ()


@dataclass(slots=True)
class _Node:
    members: dict[str, PodFacts] = field(default_factory=dict)  # pod key -> facts
    version: int = 0
    use: NodeUse | None = None
    eligible: tuple[Ident, ...] | None = None


def _sum(values: Iterable[Resources]) -> Resources:
    cpu = memory = gpus = 0
    hugepages: dict[str, int] = {}
    mig: dict[str, int] = {}
    devices: dict[str, int] = {}
    for r in values:
        cpu += r.cpu_milli
        memory += r.memory
        gpus += r.gpus
        for k, v in r.hugepages.items():
            hugepages[k] = hugepages.get(k, 0) + v
        for k, v in r.mig.items():
            mig[k] = mig.get(k, 0) + v
        for k, v in r.devices.items():
            devices[k] = devices.get(k, 0) + v
    return Resources(cpu_milli=cpu, memory=memory, gpus=gpus, hugepages=hugepages, mig=mig,
                     devices=devices)


class PodIndex:
    """Pods by node and by ledger slot (see README.md beside this module)."""

    def __init__(self, requests_of: Callable[[Mapping[str, Any]], Resources | None],
                 pins_of: Callable[[Mapping[str, Any]], bool]) -> None:
        self.requests_of = requests_of
        self.pins_of = pins_of
        self._facts: dict[str, PodFacts] = {}
        self._nodes: dict[str, _Node] = {}
        self._by_slot: dict[tuple[str, str], PodFacts] = {}
        self._counter = 0  # node versions are drawn from it, so a node re-created never repeats one
        self._pass = 0

    def update(self, pods: Iterable[Mapping[str, Any]], slot_of: SlotOf) -> PodIndex:
        """Take this pass's pods: changed versions are read again, gone pods dropped."""
        self._pass += 1
        stamp, count = self._pass, 0
        facts_of = self._facts
        by_slot: dict[tuple[str, str], PodFacts] = {}
        for pod in pods:  # the hot loop of a pass on a big cluster: plain dict reads only
            meta = pod.get("metadata")
            if not isinstance(meta, dict):
                meta = dict(as_mapping(meta))
            key = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
            rv = meta.get("resourceVersion")
            facts = facts_of.get(key)
            if facts is None or facts.version is None or facts.version != rv or facts.seen == stamp:
                old = facts
                facts = _read(pod, rv if isinstance(rv, str) and rv else None)
                if old is not None:
                    self._leave(key, old)
                    if old.requests_read and _same_requests(old.pod, pod):  # most new versions: a bind
                        facts.requests, facts.requests_read = old.requests, True
                facts_of[key] = facts
                self._join(key, facts)
            facts.seen = stamp
            count += 1
            slot = slot_of(pod)
            if slot is not None:
                by_slot[slot] = facts
        if count != len(facts_of):
            for key in [k for k, f in facts_of.items() if f.seen != stamp]:
                self._leave(key, facts_of.pop(key))
        self._by_slot = by_slot
        return self

    def slot(self, key: tuple[str, str]) -> PodFacts | None:
        return self._by_slot.get(key)

    def version(self, node: str) -> int:
        n = self._nodes.get(node)
        return n.version if n is not None else 0

    def used(self, node: str) -> NodeUse:
        n = self._nodes.get(node)
        if n is None:
            return NodeUse()
        if n.use is None:
            live = [f for f in n.members.values() if not f.terminal]
            unreadable = []
            requests = []
            for f in live:
                r = self._requests(f)
                if r is None:
                    unreadable.append(f.pod)
                else:
                    requests.append(r)
            n.use = NodeUse(_sum(requests), len(live), tuple(unreadable))
        return n.use

    def unreadable(self) -> list[Mapping[str, Any]]:
        """The bound, non-terminal pods whose requests cannot be read, on the nodes `used` was asked of."""
        return [pod for n in self._nodes.values() if n.use is not None for pod in n.use.unreadable]

    def eligible(self, node: str) -> tuple[Ident, ...]:
        n = self._nodes.get(node)
        if n is None:
            return ()
        if n.eligible is None:
            n.eligible = tuple(sorted(f.ident for f in n.members.values() if self._pinned(f)))
        return n.eligible

    def _requests(self, f: PodFacts) -> Resources | None:
        if not f.requests_read:
            f.requests, f.requests_read = self.requests_of(f.pod), True
        return f.requests

    def _pinned(self, f: PodFacts) -> bool:
        if f.pinned is None:
            f.pinned = self.pins_of(f.pod)
        return f.pinned

    def _touch(self, node: str) -> _Node:
        n = self._nodes.get(node)
        if n is None:
            n = self._nodes[node] = _Node()
        self._counter += 1
        n.version, n.use, n.eligible = self._counter, None, None
        return n

    def _join(self, key: str, facts: PodFacts) -> None:
        if facts.node is not None:
            self._touch(facts.node).members[key] = facts

    def _leave(self, key: str, facts: PodFacts) -> None:
        if facts.node is not None:
            n = self._touch(facts.node)
            n.members.pop(key, None)
            if not n.members:
                del self._nodes[facts.node]


def _same_requests(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """The parts of the pod spec its requests come from are equal (a resize changes them), pod-level
    `resources` included."""
    a, b = as_mapping(old.get("spec")), as_mapping(new.get("spec"))
    return all(a.get(k) == b.get(k) for k in _REQUESTS_FROM)


def _read(pod: Mapping[str, Any], version: str | None) -> PodFacts:
    meta = as_mapping(pod.get("metadata"))
    node = as_mapping(pod.get("spec")).get("nodeName")
    return PodFacts(version=version, node=node if isinstance(node, str) and node else None,
                    terminal=as_mapping(pod.get("status")).get("phase") in TERMINAL_PHASES,
                    ident=(str(meta.get("namespace")), str(meta.get("name"))), pod=pod)

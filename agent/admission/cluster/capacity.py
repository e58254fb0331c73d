"""The cluster's free capacity across decision passes: the ledger of admitted gangs and the engine's view.

`Capacity(nodes, nrts, metrics, ledger_timeout, clock)`: `.view(admitted, pods, slot_of) ->
ClusterView`, `.left_out`, `.ledger`.  Each admitted decision (a Job's or a Workload's) enters the
ledger once and leaves it by the ledger's rule.  The rule: an entry's age runs on the controller's
own clock from the pass that first saw it, never from the record's time, so a restart only
overcounts.  agent/admission/cluster/README.md, "Capacity across passes".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from agent.admission.cluster.ledger import Entry, Ledger, SlotOf, agent_pins
from agent.admission.cluster.podindex import PodIndex
from agent.admission.cluster.store import Reflector, VersionCache
from agent.admission.cluster.view import build_view, node_allocatable, nrt_zones, pod_requests
from agent.admission.engine.model import ClusterView, Resources
from agent.admission.gangs.record import AdmissionRecord
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import as_dict, metadata_of

log = logging.getLogger(__name__)

Admitted = tuple[str, AdmissionRecord, Callable[[], Resources]]


class Capacity:
    """The ledger and the caches a view is built from, kept across passes (README.md beside this module)."""

    def __init__(self, nodes: Reflector, nrts: Reflector, metrics: AdmissionMetrics, ledger_timeout: float,
                 clock: Callable[[], float]) -> None:
        self.nodes = nodes
        self.nrts = nrts
        self.metrics = metrics
        self.clock = clock
        self.ledger = Ledger(timeout=ledger_timeout)
        self.left_out: dict[str, str] = {}
        self._ledgered: set[tuple[str, str]] = set()  # (gang key, decision id) already in the ledger
        # Pods by node and slot, an NRT's zones and a Node's allocatable, by object version, and each
        # node's figures by what they came from: a pass on a big cluster reads only what changed.
        self._pods = PodIndex(pod_requests, agent_pins)
        self._zones = VersionCache(nrt_zones)
        self._allocatable = VersionCache(node_allocatable)
        self._memo: dict[str, Any] = {}

    def view(self, admitted: Iterable[Admitted], pods: list[dict[str, Any]], slot_of: SlotOf) -> ClusterView:
        """The engine's view of the cluster now, after the ledger of admitted gangs' slots."""
        now = self.clock()
        admitted = list(admitted)
        live = {key for key, _, _ in admitted}
        added = []
        for gang, record, requests in admitted:
            key = (gang, record.decision)
            if key in self._ledgered:
                continue
            self._ledgered.add(key)
            request = requests()
            added += [Entry(gang, str(slot), p.node, p.zone, request, now, p.zones)
                      for slot, p in sorted(record.slots.items())]
        if added:
            self.ledger = replace(self.ledger, entries=self.ledger.entries + tuple(added))
        index = self._pods.update(pods, slot_of)
        nodes, nrts = self.nodes.snapshot(), self.nrts.snapshot()  # one copy: settle and view agree
        self.ledger = self.ledger.settle(nrts, pods, now, live_gangs=live, index=index)
        self._ledgered = {k for k in self._ledgered if k[0] in live}
        self.metrics.ledger_entries.set(len(self.ledger))
        view, left_out = build_view(nodes, nrts, pods, self.ledger, now,
                                    zones_of=self._zones.of, allocatable_of=self._allocatable.of,
                                    index=index, memo=self._memo)
        self._zones.retain(nrts)
        self._allocatable.retain(nodes)
        counts = {"usable": len(view.nodes), "stale": 0, "not_ready": 0}
        for node in nodes:
            if str(metadata_of(node).get("name")) in left_out:
                counts["not_ready" if not node_ready(node) else "stale"] += 1
        if left_out != self.left_out:
            for name, why in sorted(left_out.items()):
                if self.left_out.get(name) != why:
                    log.warning("node %s left out: %s", name, why)
            self.left_out = left_out
        self.metrics.set_nodes(counts)
        return view

    def unreadable_pods(self) -> list[Mapping[str, Any]]:
        """The bound pods the last view counted as requesting nothing: their requests cannot be read."""
        return self._pods.unreadable()


def node_ready(node: Mapping[str, Any]) -> bool:
    """Ready unless a Ready condition says otherwise (the view's rule)."""
    for cond in as_dict(node.get("status")).get("conditions") or []:
        cond = as_dict(cond)
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


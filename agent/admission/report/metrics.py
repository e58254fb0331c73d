"""The admission controller's Prometheus metrics, on their own registry, and the capacity figures.

The `topolet_admission_*` metrics (decisions, duration, queue depth, free capacity, largest free
zone, fragmentation, nodes, ledger entries, leader, invalid objects), every labelled series
initialised, on a registry from `agent.metrics.registry.new_registry`; `capacity_figures(view)` is
pure.  The names are what the Grafana panels read: change them together.
The list with each metric's meaning: agent/admission/report/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from agent.admission.engine.model import ClusterView
from agent.api.resources import GPU_RESOURCE
from agent.metrics.registry import new_registry

DECISION_RESULTS = ("admitted", "waiting", "rejected", "error")
INVALID_KINDS = ("Job", "JobSet", "Pod", "Workload")
NODE_STATES = ("usable", "stale", "not_ready")
FREE_RESOURCES = ("cpu", "memory", GPU_RESOURCE)
DECISION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True, slots=True)
class CapacityFigures:
    """What the capacity gauges show for one view (CPUs, bytes, devices)."""

    free: Mapping[str, float]
    largest_free_zone_cpus: float
    fragmentation_ratio: float


def capacity_figures(view: ClusterView) -> CapacityFigures:
    """Free capacity, the freest zone and the CPU fragmentation of `view`'s nodes."""
    cpu_milli = memory = gpus = 0
    zone_free = whole_free = largest = 0
    for node in view.nodes:
        cpu_milli += node.free.cpu_milli
        memory += node.free.memory
        gpus += node.free.gpus
        for zone in node.zones:
            if zone.cpu_capacity_milli <= 0:
                continue  # memory-only zones hold no exclusive CPU
            zone_free += zone.cpu_milli
            largest = max(largest, zone.cpu_milli)
            if zone.cpu_milli >= zone.cpu_capacity_milli:
                whole_free += zone.cpu_milli
    ratio = (zone_free - whole_free) / zone_free if zone_free else 0.0
    return CapacityFigures(free={"cpu": cpu_milli / 1000, "memory": float(memory),
                                 GPU_RESOURCE: float(gpus)},
                           largest_free_zone_cpus=largest / 1000, fragmentation_ratio=ratio)


class AdmissionMetrics:
    """Every metric `topolet controller` exports, on its own registry (tests may build several)."""

    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        self.decisions = Counter("topolet_admission_decisions", "Gang admission decisions by result",
                                 ["result"], registry=r)
        for result in DECISION_RESULTS:
            self.decisions.labels(result=result)
        self.decision_seconds = Histogram("topolet_admission_decision_duration_seconds",
                                          "One gang's decision: engine and API writes",
                                          buckets=DECISION_BUCKETS, registry=r)
        self.pass_seconds = Histogram("topolet_admission_pass_duration_seconds",
                                      "One decision pass: the view, every due gang's decision, the writes",
                                      buckets=PASS_BUCKETS, registry=r)
        self.refusals_reused = Counter("topolet_admission_refusals_reused",
                                       "Waiting gangs handed the refusal of an earlier pass, the cluster "
                                       "having no more free since", registry=r)
        self.queue_depth = Gauge("topolet_admission_queue_depth", "Gangs waiting for admission per queue",
                                 ["queue"], registry=r)
        self.cluster_free = Gauge("topolet_admission_cluster_free",
                                  "Free capacity of the usable nodes (CPUs, bytes, devices)",
                                  ["resource"], registry=r)
        self.largest_free_zone = Gauge("topolet_admission_largest_free_zone",
                                       "Free CPUs in the freest NUMA zone", ["resource"], registry=r)
        self.fragmentation = Gauge("topolet_admission_fragmentation_ratio",
                                   "Share of free exclusive CPU not in wholly free NUMA zones", registry=r)
        self.nodes = Gauge("topolet_admission_nodes", "Nodes by state (usable, stale NRT, NotReady)",
                           ["state"], registry=r)
        for state in NODE_STATES:
            self.nodes.labels(state=state)
        self.ledger_entries = Gauge("topolet_admission_ledger_entries",
                                    "Placements counted against capacity that the NRTs do not show yet",
                                    registry=r)
        self.events_dropped = Counter("topolet_admission_events_dropped",
                                      "Job Events not sent because the Event queue was full", registry=r)
        self.pods_patched = Counter("topolet_admission_pods_patched",
                                    "Gated pods the controller pinned with a patch (where the placement "
                                    "policy is installed it pins Indexed Jobs' pods itself)", registry=r)
        self.write_conflicts = Counter("topolet_admission_write_conflicts",
                                       "Writes refused because the object changed since it was read (409)",
                                       registry=r)
        self.invalid_objects = Counter("topolet_admission_invalid_objects",
                                       "Objects a pass could not read and skipped (each version once)",
                                       ["kind"], registry=r)
        for kind in INVALID_KINDS:
            self.invalid_objects.labels(kind=kind)
        self.leader = Gauge("topolet_admission_leader", "1 while this replica is the leader", registry=r)
        self.last_pass = Gauge("topolet_admission_last_pass_timestamp_seconds",
                               "Unix time of the last completed decision pass (or standby check)",
                               registry=r)

    def set_view(self, view: ClusterView) -> None:
        """The capacity gauges from the view the pass decided on."""
        figures = capacity_figures(view)
        for resource in FREE_RESOURCES:
            self.cluster_free.labels(resource=resource).set(figures.free[resource])
        self.largest_free_zone.labels(resource="cpu").set(figures.largest_free_zone_cpus)
        self.fragmentation.set(figures.fragmentation_ratio)

    def set_nodes(self, counts: Mapping[str, int]) -> None:
        for state in NODE_STATES:
            self.nodes.labels(state=state).set(counts.get(state, 0))

    def set_queue_depths(self, depths: Mapping[str, int]) -> None:
        """Set each queue's depth; `depths` names every configured queue, so no other gets a series."""
        for queue, depth in depths.items():
            self.queue_depth.labels(queue=queue).set(depth)

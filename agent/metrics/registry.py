"""topolet's Prometheus metrics: their names, one registry per process, and collectors read at scrape time.

`new_registry()`; `Metrics`, whose `.watch_cpus`, `.watch_gpus` and `.watch_mig` read values that
live elsewhere at scrape time instead of copying them in.  Names follow Prometheus conventions and
labels stay bounded (never pod or process names); every labelled counter starts with a series per
known label value.  `agent.metrics.server` serves a registry over HTTP.
Naming rules and `topolet_info`'s labels: agent/metrics/README.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent import __version__
from agent.api.resources import GPU_RESOURCE, MIG_RESOURCE_PREFIX

log = logging.getLogger(__name__)

MIG_CONFIG_STATES = ("pending", "success", "failed")  # topolet.io/mig.config.state values
PIN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# topolet_allocations_total{result}: a refusal is a request the node cannot or may not satisfy, an
# error a failure of ours or of the system (a cgroup or state write failed).
ALLOCATED, REFUSED, RELEASED, ERROR = "allocated", "refused", "released", "error"
ALLOCATION_RESULTS = (ALLOCATED, REFUSED, RELEASED, ERROR)
# topolet_allocation_refusals_total{reason}: not enough free CPUs (or GPUs); the NUMA or SMT policy
# cannot be met with what is free; the request or the pod's annotations are invalid.
CAPACITY, ALIGNMENT, INVALID = "capacity", "alignment", "invalid"
REFUSAL_REASONS = (CAPACITY, ALIGNMENT, INVALID)
API_WRITE_KINDS = ("nrt", "labels", "event")
INVALID_OBJECT_KINDS = ("pod",)  # topolet_invalid_objects_total{kind}: what the pod watch skipped
CPU_STATES = ("exclusive", "shared", "reserved")
# agent.gpu.applier's operation names (OPERATIONS there; a test keeps the two equal) and results.
MIG_OPERATIONS = ("gpu_instance_create", "gpu_instance_destroy", "compute_instance_create", "mig_mode_change")
MIG_OPERATION_RESULTS = ("success", "error")
# The totals agent.gpu.applier.ApplyCounters keeps (its as_metrics() names), with their help text.
MIG_APPLY_TOTALS = {
    "topolet_mig_instances_created_total": "MIG GPU instances created",
    "topolet_mig_instances_destroyed_total": "MIG GPU instances destroyed",
    "topolet_mig_mode_changes_total": "MIG mode changes of a GPU",
    "topolet_mig_apply_errors_total": "MIG config passes that failed",
}

CPURows = Iterable[tuple[int, str, int]]  # (numa, state, count)
# {numa id (-1: unknown): {resource: (capacity, available)}}: agent.gpu.capacity.zone_gpus's answer.
GPUZones = Mapping[int, Mapping[str, tuple[int, int]]]
GPU_STATES = ("allocated", "free")


class _CPUStates(Collector):
    """`topolet_cpus` from the engine's state at scrape time (no rows: no series, e.g. pinning off)."""

    def __init__(self) -> None:
        self.source: Callable[[], CPURows] | None = None

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily("topolet_cpus", _CPUS_HELP, labels=("numa", "state"))]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("topolet_cpus", _CPUS_HELP, labels=("numa", "state"))
        source = self.source
        if source is not None:
            try:
                rows = list(source())
            except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever the state file holds
                log.debug("topolet_cpus not read: %s", exc)
                rows = []
            for numa, state, count in rows:
                family.add_metric((str(numa), state), count)
        return [family]


class _MigTotals(Collector):
    """The MIG applier's totals at scrape time; 0 while no applier exists (no GPU, or no config)."""

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, int] | None] | None = None

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [CounterMetricFamily(name, text) for name, text in MIG_APPLY_TOTALS.items()]

    def collect(self) -> Iterable[CounterMetricFamily]:
        totals = self.source() if self.source is not None else None
        return [CounterMetricFamily(name, text, value=(totals or {}).get(name, 0))
                for name, text in MIG_APPLY_TOTALS.items()]


class _GPUZones(Collector):
    """`topolet_gpus` and `topolet_mig_devices` from the node's GPUs and holds at scrape time (no GPUs
    known: no series)."""

    def __init__(self) -> None:
        self.source: Callable[[], GPUZones] | None = None

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("topolet_gpus", _GPUS_HELP, labels=("numa", "state")),
                GaugeMetricFamily("topolet_mig_devices", _MIG_DEVICES_HELP,
                                  labels=("numa", "profile", "state")))

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        gpus, mig = self._families()
        source = self.source
        zones: GPUZones = {}
        if source is not None:
            try:
                zones = source()
            except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever the state file holds
                log.debug("topolet_gpus not read: %s", exc)
        for numa, resources in sorted(zones.items()):
            for resource, (capacity, available) in sorted(resources.items()):
                counts = zip(GPU_STATES, (capacity - available, available), strict=True)
                if resource == GPU_RESOURCE:
                    for state, count in counts:
                        gpus.add_metric((str(numa), state), count)
                elif resource.startswith(MIG_RESOURCE_PREFIX):
                    profile = resource[len(MIG_RESOURCE_PREFIX):]
                    for state, count in counts:
                        mig.add_metric((str(numa), profile, state), count)
        return [gpus, mig]


_CPUS_HELP = "CPUs by NUMA node and state (exclusive, shared, reserved), read from the state when scraped"
_GPUS_HELP = ("Whole GPUs (not in MIG mode) by NUMA node (-1: unknown) and state (allocated, free), read "
              "when scraped")
_MIG_DEVICES_HELP = ("MIG devices by NUMA node of their GPU, profile (as in nvidia.com/mig-<profile>) and "
                     "state (allocated, free), read when scraped")


def new_registry() -> CollectorRegistry:
    """A registry with the process metrics (RSS, CPU seconds, open fds) and no `*_created` series."""
    # A switch of the client library, for the whole process: set wherever a registry is built, so
    # it holds in the agent and the controller alike.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


class Metrics:
    """Every metric the agent exports, on its own registry (so tests can build several)."""

    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        self.info = Info("topolet", "topolet build and node facts", registry=r)
        self.info.info({"version": __version__})
        self._cpus = _CPUStates()
        r.register(self._cpus)
        self.allocations = Counter("topolet_allocations",
                                   "Exclusive CPU allocations by result: allocated, refused, released, "
                                   "error", ["result"], registry=r)
        self.refusals = Counter("topolet_allocation_refusals",
                                "Refused exclusive CPU requests by reason (capacity, alignment, invalid)",
                                ["reason"], registry=r)
        self.pin_latency = Histogram("topolet_pin_latency_seconds",
                                     "Request to cpuset-and-affinity-applied latency",
                                     buckets=PIN_BUCKETS, registry=r)
        self.drift = Counter("topolet_cgroup_drift", "cpusets found rewritten by someone else and repaired",
                             registry=r)
        self.state_writes = Counter("topolet_state_writes", "State file writes", registry=r)
        self.label_writes = Counter("topolet_label_writes", "features.d label file writes", registry=r)
        self.reconcile_seconds = Histogram("topolet_reconcile_duration_seconds", "One reconcile pass",
                                           registry=r)
        self.last_reconcile = Gauge("topolet_last_reconcile_timestamp_seconds",
                                    "Unix time of the last completed reconcile", registry=r)
        self.nrt_yielded = Gauge("topolet_nrt_yielded",
                                 "1 while another manager (NFD's topology updater) owns this node's "
                                 "NodeResourceTopology and topolet leaves it alone", registry=r)
        self.reconcile_errors = Counter("topolet_reconcile_errors", "Reconcile passes that failed",
                                        registry=r)
        self.pod_lists = Counter("topolet_pod_lists", "Lists of this node's pods (startup, expired watch)",
                                 registry=r)
        self.invalid_objects = Counter("topolet_invalid_objects",
                                       "API objects skipped because they could not be read or handled, "
                                       "by kind (pod)", ["kind"], registry=r)
        self.pool_writes = Counter("topolet_pool_cgroup_writes",
                                   "Container cgroups given the shared pool outside an allocation change",
                                   registry=r)
        self.api_writes = Counter("topolet_api_writes", "Kubernetes API writes by kind (nrt, labels, event)",
                                  ["kind"], registry=r)
        self.api_write_errors = Counter("topolet_api_write_errors",
                                        "Kubernetes API writes that failed, by kind (nrt, labels, event)",
                                        ["kind"], registry=r)
        self.mig_operations = Counter("topolet_mig_operations",
                                      "MIG changes through NVML by operation and result (success, error)",
                                      ["op", "result"], registry=r)
        self.mig_config_state = Gauge("topolet_mig_config_state",
                                      "1 for the MIG config state now (pending, success, failed), 0 for the "
                                      "others; no series while no MIG config is managed",
                                      ["state"], registry=r)
        self._mig_totals = _MigTotals()
        r.register(self._mig_totals)
        self._gpus = _GPUZones()
        r.register(self._gpus)
        for result in ALLOCATION_RESULTS:
            self.allocations.labels(result=result)
        for kind in INVALID_OBJECT_KINDS:
            self.invalid_objects.labels(kind=kind)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason=reason)
        for kind in API_WRITE_KINDS:
            self.api_writes.labels(kind=kind)
            self.api_write_errors.labels(kind=kind)
        for op in MIG_OPERATIONS:
            for result in MIG_OPERATION_RESULTS:
                self.mig_operations.labels(op=op, result=result)

    def released(self, _alloc_id: str = "") -> None:
        """Count one released allocation (an engine's `on_release`)."""
        self.allocations.labels(result=RELEASED).inc()

    def refused(self, reason: str) -> None:
        """Count one refused allocation and its reason (one of REFUSAL_REASONS)."""
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        self.allocations.labels(result=REFUSED).inc()
        self.refusals.labels(reason=reason).inc()

    def set_node(self, nodename: str, enforcement: bool | str, **facts: str) -> None:
        """Complete `topolet_info` with this node's name, whether CPUs are enforced (True/False, or
        why not: "kubelet-static"), and `facts`."""
        said = enforcement if isinstance(enforcement, str) else "on" if enforcement else "off"
        self.info.info({"version": __version__, "nodename": nodename, "enforcement": said, **facts})

    def watch_cpus(self, source: Callable[[], CPURows] | None) -> None:
        """Serve `topolet_cpus` from `source()` at each scrape (called on the scraping thread)."""
        self._cpus.source = source

    def watch_gpus(self, source: Callable[[], GPUZones] | None) -> None:
        """Serve `topolet_gpus` and `topolet_mig_devices` from `source()` at each scrape (on the
        scraping thread); `source` answers as `agent.gpu.capacity.zone_gpus` does."""
        self._gpus.source = source

    def watch_mig(self, source: Callable[[], Mapping[str, int] | None] | None) -> None:
        """Serve the MIG applier's totals from `source()` (None: no applier yet, all 0) at each scrape."""
        self._mig_totals.source = source

    def set_mig_config_state(self, state: str | None) -> None:
        """Mark `state` as the MIG config state now (None: no MIG config managed, no series)."""
        if state is None:
            self.mig_config_state.clear()
            return
        # Set in place (no clear first) so a scrape never sees the family empty mid-update.
        for value in MIG_CONFIG_STATES:
            self.mig_config_state.labels(state=value).set(1 if value == state else 0)

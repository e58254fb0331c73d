"""The decision loop of `topolet controller`: admits queued Jobs as gangs, pins their pods through gates.

`ControllerConfig`; `Controller(kube, config, metrics, leader=None)`: `.start()` (the list+watch
reflectors), `.run(stop)` (a pass after every change, debounced, and every `resync_seconds`, while
leading), `.decide_once()`.  A pass: admitted Jobs hold their slots and their gated pods are pinned,
the view is built, pending Jobs (and Kueue Workloads) go through the engine in queue order.
The rule: every step is idempotent and re-derived from the API objects, so a controller killed at any
point never decides a Job twice.  The pass in full, writes and kill-test hooks:
agent/admission/controller/README.md.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from agent.admission.cluster.capacity import Capacity
from agent.admission.cluster.heap import Heap
from agent.admission.cluster.sharing import Sharing
from agent.admission.cluster.slim import slim_job, slim_node, slim_nrt, slim_pod
from agent.admission.cluster.store import Reflector, VersionCache
from agent.admission.controller.intake import JobIntake
from agent.admission.controller.jobsets import JobSetRoute
from agent.admission.controller.writes import JobWrites, crash_point
from agent.admission.engine.model import ClusterView, Gang, Placement, Refusal
from agent.admission.engine.place import commit, place
from agent.admission.engine.waiting import Waiting
from agent.admission.gangs.job import (
    ADMISSION_ANNOTATION,
    MAX_GANG_PODS,
    QUEUE_LABEL,
    job_finished,
    job_suspended,
    priority_classes,
)
from agent.admission.gangs.jobset import JOBSET, jobset_keys
from agent.admission.gangs.limitrange import (
    ContainerDefaults,
    LimitRangeError,
    namespace_defaults,
    read_limit_range,
)
from agent.admission.gangs.record import AdmissionRecord, record_too_long
from agent.admission.gangs.slots import owner_keys, pod_gated
from agent.admission.jobs.jobread import JobRead, JobReader, gone_nodes
from agent.admission.jobs.queues import DEFAULT_QUEUE, Blocked, QueueConfig, admission_pass
from agent.admission.kueue.check import KueueCheck
from agent.admission.kueue.holds import Refused
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import as_dict, metadata_of, object_key
from agent.kubeapi.bulk import drop_bulk
from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.leader import LeaderElector, NotLeader

log = logging.getLogger(__name__)

LEASE_NAME = "topolet-controller"
DEBOUNCE_SECONDS = 0.2
PACE = 2.0
PACE_MAX_SECONDS = 2.0
OWNER, JOBSET_LABEL = "owner", "jobset"  # the pod store's indexes: `owner_keys`, `jobset_keys`
VIEW_REFRESH_SECONDS = 30.0  # how stale the capacity metrics may get while no gang waits
NRT_GROUP, NRT_VERSION, NRT_PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"


@dataclass(frozen=True)
class ControllerConfig:
    namespace: str = "topolet-system"
    queues: Mapping[str, QueueConfig] = field(default_factory=lambda: {DEFAULT_QUEUE.name: DEFAULT_QUEUE})
    resync_seconds: float = 30.0
    ledger_timeout_seconds: float = 120.0
    identity: str = ""
    kueue: bool = False  # also decide the topolet.io/topology-fit AdmissionCheck (agent.admission.kueue)


def pace_seconds(cpu: float, wall: float) -> float:
    """How long the loop waits after a pass that took `cpu` seconds of the process's CPU over `wall`
    seconds: PACE times that CPU (at most PACE_MAX_SECONDS), less the rest the pass already took while
    it waited on its writes (`wall - cpu`), and never less than the debounce.  A pass's cost grows with
    the cluster, not with the few Jobs that arrived, so under a stream of Jobs the controller's work
    and rest then come to about 1/(1 + PACE) of a core; and a pass that spent seconds waiting for the
    API server to take its writes does not then rest as long again before the Jobs that came meanwhile
    are decided."""
    rest = min(PACE_MAX_SECONDS, PACE * cpu) - max(0.0, wall - cpu)
    return max(DEBOUNCE_SECONDS, rest)


class Controller:
    """The store, the decision pass and the loop (see README.md beside this module)."""

    def __init__(self, kube: KubeClient, config: ControllerConfig, metrics: AdmissionMetrics,
                 leader: LeaderElector | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.identity = config.identity or f"{socket.gethostname()}-{os.getpid()}"
        self.changed = threading.Event()
        # A watched object that cannot be decoded at all is skipped and counted like one a pass skips.
        invalid = metrics.invalid_objects
        self.jobs = Reflector(kube, resource_path("batch", "v1", "jobs"), "queued Jobs", self.changed,
                              {"labelSelector": QUEUE_LABEL}, matters=_job_change_matters,
                              on_invalid=invalid.labels(kind="Job").inc, slim=slim_job, object_hook=drop_bulk)
        # Each store keeps only what is read of its objects (agent/admission/cluster/slim.py); the pods'
        # and Jobs' bulk is dropped while their responses are decoded (agent/kubeapi/bulk.py).
        # The pods and the NRTs also hold the parts they have in common once (a Job's pods' containers, a
        # resource's figures in every idle zone of a machine type): agent/admission/cluster/sharing.py.
        pod_parts, nrt_parts = Sharing(), Sharing()
        self.pods = Reflector(kube, resource_path("", "v1", "pods"), "pods", self.changed,
                              matters=_pod_change_matters, on_invalid=invalid.labels(kind="Pod").inc,
                              slim=partial(slim_pod, sharing=pod_parts), object_hook=drop_bulk,
                              indexes={OWNER: owner_keys, JOBSET_LABEL: jobset_keys})
        self.nodes = Reflector(kube, resource_path("", "v1", "nodes"), "nodes", self.changed,
                               slim=slim_node)
        self.nrts = Reflector(kube, resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL), "NRTs", self.changed,
                              slim=partial(slim_nrt, sharing=nrt_parts))
        self.priorities = Reflector(kube, resource_path("scheduling.k8s.io", "v1", "priorityclasses"),
                                    "PriorityClasses", self.changed)
        # Both routes size a gang as its pods will be created: with their namespace's LimitRange
        # defaults (the API server's LimitRanger fills them in each pod it creates).
        self.limit_ranges = Reflector(kube, resource_path("", "v1", "limitranges"), "LimitRanges",
                                      self.changed)
        self._limit_range_reads: VersionCache[ContainerDefaults | None] = VersionCache(_read_limit_range)
        self.reflectors: tuple[Reflector, ...] = (self.jobs, self.pods, self.nodes, self.nrts,
                                                  self.priorities, self.limit_ranges)
        # The pass's writes and the Events about each Job (agent.admission.controller.writes).
        self.writes = JobWrites(kube, self.jobs, self.pods, metrics, self.identity, leader, self.changed,
                                clock)
        # Queued JobSets, the native route's second kind (none where JobSets are not served).
        self.jobsets = JobSetRoute(kube, self.changed, metrics, self.writes, config.queues)
        self.reflectors += self.jobsets.reflectors
        self.kueue: KueueCheck | None = None
        if config.kueue:
            self.kueue = KueueCheck(kube, self.changed, metrics, self.writes.submit, self.writes.check_leader,
                                    clock, crash_point, self.identity)
            self.reflectors += self.kueue.reflectors
        self.capacity = Capacity(self.nodes, self.nrts, metrics, config.ledger_timeout_seconds, clock)
        self._pod_slots: dict[str, tuple[str, str]] = {}  # pod uid -> (Job key, slot), this pass
        self.passes = 0
        self.heap = Heap()
        self._last_pass = (0.0, 0.0)  # the process's CPU seconds and the wall seconds of the last pass
        self.reader = JobReader()  # each Job version and its slots read once across passes
        self.intake = JobIntake(self.reader, self.writes, metrics, config.queues)  # each Job, one at a time
        metrics.set_queue_depths(dict.fromkeys(config.queues, 0))  # every configured queue from the start
        self._timings = (0.0, 0.0, 0.0)  # this pass's seconds reading, building the view, deciding (logged)
        self.waiting = Waiting()  # the waiting gangs' refusals while the view has not grown
        self._view_at: float | None = None  # monotonic time the view (and its metrics) was last built

    # -- loop ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.writes.events.start()
        for r in self.reflectors:
            r.start()

    def stop(self) -> None:
        for r in self.reflectors:
            r.stop()
        self.writes.shutdown()
        if self.kueue is not None:
            self.kueue.stop()
        self.writes.events.stop()

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def leading(self) -> bool:
        return self.writes.leading()

    def run(self, stop: threading.Event) -> None:
        """Pass after every change (debounced) and every resync, until `stop` is set."""
        due = self.kueue.due if self.kueue is not None else threading.Event()
        while not stop.is_set():
            self.changed.wait(self.config.resync_seconds)
            # The debounce gathers a burst of events into one pass; a Kueue Workload waiting for our
            # check (`due`) ends it at once: Kueue's admission waits on that decision.  On a big
            # cluster it is stretched by the pace (`pace_seconds`), so that under a stream of Jobs the
            # controller takes about 1/(1 + PACE) of a core.
            due.wait(pace_seconds(*self._last_pass))
            if stop.is_set():
                break
            due.clear()
            self.changed.clear()
            self.metrics.leader.set(1 if self.leading() else 0)
            if not self.synced() or not self.leading():
                self.metrics.last_pass.set(self.clock())
                continue
            try:
                cpu, wall = time.process_time(), time.perf_counter()
                self.decide_once()
                self.heap.after_pass()
                self._last_pass = (time.process_time() - cpu, time.perf_counter() - wall)
            except NotLeader:
                log.info("lost the lease mid-pass: stopped deciding")
            except Exception:  # noqa: BLE001 - one bad pass must not end the controller
                log.exception("decision pass failed")
                self.metrics.decisions.labels(result="error").inc()
                self.changed.set()
                stop.wait(1.0)

    # -- one pass -----------------------------------------------------------------------------------

    def decide_once(self) -> None:
        """One decision pass over the store (see README.md beside this module)."""
        started = time.perf_counter()
        try:
            self._pass()
        finally:
            self.writes.drain()
        elapsed = time.perf_counter() - started
        self.metrics.pass_seconds.observe(elapsed)
        if self.writes.written or elapsed > 1.0:  # a timing line per pass that did something (profiling)
            read, view, decide = self._timings
            log.info("pass %d: %.2f s (reading %.2f s, view %.2f s, decisions %.2f s, writes %.2f s), "
                     "%d writes, %d conflicts so far", self.passes, elapsed, read, view, decide,
                     elapsed - read - view - decide, self.writes.written, self.writes.conflicts)
        self.writes.written = 0

    def _pass(self) -> None:
        t_read = time.perf_counter()
        self.writes.reap()
        self.writes.check_leader()
        self.passes += 1
        all_jobs = sorted(self.jobs.snapshot(), key=object_key)
        pods = self.pods.snapshot()
        nodes = frozenset(str(metadata_of(n).get("name")) for n in self.nodes.snapshot())
        limit_defaults = self._limit_defaults()  # both routes size gangs as their pods are created
        priorities = priority_classes(self.priorities.snapshot())
        jobs = self.intake.sort(all_jobs, priorities, nodes, limit_defaults)
        admitted, pending, jobs_by_key = jobs.admitted, jobs.pending, jobs.by_key

        # With no gang to decide, a pass only hands gated pods their slots: rebuilding the whole view
        # (seconds on a big cluster) would delay those patches, so it is refreshed for the capacity
        # metrics at most every VIEW_REFRESH_SECONDS then.
        kueue = (self.kueue.collect(pods, limit_defaults, self.jobsets.jobsets.snapshot())
                 if self.kueue is not None else None)
        t_view = time.perf_counter()
        build = (bool(pending) or bool(kueue and kueue.pending) or self._view_at is None
                 or t_view - self._view_at >= VIEW_REFRESH_SECONDS)
        self._pod_slots = dict(kueue.pod_slots) if kueue is not None else {}
        jobsets = self.jobsets.collect(partial(self.pods.by, JOBSET_LABEL), priorities, limit_defaults)
        build = build or bool(jobsets.pending)
        self._pod_slots.update(jobsets.pod_slots)
        pending = pending + jobsets.pending  # one queue order over Jobs and JobSets
        jobs_by_key = {**jobs_by_key, **jobsets.by_key}
        refused = list(kueue.refused) if kueue is not None else []  # pods naming a Job, not its own
        for job, read, record in admitted:
            try:
                held = self._finish_admitted(job, read, record, self.pods.by(OWNER, _owner(job)), nodes,
                                             slots_needed=build, refused=refused)
            except Exception as exc:  # noqa: BLE001 - one Job's pods cost only that Job
                self.intake.unreadable(job, exc)
                continue
            self._pod_slots.update({uid: (read.key, str(slot)) for uid, slot in held.items()})
        self.intake.report_refused(refused, pods)

        depths = dict.fromkeys(self.config.queues, 0)  # a series per configured queue, never per label
        for p in pending:
            depths[p.queue] += 1
        t_view = time.perf_counter()
        if build:
            holding = [(read.key, record, self.intake.requests_of(job, read.limit_defaults))
                       for job, read, record in admitted]
            holding += jobsets.held
            holding += kueue.admitted if kueue is not None else []
            view = self.capacity.view(holding, pods, self._slot_of)
            self.intake.report_pods(self.capacity.unreadable_pods())
            self._view_at = time.perf_counter()
            self.metrics.set_view(view)
        else:
            view = ClusterView(nodes=())
        t_decide = time.perf_counter()

        state = {"view": view}
        if build:
            self.waiting.begin(view)  # a gang told "not now" is decided again only once the view grew

        def decide(gang: Gang, fits: Callable[[Placement], str | None] = _fits) -> Placement | Refusal:
            pods = sum(ps.count for ps in gang.pod_sets)
            if pods > MAX_GANG_PODS:  # bounds one decision's time, and the record it leaves
                return Refusal(gang.key, "never", f"{pods} pods: a gang holds at most {MAX_GANG_PODS}")
            again = self.waiting.answer(gang)
            if again is not None:
                self.metrics.refusals_reused.inc()
                return again
            result = place(state["view"], gang)
            if isinstance(result, Placement):
                self.waiting.forget(gang)
                why = fits(result)
                if why is not None:
                    return Refusal(gang.key, "never", why)
                state["view"] = commit(state["view"], gang, result)
            else:
                self.waiting.remember(gang, result)
            return result

        started: dict[str, float] = {}

        def timed(gang: Gang) -> Placement | Refusal:
            started[gang.key] = time.perf_counter()
            return decide(gang, record_too_long)  # the Job route's record is one Job annotation

        decided: list[tuple[str, Future[Any]]] = []  # (queue, write that returns whether it landed)
        for outcome in admission_pass(pending, self.config.queues, timed):
            job = jobs_by_key[outcome.pending.gang.key]
            result = outcome.result
            route = self.jobsets if outcome.pending.gang.key in jobsets.by_key else None
            involved = JOBSET if route is not None else None
            if isinstance(result, Placement):
                self.writes.check_leader()
                decided.append((outcome.pending.queue, self.writes.submit(
                    route.admit if route is not None else self.writes.admit, job, result)))
            elif isinstance(result, Refusal) and result.kind == "never" and self.capacity.left_out:
                # "Never" counts only the usable nodes: with some left out (NotReady, stale NRT) the
                # gang may fit once they are back, so it waits instead of being rejected for good.
                self.writes.wait(job,
                                 f"{result.reason}; {len(self.capacity.left_out)} nodes are left out now",
                                 involved)
            elif isinstance(result, Refusal) and result.kind == "never":
                self.writes.check_leader()
                decided.append((outcome.pending.queue, self.writes.submit(
                    route.reject if route is not None else self.writes.reject, job, result.reason)))
            elif isinstance(result, Refusal):
                self.writes.wait(job, result.reason, involved)
            elif isinstance(result, Blocked):
                self.writes.wait(job, f"behind {result.head}, the head of StrictFIFO queue "
                                      f"{outcome.pending.queue}", involved)
            if outcome.pending.gang.key in started:
                self.metrics.decision_seconds.observe(time.perf_counter() - started[outcome.pending.gang.key])
        if self.kueue is not None and kueue is not None:
            # Kueue's Workloads on the same view, after the Job queues: one ledger, no double booking.
            self.kueue.decide(kueue, decide, self.capacity.left_out)
        if build:
            self.waiting.end(state["view"])
        self._timings = (t_view - t_read, t_decide - t_view, time.perf_counter() - t_decide)
        self.writes.drain()
        for queue, landed in decided:
            if landed.result():
                depths[queue] -= 1
        self.metrics.set_queue_depths(depths)
        # Forget what was said about Jobs that are gone, so the memory stays bounded by the queue.
        uids = {str(metadata_of(job).get("uid")) for job in all_jobs}
        self.writes.retain(uids | jobsets.uids)
        self.reader.retain(uids)
        self.metrics.last_pass.set(self.clock())

    def _finish_admitted(self, job: dict[str, Any], read: JobRead, record: AdmissionRecord,
                         pods: Sequence[Mapping[str, Any]], nodes: frozenset[str],
                         slots_needed: bool = True,
                         refused: list[Refused] | None = None) -> Mapping[str, int]:
        """Give an admitted Job's gated pods their slots.  Returns the slot each of its live pods holds
        (pod uid -> slot); with `slots_needed` False (no view is built this pass) an empty map when no
        pod of the Job is gated, as it need not be worked out.  A Job whose record names a node that is
        gone (not among `nodes`) before any of its pods is bound is queued again instead.  The pods that
        name the Job but are not its own go to `refused`."""
        if not slots_needed and not any(pod_gated(p) for p in pods):
            return {}
        gone = gone_nodes(job, record, nodes, pods)
        if gone:
            self.writes.check_leader()
            self.writes.submit(self.writes.requeue_lost, job, gone)
            return {}
        assignment = self.reader.slots(read, pods)
        for pod, slot in assignment.place:
            self.writes.place(pod, slot, record.slots[slot])
        if refused is not None and read.owner is not None:
            refused += [(read.owner, pod, why) for pod, why in assignment.refused]
        # A pod whose patch fails still names its slot this pass: it is gated, so unbound, and the
        # slot's ledger entry stays either way; the next pass assigns it again.
        return assignment.held

    def _limit_defaults(self) -> dict[str, ContainerDefaults]:
        """Each namespace's LimitRange container defaults, its LimitRanges applied by name; one that
        cannot be read is left out (logged once per version) and costs only itself."""
        ranges = sorted(self.limit_ranges.snapshot(), key=object_key)
        by_namespace: dict[str, list[ContainerDefaults]] = {}
        for lr in ranges:
            read = self._limit_range_reads.of(lr)
            if read:
                by_namespace.setdefault(str(metadata_of(lr).get("namespace")), []).append(read)
        self._limit_range_reads.retain(ranges)
        return {ns: namespace_defaults(reads) for ns, reads in by_namespace.items()}

    # -- the view -----------------------------------------------------------------------------------

    def _slot_of(self, pod: Mapping[str, Any]) -> tuple[str, str] | None:
        """A pod's ledger entry: (Job key, the slot it holds this pass); None when it holds none."""
        return self._pod_slots.get(str(metadata_of(pod).get("uid")))


def _job_change_matters(kind: str, job: Mapping[str, Any]) -> bool:
    """Whether a queued Job's watch event calls for a pass: a Job new, gone, undecided, suspended or
    finished.  The Job controller's status updates of a running admitted Job (most events on a busy
    cluster) change nothing a pass reads."""
    if kind in ("ADDED", "DELETED") or job_suspended(job) or job_finished(job):
        return True
    return ADMISSION_ANNOTATION not in as_dict(metadata_of(job).get("annotations"))


def _pod_change_matters(kind: str, pod: Mapping[str, Any]) -> bool:
    """Whether a pod's watch event calls for a pass: a pod gone or finished frees capacity, and a pod
    held by our gate waits for its slot.  Binds and status updates of other pods only use capacity a
    pass already counted, and on a busy cluster they are most events (the resync covers the rest)."""
    if kind == "DELETED" or pod_gated(pod):
        return True
    return as_dict(pod.get("status")).get("phase") in ("Succeeded", "Failed")


def _read_limit_range(limit_range: Mapping[str, Any]) -> ContainerDefaults | None:
    """One LimitRange's container defaults; None (and a log line) when it cannot be read."""
    try:
        return read_limit_range(limit_range)
    except LimitRangeError as exc:
        log.warning("LimitRange %s left out: %s; Jobs in its namespace are sized without its defaults",
                    object_key(limit_range), exc)
        return None


def _fits(placement: Placement) -> str | None:
    """No bound of the route's own on an admission (the Kueue route's record is the Workload's)."""
    del placement
    return None


def _owner(job: Mapping[str, Any]) -> tuple[str, str]:
    """The Job as its pods name their owner (`owner_keys`): its namespace and uid."""
    meta = metadata_of(job)
    return str(meta.get("namespace")), str(meta.get("uid"))

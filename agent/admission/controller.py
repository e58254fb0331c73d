"""The decision loop of `topolet controller`: admits queued Jobs as gangs, pins their pods through gates.

Public API:

- `ControllerConfig` (namespace, queue modes, resync and ledger timeout, identity).
- `Controller(kube, config, metrics, leader=None)`: `.start()` starts the list+watch reflectors
  (queued Jobs, pods, Nodes, NRTs, PriorityClasses) into an in-memory store; `.run(stop)` runs a
  decision pass after every change (debounced) and every `resync_seconds`, while leading;
  `.decide_once()` runs one pass now (its pod patches may still be in flight when it returns).

The pieces it is built from: `store` (list+watch into memory), `capacity` (the ledger and the
engine's view across passes), `jobread` (each Job version and its slots read once across passes),
`events` (Events off the pass), `placing`/`jobs`/`queues` (pure), and `command` (the `topolet
controller` sub-command around it).

A pass, in order (each step is idempotent and re-derived from the API objects, so a controller
killed at any point finishes the work on restart and never decides a Job twice):

1. Admitted Jobs (annotation `topolet.io/admission` result admitted) that are still suspended (an
   earlier version wrote the decision and the unsuspend apart) are unsuspended; their gated pods
   each get `nodeSelector kubernetes.io/hostname`, the `topolet.io/numa-zone` annotation and lose
   the gate, in one patch (`topolet_admission_pods_patched_total`).  Where the placement policy is
   installed, the API server does this for Indexed Jobs' pods as they are created, from the slots the
   admitting write put in the pod template (`agent.admission.placing`), so they are never gated here.
   A slot is held by a live pod
   already pinned to its (node, zone); a new pod takes its completion index's slot when that is free
   (Indexed Jobs), else the lowest free one, in pod creation order (`placing.assign_slots`).
2. The view: Nodes, NRTs and pods, with the ledger of admitted Jobs' slots the NRTs do not show yet.
3. Pending Jobs (suspended, queue label, no record) in queue order through the engine: admitted ones
   get the record, `suspend: false` and, in the pod template, either their node (a Job placed on one
   node: its pods are created pinned, `placing.one_node_template`) or the gate (and, for Indexed Jobs,
   the slots in `topolet.io/placements`), in one patch; "never" refusals get a rejected record
   (only while no node is left out of the view: else they wait, as the node may come back); "not
   now" ones an Event when their reason changes.  A malformed Job gets an Event and is left as
   it is.

Writes carry the resourceVersion they were computed from, so a stale store makes a write fail
instead of overwriting.  A Job write that fails so (the Job controller updates a suspended Job's
status too) re-reads that Job and, while it is still undecided and suspended, retries at once with
the fresh resourceVersion; any other conflict is left to the next pass.  A pass sends its writes
through a pool of `WRITERS` threads (each Job's writes in order in one task) and waits for them all
before it ends, so the next pass sees every record it made; pod patches go through a second such
pool and may still be in flight when the next pass starts (a pod is never sent twice at once).
Events (Admitted, Waiting, Rejected, malformed input) go to a bounded queue that one thread sends
from; no pass waits on them, and an Event that finds the queue full is dropped and counted
(`topolet_admission_events_dropped_total`).
Only the leader writes, and it checks before every write; a replica that loses the Lease stops at
once.

For the kill tests, env `TOPOLET_CONTROLLER_CRASH_AT=<step>` (or `--crash-at <step>`) makes the
process SIGKILL itself the first time it reaches `<step>`: `after-decision`, `after-unsuspend` (both
right after the one admitting write; `after-unsuspend` also after unsuspending a Job admitted but left
suspended) or `after-pod-patch`; with `--kueue`, `after-decision` also right after a Workload's Ready
write.

With `ControllerConfig.kueue`, the pass also decides the `topolet.io/topology-fit` Kueue AdmissionCheck
(`agent.admission.kueue`): its Ready Workloads join the ledger of admitted Jobs and its pending ones
are decided after the Job queues, on the same view.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agent.admission import jobs, placing
from agent.admission.capacity import Capacity
from agent.admission.events import ObjectEvents, timestamp
from agent.admission.heap import Heap
from agent.admission.jobread import JobRead, JobReader
from agent.admission.jobs import JobSpecError
from agent.admission.kueue import KueueCheck
from agent.admission.metrics import AdmissionMetrics
from agent.admission.model import ClusterView, Gang, Placement, Refusal, Resources
from agent.admission.placing import AdmissionRecord, SlotPlacement
from agent.admission.queues import Blocked, Pending, admission_pass
from agent.admission.store import Reflector, as_dict, metadata_of, object_key
from agent.errors import KubeAPIError
from agent.kube.client import KubeClient, resource_path
from agent.kube.leader import LeaderElector

log = logging.getLogger(__name__)

LEASE_NAME = "topolet-controller"
CRASH_ENV = "TOPOLET_CONTROLLER_CRASH_AT"
CRASH_STEPS = ("after-decision", "after-unsuspend", "after-pod-patch")
DEBOUNCE_SECONDS = 0.2
PACE = 2.0
PACE_MAX_SECONDS = 2.0
VIEW_REFRESH_SECONDS = 30.0  # how stale the capacity metrics may get while no gang waits
# API writes in flight at once during a pass (Job patches), and pod patches apart: each waits ~0.1 s
# on a busy API server, so this many keep up with Jobs created at a few hundred per second.
WRITERS = 32
CONFLICT_RETRIES = 3  # a Job write re-read and retried this often on 409 before the next pass
NRT_GROUP, NRT_VERSION, NRT_PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"




def _crash_point(step: str) -> None:
    """SIGKILL this process at `step` when the kill tests ask for it (env TOPOLET_CONTROLLER_CRASH_AT)."""
    if os.environ.get(CRASH_ENV) == step:
        log.warning("%s=%s: killing myself", CRASH_ENV, step)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class ControllerConfig:
    namespace: str = "topolet-system"
    queue_modes: Mapping[str, str] = field(default_factory=dict)
    resync_seconds: float = 30.0
    ledger_timeout_seconds: float = 120.0
    identity: str = ""
    kueue: bool = False  # also decide the topolet.io/topology-fit AdmissionCheck (agent.admission.kueue)


class NotLeader(Exception):
    """This replica stopped leading in the middle of a pass: write nothing more."""


class Controller:
    """The store, the decision pass and the loop (see the module docstring)."""

    def __init__(self, kube: KubeClient, config: ControllerConfig, metrics: AdmissionMetrics,
                 leader: LeaderElector | None = None, clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.config = config
        self.metrics = metrics
        self.leader = leader
        self.clock = clock
        self.identity = config.identity or f"{socket.gethostname()}-{os.getpid()}"
        self.events = ObjectEvents(kube, self.identity, on_drop=metrics.events_dropped.inc)
        self.changed = threading.Event()
        self.jobs = Reflector(kube, resource_path("batch", "v1", "jobs"), "queued Jobs", self.changed,
                              {"labelSelector": jobs.QUEUE_LABEL}, matters=_job_change_matters)
        self.pods = Reflector(kube, resource_path("", "v1", "pods"), "pods", self.changed,
                              matters=_pod_change_matters)
        self.nodes = Reflector(kube, resource_path("", "v1", "nodes"), "nodes", self.changed)
        self.nrts = Reflector(kube, resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL), "NRTs", self.changed)
        self.priorities = Reflector(kube, resource_path("scheduling.k8s.io", "v1", "priorityclasses"),
                                    "PriorityClasses", self.changed)
        self.reflectors: tuple[Reflector, ...] = (self.jobs, self.pods, self.nodes, self.nrts,
                                                  self.priorities)
        self.kueue: KueueCheck | None = None
        if config.kueue:
            self.kueue = KueueCheck(kube, self.changed, metrics, self._submit, self._check_leader, clock,
                                    self._guaranteed_policy, _crash_point, self.identity)
            self.reflectors += self.kueue.reflectors
        # Said once per state, so Events are not repeated every pass: Job uid -> last waiting reason,
        # and (uid, resourceVersion) of Jobs already told they are malformed.
        self._waiting: dict[str, str] = {}
        self._invalid: set[tuple[str, str]] = set()
        self.capacity = Capacity(self.nodes, self.nrts, metrics, config.ledger_timeout_seconds, clock)
        self._pod_slots: dict[str, tuple[str, str]] = {}  # pod uid -> (Job key, slot), this pass
        self.passes = 0
        self.heap = Heap()
        self._pass_cpu = 0.0  # the process's CPU seconds over the last pass, for the pace
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="admission-write")
        # Pod patches run on their own pool and outlive the pass that sent them, so the next pass
        # (new Jobs admitted, newly made pods) overlaps them; `_placing` keeps a pod from being sent
        # twice meanwhile.  Their failures surface at the start of the next pass (`_reap`).
        self._pod_pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="admission-pods")
        self._pod_writes: list[Future[Any]] = []
        self._placing: set[str] = set()
        self._placing_lock = threading.Lock()
        self.reader = JobReader()  # each Job version and its slots read once across passes
        self._writes: list[Future[Any]] = []  # this pass's writes in flight (drained before it ends)
        self._written = 0  # writes submitted this pass (logged)
        self._conflicts = 0  # writes refused with 409 since the start (logged; under _placing_lock)
        self._timings = (0.0, 0.0)  # this pass's seconds building the view, deciding (logged)
        self._view_at: float | None = None  # monotonic time the view (and its metrics) was last built

    # -- loop ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.events.start()
        for r in self.reflectors:
            r.start()

    def stop(self) -> None:
        for r in self.reflectors:
            r.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pod_pool.shutdown(wait=True, cancel_futures=True)
        if self.kueue is not None:
            self.kueue.stop()
        self.events.stop()

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def leading(self) -> bool:
        return self.leader is None or self.leader.is_leader

    def run(self, stop: threading.Event) -> None:
        """Pass after every change (debounced) and every resync, until `stop` is set."""
        due = self.kueue.due if self.kueue is not None else threading.Event()
        while not stop.is_set():
            self.changed.wait(self.config.resync_seconds)
            # The debounce gathers a burst of events into one pass; a Kueue Workload waiting for our
            # check (`due`) ends it at once: Kueue's admission waits on that decision.  On a big
            # cluster it is stretched to PACE times the CPU time the process spent over the last pass
            # (at most PACE_MAX_SECONDS): its writes and the watches' decoding meanwhile count too.  A
            # pass's cost grows with the cluster, not with the few Jobs that arrived, so under a stream
            # of Jobs the controller then takes about 1/(1 + PACE) of a core.
            due.wait(max(DEBOUNCE_SECONDS, min(PACE_MAX_SECONDS, PACE * self._pass_cpu)))
            if stop.is_set():
                break
            due.clear()
            self.changed.clear()
            self.metrics.leader.set(1 if self.leading() else 0)
            if not self.synced() or not self.leading():
                self.metrics.last_pass.set(self.clock())
                continue
            try:
                cpu = time.process_time()
                self.decide_once()
                self.heap.after_pass()
                self._pass_cpu = time.process_time() - cpu
            except NotLeader:
                log.info("lost the lease mid-pass: stopped deciding")
            except Exception:  # noqa: BLE001 - one bad pass must not end the controller
                log.exception("decision pass failed")
                self.metrics.decisions.labels(result="error").inc()
                self.changed.set()
                stop.wait(1.0)

    def _check_leader(self) -> None:
        if not self.leading():
            raise NotLeader()

    def _patch(self, store: Reflector, path: str, body: Mapping[str, Any], what: str,
               again: Callable[[dict[str, Any]], Mapping[str, Any] | None] | None = None,
               ) -> dict[str, Any] | None:
        """A merge patch as the leader; the response goes into the store.  None on a vanished object
        (404) or a conflict (409): the next pass sees the newer state and decides again.

        With `again`, a conflict re-reads the object (into the store) and asks `again(fresh)` for the
        body to send now, up to CONFLICT_RETRIES times; None from it means the write no longer
        applies (someone else decided)."""
        for attempt in range(CONFLICT_RETRIES + 1):
            self._check_leader()
            try:
                out = self.kube.patch(path, body, jobs.MERGE_PATCH, what=what)
            except KubeAPIError as exc:
                if exc.status not in (404, 409):
                    raise
                if exc.status == 409:
                    self.metrics.write_conflicts.inc()
                    with self._placing_lock:
                        self._conflicts += 1
                if exc.status == 409 and again is not None and attempt < CONFLICT_RETRIES:
                    fresh = self._reread(store, path, what)
                    retry = again(fresh) if fresh is not None else None
                    if retry is not None:
                        body = retry
                        continue
                    return None
                log.info("%s: %s (retried on the next pass)", what, exc)
                self.changed.set()
                return None
            store.put(out)
            return out
        return None

    def _reread(self, store: Reflector, path: str, what: str) -> dict[str, Any] | None:
        """The object at `path` now (also put into the store); None when it is gone."""
        try:
            fresh = self.kube.get(path, what=f"re-read to {what}")
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(fresh, dict):
            return None
        store.put(fresh)
        return fresh

    def _submit(self, work: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run `work(*args)` on the write pool; the pass waits for it before it ends."""
        future = self._pool.submit(work, *args)
        self._writes.append(future)
        self._written += 1
        return future

    def _drain(self) -> None:
        """Wait for every write of this pass; re-raise the first failure (NotLeader included)."""
        writes, self._writes = self._writes, []
        first: BaseException | None = None
        for future in writes:
            exc = future.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first

    # -- one pass -----------------------------------------------------------------------------------

    def decide_once(self) -> None:
        """One decision pass over the store (see the module docstring)."""
        started = time.perf_counter()
        try:
            self._pass()
        finally:
            self._drain()
        elapsed = time.perf_counter() - started
        if self._written or elapsed > 1.0:  # a timing line per pass that did something (profiling)
            log.info("pass %d: %.2f s (view %.2f s, decisions %.2f s, then writes), %d writes, "
                     "%d conflicts so far", self.passes, elapsed, self._timings[0], self._timings[1],
                     self._written, self._conflicts)
        self._written = 0

    def _reap(self) -> None:
        """Forget finished pod patches; re-raise the first failure among them (NotLeader included)."""
        done = [f for f in self._pod_writes if f.done()]
        self._pod_writes = [f for f in self._pod_writes if not f.done()]
        for future in done:
            exc = future.exception()
            if exc is not None:
                raise exc

    def _pass(self) -> None:
        self._reap()
        self._check_leader()
        self.passes += 1
        all_jobs = sorted(self.jobs.snapshot(), key=object_key)
        pods = self.pods.snapshot()
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            for ref in metadata_of(pod).get("ownerReferences") or []:
                ref = as_dict(ref)
                if ref.get("kind") == "Job" and ref.get("controller"):
                    by_owner.setdefault(str(ref.get("uid")), []).append(pod)
        priorities = {str(metadata_of(p).get("name")): int(p.get("value") or 0)
                      for p in self.priorities.snapshot() if isinstance(p.get("value"), int)}
        admitted: list[tuple[dict[str, Any], JobRead, AdmissionRecord]] = []
        pending: list[Pending] = []
        jobs_by_key: dict[str, dict[str, Any]] = {}
        policy = self._guaranteed_policy()  # once a pass: it reads every NRT
        for job in all_jobs:
            read = self.reader.read(job)
            if read.queue is None:
                continue
            queue = read.queue
            if read.bad_record is not None:
                self._invalid_job(job, "InvalidAdmissionRecord", read.bad_record)
                continue
            if read.record is not None:
                if read.record.result == "admitted" and not read.finished:
                    admitted.append((job, read, read.record))
                continue
            if not read.suspended:
                self._invalid_job(job, "NotSuspended",
                                  "a queued Job must be created with spec.suspend: true; left alone")
                continue
            try:
                gang = jobs.gang_from_job(job, priorities, policy)
            except JobSpecError as exc:
                self._invalid_job(job, "InvalidJob", str(exc))
                continue
            jobs_by_key[gang.key] = job
            pending.append(Pending(gang, queue, str(metadata_of(job).get("creationTimestamp") or ""),
                                   str(metadata_of(job).get("name"))))

        # With no gang to decide, a pass only hands gated pods their slots: rebuilding the whole view
        # (seconds on a big cluster) would delay those patches, so it is refreshed for the capacity
        # metrics at most every VIEW_REFRESH_SECONDS then.
        kueue = self.kueue.collect(pods) if self.kueue is not None else None
        t_view = time.perf_counter()
        build = (bool(pending) or bool(kueue and kueue.pending) or self._view_at is None
                 or t_view - self._view_at >= VIEW_REFRESH_SECONDS)
        self._pod_slots = dict(kueue.pod_slots) if kueue is not None else {}
        for job, read, record in admitted:
            held = self._finish_admitted(job, read, record, by_owner.get(read.uid, []), slots_needed=build)
            self._pod_slots.update({uid: (read.key, str(slot)) for uid, slot in held.items()})

        depths: dict[str, int] = {}
        for p in pending:
            depths[p.queue] = depths.get(p.queue, 0) + 1
        t_view = time.perf_counter()
        if build:
            holding = [(read.key, record, _requests_of(job)) for job, read, record in admitted]
            holding += kueue.admitted if kueue is not None else []
            view = self.capacity.view(holding, pods, self._slot_of)
            self._view_at = time.perf_counter()
            self.metrics.set_view(view)
        else:
            view = ClusterView(nodes=())
        t_decide = time.perf_counter()

        from agent.admission.engine import commit, place

        state = {"view": view}

        def decide(gang: Gang) -> Placement | Refusal:
            result = place(state["view"], gang)
            if isinstance(result, Placement):
                state["view"] = commit(state["view"], gang, result)
            return result

        started: dict[str, float] = {}

        def timed(gang: Gang) -> Placement | Refusal:
            started[gang.key] = time.perf_counter()
            return decide(gang)

        decided: list[tuple[str, Future[Any]]] = []  # (queue, write that returns whether it landed)
        for outcome in admission_pass(pending, self.config.queue_modes, timed):
            job = jobs_by_key[outcome.pending.gang.key]
            result = outcome.result
            if isinstance(result, Placement):
                self._check_leader()
                decided.append((outcome.pending.queue, self._submit(self._admit, job, result)))
            elif isinstance(result, Refusal) and result.kind == "never" and self.capacity.left_out:
                # "Never" counts only the usable nodes: with some left out (NotReady, stale NRT) the
                # gang may fit once they are back, so it waits instead of being rejected for good.
                self._wait(job, f"{result.reason}; {len(self.capacity.left_out)} nodes are left out now")
            elif isinstance(result, Refusal) and result.kind == "never":
                self._check_leader()
                decided.append((outcome.pending.queue, self._submit(self._reject, job, result.reason)))
            elif isinstance(result, Refusal):
                self._wait(job, result.reason)
            elif isinstance(result, Blocked):
                self._wait(job, f"behind {result.head}, the head of StrictFIFO queue {outcome.pending.queue}")
            if outcome.pending.gang.key in started:
                self.metrics.decision_seconds.observe(time.perf_counter() - started[outcome.pending.gang.key])
        if self.kueue is not None and kueue is not None:
            # Kueue's Workloads on the same view, after the Job queues: one ledger, no double booking.
            self.kueue.decide(kueue, decide, self.capacity.left_out)
        self._timings = (t_decide - t_view, time.perf_counter() - t_decide)
        self._drain()
        for queue, landed in decided:
            if landed.result():
                depths[queue] -= 1
        self.metrics.set_queue_depths(depths)
        # Forget what was said about Jobs that are gone, so the memory stays bounded by the queue.
        uids = {str(metadata_of(job).get("uid")) for job in all_jobs}
        self._waiting = {uid: why for uid, why in self._waiting.items() if uid in uids}
        self.reader.retain(uids)
        self._invalid = {key for key in self._invalid if key[0] in uids}
        self.metrics.last_pass.set(self.clock())

    def _guaranteed_policy(self) -> str:
        """The Topology Manager policy every NRT reports, when they agree; else "none"."""
        policies = set()
        for nrt in self.nrts.snapshot():
            for attr in nrt.get("attributes") or []:
                attr = as_dict(attr)
                if attr.get("name") == "topologyManagerPolicy":
                    policies.add(str(attr.get("value")))
        if len(policies) == 1:
            (policy,) = policies
            if policy in ("single-numa-node", "restricted", "best-effort"):
                return policy
        return "none"

    def _invalid_job(self, job: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event once per Job version; the Job itself is left as it is."""
        meta = metadata_of(job)
        key = (str(meta.get("uid")), str(meta.get("resourceVersion")))
        if key in self._invalid:
            return
        self._invalid.add(key)
        log.warning("Job %s: %s: %s", jobs.job_key(job), reason, message)
        self.metrics.decisions.labels(result="error").inc()
        self._check_leader()
        self.events.record(job, "Warning", reason, message)

    def _job_path(self, job: Mapping[str, Any]) -> str:
        meta = metadata_of(job)
        return resource_path("batch", "v1", "jobs", str(meta.get("name")),
                             namespace=str(meta.get("namespace")))

    def _admit(self, job: dict[str, Any], placement: Placement) -> bool:
        pods = sorted(placement.pods, key=lambda p: (p.pod_set, p.index))
        record = AdmissionRecord("admitted", uuid.uuid4().hex, timestamp(self.clock()),
                                 {i: SlotPlacement(p.node, p.zone) for i, p in enumerate(pods)})
        out = self._patch(self.jobs, self._job_path(job), placing.decision_patch(job, record),
                          f"record the admission of Job {jobs.job_key(job)}",
                          again=lambda fresh: _still_pending(job, fresh, placing.decision_patch, record))
        if out is None:
            return False
        # The decision, the gate and the unsuspend are one write, so both steps fall after it.
        _crash_point("after-decision")
        _crash_point("after-unsuspend")
        self.metrics.decisions.labels(result="admitted").inc()
        self._waiting.pop(str(metadata_of(job).get("uid")), None)
        nodes = sorted({p.node for p in pods})
        self.events.record(out, "Normal", "Admitted",
                           f"{len(pods)} pods placed on {len(nodes)} nodes ({', '.join(nodes[:8])}"
                           f"{', ...' if len(nodes) > 8 else ''}); decision {record.decision}")
        return True

    def _unsuspend(self, job: dict[str, Any]) -> None:
        if self._patch(self.jobs, self._job_path(job), placing.unsuspend_patch(),
                       f"unsuspend Job {jobs.job_key(job)}") is not None:
            _crash_point("after-unsuspend")

    def _reject(self, job: dict[str, Any], reason: str) -> bool:
        record = AdmissionRecord("rejected", uuid.uuid4().hex, timestamp(self.clock()), reason=reason)
        out = self._patch(self.jobs, self._job_path(job), placing.reject_patch(job, record),
                          f"record the rejection of Job {jobs.job_key(job)}",
                          again=lambda fresh: _still_pending(job, fresh, placing.reject_patch, record))
        if out is None:
            return False
        self.metrics.decisions.labels(result="rejected").inc()
        self.events.record(out, "Warning", "Rejected", f"can never fit this cluster: {reason}")
        return True

    def _wait(self, job: dict[str, Any], reason: str) -> None:
        self.metrics.decisions.labels(result="waiting").inc()
        uid = str(metadata_of(job).get("uid"))
        if self._waiting.get(uid) == reason:
            return
        self._waiting[uid] = reason
        self._check_leader()
        self.events.record(job, "Normal", "Waiting", reason)

    def _finish_admitted(self, job: dict[str, Any], read: JobRead, record: AdmissionRecord,
                         pods: list[dict[str, Any]], slots_needed: bool = True) -> Mapping[str, int]:
        """Unsuspend an admitted Job still suspended; give its gated pods their slots.  Returns the
        slot each of its live pods holds (pod uid -> slot); with `slots_needed` False (no view is
        built this pass) an empty map when no pod of the Job is gated, as it need not be worked out."""
        if read.suspended:
            self._check_leader()
            self._submit(self._unsuspend, job)
        if not slots_needed and not any(placing.pod_gated(p) for p in pods):
            return {}
        assignment = self.reader.slots(read, pods)
        for pod, slot in assignment.place:
            uid = str(metadata_of(pod).get("uid"))
            with self._placing_lock:
                if uid in self._placing:
                    continue  # its patch is still in flight
                self._placing.add(uid)
            self._check_leader()
            self._pod_writes.append(self._pod_pool.submit(self._place_pod, pod, slot, record.slots[slot]))
            self._written += 1
        # A pod whose patch fails still names its slot this pass: it is gated, so unbound, and the
        # slot's ledger entry stays either way; the next pass assigns it again.
        return assignment.held

    def _place_pod(self, pod: Mapping[str, Any], slot: int, place: SlotPlacement) -> None:
        meta = metadata_of(pod)
        try:
            out = self._patch(self.pods, resource_path("", "v1", "pods", str(meta.get("name")),
                                                       namespace=str(meta.get("namespace"))),
                              placing.pod_patch(pod, place.node, place.zone),
                              f"place pod {object_key(pod)} (slot {slot}) on {place.node}")
        finally:
            with self._placing_lock:
                self._placing.discard(str(meta.get("uid")))
        if out is not None:
            self.metrics.pods_patched.inc()
            _crash_point("after-pod-patch")

    # -- the view -----------------------------------------------------------------------------------

    def _slot_of(self, pod: Mapping[str, Any]) -> tuple[str, str] | None:
        """A pod's ledger entry: (Job key, the slot it holds this pass); None when it holds none."""
        return self._pod_slots.get(str(metadata_of(pod).get("uid")))


def _still_pending(job: Mapping[str, Any], fresh: Mapping[str, Any],
                   patch: Callable[[Mapping[str, Any], AdmissionRecord], dict[str, Any]],
                   record: AdmissionRecord) -> dict[str, Any] | None:
    """`patch(fresh, record)` when the re-read Job is still the one decided on; else None."""
    return patch(fresh, record) if placing.still_undecided(job, fresh) else None


def _job_change_matters(kind: str, job: Mapping[str, Any]) -> bool:
    """Whether a queued Job's watch event calls for a pass: a Job new, gone, undecided, suspended or
    finished.  The Job controller's status updates of a running admitted Job (most events on a busy
    cluster) change nothing a pass reads."""
    if kind in ("ADDED", "DELETED") or jobs.job_suspended(job) or jobs.job_finished(job):
        return True
    return jobs.ADMISSION_ANNOTATION not in as_dict(metadata_of(job).get("annotations"))


def _pod_change_matters(kind: str, pod: Mapping[str, Any]) -> bool:
    """Whether a pod's watch event calls for a pass: a pod gone or finished frees capacity, and a pod
    held by our gate waits for its slot.  Binds and status updates of other pods only use capacity a
    pass already counted, and on a busy cluster they are most events (the resync covers the rest)."""
    if kind == "DELETED" or placing.pod_gated(pod):
        return True
    return as_dict(pod.get("status")).get("phase") in ("Succeeded", "Failed")


def _requests_of(job: Mapping[str, Any]) -> Callable[[], Resources]:
    """One pod's requests of an admitted Job, read when the ledger first takes its decision."""
    return lambda: jobs.gang_requests(job)

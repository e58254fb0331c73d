"""The check's writes, off the pass: Workload check states, the AdmissionCheck's Active, Events on Workloads.

`CheckWrites(kube, metrics, workload_store, check_store, changed, check_leader, clock, crash_point,
identity)`: `.write(wl, held, work, *args)` runs a write on the check's pool, counting `held` in the
ledger until it returns; the works `.ready`, `.refuse`, `.apply`, `.activate`; `.read_ahead`,
`.known_indexed`, `.known_notes`, `.in_flight()`, `.writing(uid)`, `.due_at`, `.retain`, `.stop()`.
A 404 or 409 leaves the Workload to the next pass; another failure is decided again after a pause.
agent/admission/kueue/README.md, "Writes".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent.admission.cluster.store import Reflector
from agent.admission.engine.model import Gang, Placement
from agent.admission.gangs.job import job_indexed
from agent.admission.kueue import workloads
from agent.admission.kueue.holds import Held
from agent.admission.kueue.workloads import CONTROLLER_NAME, KUEUE_GROUP, KUEUE_VERSION, WorkloadSpecError
from agent.admission.report.events import ObjectEvents, ToldReasons, timestamp
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import as_dict, metadata_of, object_key
from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.leader import NotLeader

log = logging.getLogger(__name__)

WRITERS = 16  # decisions written at once
FAILED_WRITE_PAUSE_SECONDS = 1.0  # before a Workload whose write failed is decided again


class CheckWrites:
    """The check's writer pool and what runs on it (see README.md beside this module)."""

    def __init__(self, kube: KubeClient, metrics: AdmissionMetrics, workload_store: Reflector,
                 check_store: Reflector, changed: threading.Event, check_leader: Callable[[], None],
                 clock: Callable[[], float], crash_point: Callable[[str], None], identity: str) -> None:
        self.kube = kube
        self.metrics = metrics
        self.workload_store = workload_store
        self.check_store = check_store
        self.changed = changed
        self.check_leader = check_leader
        self.clock = clock
        self.crash_point = crash_point  # the kill tests' hook: "after-decision" after a Ready write
        self.due_at: dict[str, float] = {}  # Workload uid -> when (monotonic) it became due (logged)
        self._indexed: dict[str, bool] = {}  # owner Job uid -> completionMode Indexed (immutable)
        self._fetching: set[str] = set()  # owner Job uids being read ahead (read_ahead)
        # A pod group's LeaderWorkerSet or StatefulSet uid -> its templates' annotations by pod set
        # (workloads.owner_notes); being read: in _fetching.
        self._notes: dict[str, dict[str, dict[str, str]]] = {}
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="kueue-write")
        # Workload uid -> the ledger entries of the decision being written for it ([] for Retry and
        # Rejected); entries leave only after the write's response is in the store (see write).
        self._inflight: dict[str, list[Held]] = {}
        self._inflight_lock = threading.Lock()
        # Events on Workloads (Waiting, when its reason changes; Rejected), sent from a thread started
        # with the first one (under _events_lock); `_told`: the reason each Workload was last told.
        self.events = ObjectEvents(kube, identity, (workloads.API_VERSION, "Workload"),
                                   on_drop=metrics.events_dropped.inc)
        self._told = ToldReasons()
        self._events_lock = threading.Lock()
        self._events_started = False

    def stop(self) -> None:
        """Wait for the decisions being written; start no more."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._events_lock:
            if self._events_started:
                self.events.stop()

    def in_flight(self) -> dict[str, list[Held]]:
        """Workload uid -> the ledger entries of the decision being written for it, now."""
        with self._inflight_lock:
            return dict(self._inflight)

    def writing(self, uid: str) -> bool:
        """Whether a decision for Workload `uid` is being written (read without the lock, from the
        watch thread: a look, not a promise)."""
        return uid in self._inflight

    def known_indexed(self, wl: Mapping[str, Any]) -> bool:
        """Whether the Workload's owner Job is known to be Indexed (False while unknown)."""
        return self._indexed.get(workloads.owner_uid(wl) or "", False)

    def known_notes(self, wl: Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
        """The annotations of the owner's templates that Kueue left out of a pod group's Workload
        (`workloads.owner_notes`, by pod set): {} for any other Workload or an owner that could not be
        read, None while it is being read (started here; a pass follows when it is in)."""
        ref = workloads.group_owner(wl)
        if ref is None or workloads.owner_kind(wl) not in workloads.OWNER_TEMPLATES:
            return {}
        uid = str(ref.get("uid"))
        notes = self._notes.get(uid)
        if notes is None:
            self._read_owner(wl, ref)
        return notes

    def _read_owner(self, wl: Mapping[str, Any], ref: Mapping[str, Any]) -> None:
        uid = str(ref.get("uid"))
        if uid in self._fetching:
            return
        self._fetching.add(uid)
        group, _, version = str(ref.get("apiVersion")).rpartition("/")
        path = resource_path(group, version, str(ref.get("kind")).lower() + "s", str(ref.get("name")),
                             namespace=str(metadata_of(wl).get("namespace")))

        def run() -> None:
            notes: dict[str, dict[str, str]] = {}
            try:
                owner = self.kube.get(path, what=f"read the owner of Workload {object_key(wl)}")
                # Another object of that name (the owner deleted and made again) is not this one.
                notes = workloads.owner_notes(owner) if metadata_of(owner).get("uid") == uid else {}
            except Exception as exc:  # noqa: BLE001 - decided without them rather than never
                log.warning("Workload %s: reading its %s failed, its pods take the nodes' own NUMA "
                            "policy: %s", object_key(wl), ref.get("kind"), exc)
            finally:
                self._notes[uid] = notes
                self._fetching.discard(uid)
                self.changed.set()

        try:
            self._pool.submit(run)
        except RuntimeError:  # stopping
            self._fetching.discard(uid)

    def retain(self, uids: set[str], owners: set[str | None]) -> None:
        """Forget what is kept about Workloads not among `uids` and owners (Jobs, pod groups'
        LeaderWorkerSets and StatefulSets) not among `owners`."""
        for uid in [u for u in list(self.due_at) if u not in uids]:
            self.due_at.pop(uid, None)
        self._told.retain(uids)
        for uid in [u for u in list(self._indexed) if u not in owners]:
            self._indexed.pop(uid, None)
        for uid in [u for u in list(self._notes) if u not in owners]:
            self._notes.pop(uid, None)

    def read_ahead(self, wl: Mapping[str, Any]) -> None:
        """Read the owner Job's completion mode (or a pod group's owner's templates) on a writer while
        the Workload waits for its quota, so the Ready write that follows needs no Job GET first (see
        _owner_indexed) and the decision no owner read."""
        if not workloads.condition_true(wl, "Finished"):
            self.known_notes(wl)
        uid = workloads.owner_uid(wl)
        if (uid is None or uid in self._indexed or uid in self._fetching
                or workloads.condition_true(wl, "Finished")):
            return
        self._fetching.add(uid)

        def run() -> None:
            try:
                self._owner_indexed(wl)
            except Exception as exc:  # noqa: BLE001 - only a head start: the Ready write reads it again
                log.debug("Workload %s: reading its Job ahead failed: %s", object_key(wl), exc)
            finally:
                self._fetching.discard(uid)

        try:
            self._pool.submit(run)
        except RuntimeError:  # stopping
            self._fetching.discard(uid)

    def write(self, wl: Mapping[str, Any], held: list[Held], work: Callable[..., Any], *args: Any) -> None:
        """Run `work(*args)` on the check's writers, holding `held` in the ledger and keeping the
        Workload from being decided again until it returns."""
        uid = str(metadata_of(wl).get("uid"))
        with self._inflight_lock:
            self._inflight[uid] = held

        def run() -> None:
            failed = False
            try:
                work(*args)
            except Exception as exc:  # noqa: BLE001 - a failed write is decided again, not fatal
                if isinstance(exc, NotLeader):
                    log.info("Workload %s: lost the lease before the write", object_key(wl))
                else:
                    log.warning("Workload %s: writing the decision failed (decided again): %s",
                                object_key(wl), exc)
                    self.metrics.decisions.labels(result="error").inc()
                    time.sleep(FAILED_WRITE_PAUSE_SECONDS)  # a persistent failure must not spin the passes
                failed = True
            finally:
                # After the response is in the store (apply), so collect sees one or the other.
                with self._inflight_lock:
                    self._inflight.pop(uid, None)
            if failed:
                self.changed.set()  # decided again on the next pass

        try:
            self._pool.submit(run)
        except RuntimeError:  # stopping: nothing written, decided again by whoever leads next
            with self._inflight_lock:
                self._inflight.pop(uid, None)

    def refuse(self, wl: Mapping[str, Any], states: list[dict[str, Any]], result: str, why: str) -> None:
        """Write Retry (`result` waiting) or Rejected states, then say `why` in an Event on the Workload."""
        if self.apply(wl, states, result):
            self._tell(wl, result, why, str(states[0]["message"]))

    def _tell(self, wl: Mapping[str, Any], result: str, why: str, message: str) -> None:
        """An Event on the Workload: Rejected, or Waiting when its reason is not the one last told."""
        uid = str(metadata_of(wl).get("uid"))
        if not self._told.changed(uid, why) and result == "waiting":
            return
        with self._events_lock:
            if not self._events_started:
                self.events.start()
                self._events_started = True
        if result == "waiting":
            self.events.record(wl, "Normal", "Waiting", message)
        else:
            self.events.record(wl, "Warning", "Rejected", message)

    def ready(self, wl: Mapping[str, Any], checks: Sequence[str], gang: Gang, placement: Placement,
              now: str) -> None:
        """Write Ready with the podSetUpdates; Rejected when they cannot pin the pods (runs on a writer)."""
        try:
            updates = workloads.pod_set_updates(
                gang, placement, lambda name: workloads.slot_rule(wl, name, lambda: self._owner_indexed(wl)))
        except WorkloadSpecError as exc:
            self.refuse(wl, [workloads.rejected_state(c, str(exc), now) for c in checks],
                        "rejected", str(exc))
            return
        self.apply(wl, [workloads.ready_state(c, gang, placement, updates, now) for c in checks], "admitted")

    def _owner_indexed(self, wl: Mapping[str, Any]) -> bool:
        """Whether the Workload's pods carry completion indexes: its owner is an Indexed batch/v1 Job."""
        for ref in as_dict(metadata_of(wl)).get("ownerReferences") or []:
            ref = as_dict(ref)
            if not ref.get("controller"):
                continue
            uid = str(ref.get("uid"))
            if ref.get("apiVersion") != "batch/v1" or ref.get("kind") != "Job":
                return False
            if uid not in self._indexed:
                try:
                    job = self.kube.get(resource_path("batch", "v1", "jobs", str(ref.get("name")),
                                                      namespace=str(metadata_of(wl).get("namespace"))),
                                        what=f"read the Job of Workload {object_key(wl)}")
                except KubeAPIError as exc:
                    if exc.status != 404:
                        raise
                    return False
                if as_dict(metadata_of(job)).get("uid") != uid:
                    return False
                self._indexed[uid] = job_indexed(job)
            return self._indexed[uid]
        return False

    def apply(self, wl: Mapping[str, Any], states: list[dict[str, Any]], result: str | None) -> bool:
        """Server-side apply our check states onto the Workload's status; False when it moved on.
        `result` is the decision counted (None: a copy of one already counted)."""
        self.check_leader()
        meta = metadata_of(wl)
        path = resource_path(KUEUE_GROUP, KUEUE_VERSION, "workloads", str(meta.get("name")),
                             namespace=str(meta.get("namespace")), subresource="status")
        started = time.perf_counter()
        try:
            out = self.kube.apply(path, workloads.status_apply(wl, states), CONTROLLER_NAME,
                                  what=f"set {states[0]['name']} {states[0]['state']} on Workload "
                                       f"{object_key(wl)}")
        except KubeAPIError as exc:
            if exc.status not in (404, 409):
                raise
            if exc.status == 409:
                self.metrics.write_conflicts.inc()
            log.info("Workload %s: %s (decided again on the next pass)", object_key(wl), exc)
            return False
        self.workload_store.put(out)
        if result == "admitted":
            self.crash_point("after-decision")
        if result is not None:
            self.metrics.decisions.labels(result=result).inc()
        due = self.due_at.pop(str(meta.get("uid")), None)
        log.info("Workload %s: %s %s (%s written in %.2f s, %d writes in flight): %s", object_key(wl),
                 states[0]["name"], states[0]["state"],
                 "" if due is None else f"due {time.monotonic() - due:.2f} s ago,",
                 time.perf_counter() - started, len(self._inflight), states[0]["message"])
        return True

    def activate(self, ac: Mapping[str, Any]) -> None:
        """Set the AdmissionCheck `ac` (one of ours) Active."""
        self.check_leader()
        name = str(metadata_of(ac).get("name"))
        try:
            out = self.kube.apply(resource_path(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", name,
                                                subresource="status"),
                                  workloads.active_status(ac, timestamp(self.clock())), CONTROLLER_NAME,
                                  what=f"set AdmissionCheck {name} Active")
        except KubeAPIError as exc:
            if exc.status not in (404, 409):
                raise
            return
        self.check_store.put(out)
        log.info("AdmissionCheck %s: Active", name)

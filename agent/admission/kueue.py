"""The `topolet.io/topology-fit` Kueue AdmissionCheck, decided inside the controller's pass.

Public API:

- `KueueCheck(kube, changed, metrics, submit, check_leader, clock, guaranteed_policy, crash_point,
  identity)`: `.reflectors` (AdmissionChecks, Workloads, ResourceFlavors; the controller starts, stops
  and waits for them with its own), `.due` (set when a watch event shows a Workload waiting for our
  decision: the controller's next pass skips its debounce),
  `.collect(pods) -> Round`, `.decide(round, decide, left_out)` and `.stop()` (waits for the
  decisions being written).
- `Round`: what one pass knows of Kueue: `admitted` (the ledger's `(gang key, record, requests)` of
  every Ready Workload, one per pod set), `pod_slots` (pod uid -> (gang key, slot) for their pods) and
  `pending` (Workloads to decide, in the order Kueue reserved their quota).
- `kueue_served(kube) -> bool | None`: whether the API serves Kueue's v1beta2 to us (None: served but
  forbidden).

A pass (`agent.admission.controller`): `collect` keeps every AdmissionCheck whose controllerName is
ours at `Active=True` and reads the Workloads; the controller puts `admitted` into the view's ledger
next to its admitted Jobs (one ledger, so the two routes never double-book) and `pod_slots` into its
slot map; after its own queue it calls `decide` with the engine call it uses for Jobs (`place` then
`commit` on the same view).  Each decision is one server-side apply of `status.admissionChecks[<our
check>]` (field manager `topolet.io/topology-fit`) carrying the resourceVersion it was decided on:
Ready with podSetUpdates (`agent.admission.workloads`), Retry with requeueAfterSeconds, or Rejected.
When more than one check of ours is Pending on a Workload, the one decision sets them all; one still
Pending on a Ready Workload (added to its ClusterQueue later) gets the Ready state's copy.
Once a Retry or Rejected state is written, an Event on the Workload (`agent.admission.events`, as
`identity`) says why: Waiting (Normal, only when the reason differs from the last one told) or
Rejected (Warning).

Latency: a watch event that shows a Workload waiting for our decision sets `due`, and the controller
starts its next pass without the debounce it gives other changes.  The decisions are written on the
check's own writer pool, and the pass does not wait for them (a status write goes through Kueue's
webhook and may take a second on a busy API server), so a Workload whose check turns Pending
meanwhile is decided by the very next pass.  Until its write has
landed in the store, a Ready decision counts in the ledger from memory (the records the Ready state
will carry) and the Workload is not decided again; a failed write is forgotten and decided again.
Whether a Workload's Job is Indexed (which a pod set spread over several slots needs) is read once
per Job, ahead, while the Workload waits for its quota, so the Ready write needs no GET first.

Restart safety: the decision lives only in the Ready state's podSetUpdates, so the ledger is rebuilt
from the Workloads on the first pass (`workloads.records_of_state`).  A kill before the write leaves
the check Pending (decided again); after it, the Workload is Ready and holds its slots.  A stale
store makes the write fail (409) instead of deciding twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from agent.admission import jobs, placing, workloads
from agent.admission.events import ObjectEvents, timestamp
from agent.admission.metrics import AdmissionMetrics
from agent.admission.model import Gang, Placement, Refusal, Resources
from agent.admission.placing import AdmissionRecord
from agent.admission.store import Reflector, as_dict, metadata_of, object_key
from agent.admission.workloads import CONTROLLER_NAME, KUEUE_GROUP, KUEUE_VERSION, WorkloadSpecError
from agent.errors import KubeAPIError
from agent.kube.client import KubeClient, resource_path

log = logging.getLogger(__name__)

PODSET_LABEL = "kueue.x-k8s.io/podset"  # Kueue labels each pod with its pod set's name
WRITERS = 16  # decisions written at once
FAILED_WRITE_PAUSE_SECONDS = 1.0  # before a Workload whose write failed is decided again
Held = tuple[str, AdmissionRecord, Callable[[], Resources]]  # one pod set's entry in the ledger
HoldKey = tuple[str, str, str, bool, tuple[tuple[str, str], ...]]  # see KueueCheck._holds


@dataclass(frozen=True)
class Pending:
    """A Workload waiting for our decision: which of our checks (every one of ours that is Pending on
    it: one decision sets them all), and the gang read from it."""

    workload: dict[str, Any]
    checks: tuple[str, ...]
    gang: Gang | None
    error: str = ""


@dataclass(frozen=True)
class Round:
    """What one pass knows of Kueue (see the module docstring)."""

    admitted: list[Held]
    pod_slots: dict[str, tuple[str, str]]
    pending: list[Pending]


def kueue_served(kube: KubeClient) -> bool | None:
    """True when we may list Kueue's AdmissionChecks (v1beta2), False when the API does not serve them,
    None when it does but refuses us (no RBAC for them)."""
    try:
        kube.list(resource_path(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks"), {"limit": 1},
                  what="look for Kueue's AdmissionChecks")
    except KubeAPIError as exc:
        if exc.not_found:
            return False
        if exc.status == 403:
            return None
        raise
    return True


def _ledger_key(wl: Mapping[str, Any], pod_set: str) -> str:
    """The ledger's gang key of one pod set of a Workload (the ledger takes one request per gang)."""
    return f"{workloads.gang_key(wl)}/{pod_set}"


def _quota_time(wl: Mapping[str, Any]) -> str:
    for cond in as_dict(wl.get("status")).get("conditions") or []:
        if as_dict(cond).get("type") == "QuotaReserved":
            return str(as_dict(cond).get("lastTransitionTime") or "")
    return ""


class KueueCheck:
    """The check's store and its part of a pass (see the module docstring)."""

    def __init__(self, kube: KubeClient, changed: Any, metrics: AdmissionMetrics,
                 submit: Callable[..., Future[Any]], check_leader: Callable[[], None],
                 clock: Callable[[], float], guaranteed_policy: Callable[[], str],
                 crash_point: Callable[[str], None] = lambda step: None, identity: str = CONTROLLER_NAME
                 ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.submit = submit
        self.check_leader = check_leader
        self.clock = clock
        self.guaranteed_policy = guaranteed_policy
        self.crash_point = crash_point  # the kill tests' hook: "after-decision" after a Ready write
        self.checks = Reflector(kube, resource_path(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks"),
                                "AdmissionChecks", changed)
        self.workloads = Reflector(kube, resource_path(KUEUE_GROUP, KUEUE_VERSION, "workloads"),
                                   "Workloads", changed, matters=self._workload_event)
        # Set when a watch event shows a Workload waiting for our decision: the controller then starts
        # its pass without the debounce it gives other changes (Kueue's admission waits on us).
        self.due = threading.Event()
        self._names: tuple[str, ...] = ()  # our checks' names as the last pass read them
        self._due_at: dict[str, float] = {}  # Workload uid -> when (monotonic) it became due (logged)
        self.flavors = Reflector(kube, resource_path(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors"),
                                 "ResourceFlavors", changed)
        self.reflectors = (self.checks, self.workloads, self.flavors)
        self._indexed: dict[str, bool] = {}  # owner Job uid -> completionMode Indexed (immutable)
        self._fetching: set[str] = set()  # owner Job uids being read ahead (_read_ahead)
        self._unreadable: set[tuple[str, str]] = set()  # (uid, resourceVersion) logged once
        # A Ready Workload's ledger entries and pod slots (`_held_now`) by (uid, resourceVersion, check,
        # Job indexed, its pods' (uid, resourceVersion)): a pass on a big queue reads them from here.
        # `_holds_read` collects those read this pass, which replace `_holds` at its end.
        self._holds: dict[HoldKey, tuple[list[Held], dict[str, tuple[str, str]]]] = {}
        self._holds_read: dict[HoldKey, tuple[list[Held], dict[str, tuple[str, str]]]] = {}
        self.changed = changed
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="kueue-write")
        # Workload uid -> the ledger entries of the decision being written for it ([] for Retry and
        # Rejected); entries leave only after the write's response is in the store (see _write).
        self._inflight: dict[str, list[Held]] = {}
        self._inflight_lock = threading.Lock()
        # Events on Workloads (Waiting, when its reason changes; Rejected), sent from a thread started
        # with the first one; `_told`: Workload uid -> the reason it was last told (under _told_lock).
        self.events = ObjectEvents(kube, identity, (workloads.API_VERSION, "Workload"),
                                   on_drop=metrics.events_dropped.inc)
        self._told: dict[str, str] = {}
        self._told_lock = threading.Lock()
        self._events_started = False

    def stop(self) -> None:
        """Wait for the decisions being written; start no more."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._told_lock:
            if self._events_started:
                self.events.stop()

    # -- reading --------------------------------------------------------------------------------------

    def collect(self, pods: Sequence[Mapping[str, Any]]) -> Round:
        """Activate our AdmissionChecks; read the Ready Workloads' slots and the Workloads to decide."""
        checks = self.checks.snapshot()
        for ac in checks:
            if (as_dict(ac.get("spec")).get("controllerName") == CONTROLLER_NAME
                    and not workloads.check_active(ac)):
                self.check_leader()
                self.submit(self._activate, ac)
        names = workloads.our_checks(checks)
        self._names = names
        round_ = Round([], {}, [])
        if not names:
            return round_
        by_owner: dict[str, list[Mapping[str, Any]]] = {}
        for pod in pods:
            for ref in metadata_of(pod).get("ownerReferences") or []:
                ref = as_dict(ref)
                if ref.get("controller"):
                    by_owner.setdefault(str(ref.get("uid")), []).append(pod)
        flavors = {str(metadata_of(f).get("name")): as_dict(as_dict(f.get("spec")).get("nodeLabels"))
                   for f in self.flavors.snapshot()}
        # In flight first, then the store: a write that lands in between is then counted from memory
        # (its store entry may be either version), never from neither.
        with self._inflight_lock:
            inflight = dict(self._inflight)
        every = sorted(self.workloads.snapshot(), key=object_key)
        policy: str | None = None  # read once a pass, when needed: it reads every NRT
        for wl in every:
            if str(metadata_of(wl).get("uid")) in inflight:
                round_.admitted.extend(inflight[str(metadata_of(wl).get("uid"))])
                continue
            held = workloads.holding(wl, names)
            ours = workloads.checks_to_decide(wl, names)
            if held is not None:
                self._due_at.pop(str(metadata_of(wl).get("uid")), None)  # (a late event of its Pending)
                entries = self._hold(wl, held, by_owner.get(workloads.owner_uid(wl) or "", []), round_)
                if ours:
                    self._copy_ready(wl, held, ours, entries)
                continue
            if not ours:
                if any(workloads.check_state(wl, name) is not None for name in names):
                    self._read_ahead(wl)
                continue
            try:
                policy = self.guaranteed_policy() if policy is None else policy
                gang = workloads.gang_from_workload(wl, flavors, policy)
                round_.pending.append(Pending(wl, ours, gang))
            except WorkloadSpecError as exc:
                round_.pending.append(Pending(wl, ours, None, str(exc)))
        live = {(str(metadata_of(wl).get("uid")), str(metadata_of(wl).get("resourceVersion")))
                for wl in every}
        self._unreadable &= live  # bounded by the Workloads there are
        self._holds, self._holds_read = self._holds_read, {}
        uids = {uid for uid, _ in live}
        for uid in [u for u in list(self._due_at) if u not in uids]:
            self._due_at.pop(uid, None)
        with self._told_lock:
            self._told = {uid: why for uid, why in self._told.items() if uid in uids}
        owners = {workloads.owner_uid(wl) for wl in every}
        for uid in [u for u in list(self._indexed) if u not in owners]:
            self._indexed.pop(uid, None)
        # First come, first served among those Kueue already gave quota to.
        round_.pending.sort(key=lambda p: (_quota_time(p.workload), object_key(p.workload)))
        return round_

    def _workload_event(self, kind: str, wl: Mapping[str, Any]) -> bool:
        """Every Workload event calls for a pass; one that leaves a Workload waiting for our decision
        also sets `due` (runs on the watch thread)."""
        if kind != "DELETED" and self._names and workloads.to_decide(wl, self._names) is not None:
            uid = str(metadata_of(wl).get("uid"))
            if uid not in self._inflight:  # (its decision is being written: no pass decides it now)
                self._due_at.setdefault(uid, time.monotonic())
                self.due.set()
        return True

    def _read_ahead(self, wl: Mapping[str, Any]) -> None:
        """Read the owner Job's completion mode on a writer while the Workload waits for its quota, so
        the Ready write that follows needs no Job GET first (see _owner_indexed)."""
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

    def _hold(self, wl: dict[str, Any], check: str, pods: list[Mapping[str, Any]], round_: Round
              ) -> list[Held]:
        """Add a Ready Workload's ledger entries (returned) and its pods' slots to the round: worked out
        again only when the Workload, one of its pods or what is known of its Job changed (`_holds`)."""
        meta = metadata_of(wl)
        indexed = self._indexed.get(workloads.owner_uid(wl) or "", False)
        version = (str(meta.get("uid")), str(meta.get("resourceVersion")), check, indexed,
                   tuple(sorted((str(metadata_of(p).get("uid")), str(metadata_of(p).get("resourceVersion")))
                                for p in pods)))
        held = self._holds.get(version)
        if held is None:
            held = self._held_now(wl, check, pods, indexed)
        self._holds_read[version] = held
        round_.admitted.extend(held[0])
        round_.pod_slots.update(held[1])
        return held[0]

    def _copy_ready(self, wl: Mapping[str, Any], held: str, checks: tuple[str, ...], entries: list[Held]
                    ) -> None:
        """Set our other checks that are still Pending on a Ready Workload (one added to its ClusterQueue
        later) to the Ready state `held` carries: the same pods on the same slots, so Kueue's merge of
        their podSetUpdates agrees and the ledger sees one decision."""
        def ours(name: str) -> dict[str, Any]:
            state = workloads.check_state(wl, held) or {}
            return {k: state[k] for k in ("state", "message", "lastTransitionTime", "podSetUpdates")
                    if k in state} | {"name": name}

        # The apply restates the Ready ones too: fields of ours left out of an apply would be dropped.
        ready = [n for n in self._names if as_dict(workloads.check_state(wl, n)).get("state") == "Ready"]
        self.check_leader()
        self._write(wl, entries, self._apply, wl, [ours(n) for n in sorted({*ready, *checks})], None)

    def _held_now(self, wl: dict[str, Any], check: str, pods: list[Mapping[str, Any]], indexed: bool
                  ) -> tuple[list[Held], dict[str, tuple[str, str]]]:
        """A Ready Workload's ledger entries, and the slot each of its live pods holds (pod uid -> (gang
        key, slot)); none when its state cannot be read (said once per Workload version)."""
        state = workloads.check_state(wl, check) or {}
        try:
            records = workloads.records_of_state(wl, state)
        except WorkloadSpecError as exc:
            version = (str(metadata_of(wl).get("uid")), str(metadata_of(wl).get("resourceVersion")))
            if version not in self._unreadable:
                self._unreadable.add(version)
                log.warning("Workload %s: %s; its capacity is not counted", object_key(wl), exc)
            return [], {}
        entries = _entries(wl, records)
        slots: dict[str, tuple[str, str]] = {}
        for key, record, _ in entries:
            pod_set = key.rsplit("/", 1)[1]
            mine = pods if len(records) == 1 else [
                p for p in pods if as_dict(metadata_of(p).get("labels")).get(PODSET_LABEL) == pod_set]
            assignment = placing.assign_slots(record.slots, mine, indexed)
            slots.update({uid: (key, str(slot)) for uid, slot in assignment.held.items()})
        return entries, slots

    # -- deciding -------------------------------------------------------------------------------------

    def decide(self, round_: Round, decide: Callable[[Gang], Placement | Refusal],
               left_out: Mapping[str, str]) -> None:
        """Decide each pending Workload on the pass's view and send its state (on the check's writers,
        not waited for: see the module docstring)."""
        for p in round_.pending:
            now = timestamp(self.clock())
            if p.gang is None:
                why = f"unreadable: {p.error}"
                self._send(p, "rejected", [workloads.rejected_state(c, why, now) for c in p.checks], why)
                continue
            result = decide(p.gang)
            if isinstance(result, Placement):
                self.check_leader()
                self._write(p.workload, _held(p, result, now), self._ready, p, result, now)
            elif result.kind == "never" and not left_out:
                why = result.reason
                self._send(p, "rejected", [workloads.rejected_state(c, why, now) for c in p.checks], why)
            else:
                reason = result.reason
                if result.kind == "never":
                    # "Never" counts only the usable nodes: one left out may come back.
                    reason = f"{reason}; {len(left_out)} nodes are left out now"
                states = [workloads.retry_state(c, reason, workloads.retry_count(p.workload, c), now)
                          for c in p.checks]
                self._send(p, "waiting", states, reason)

    def _send(self, p: Pending, result: str, states: list[dict[str, Any]], why: str) -> None:
        """Write Retry (`result` waiting) or Rejected states, then say `why` in an Event on the Workload."""
        self.check_leader()
        self._write(p.workload, [], self._refuse, p.workload, states, result, why)

    def _refuse(self, wl: Mapping[str, Any], states: list[dict[str, Any]], result: str, why: str) -> None:
        if self._apply(wl, states, result):
            self._tell(wl, result, why, str(states[0]["message"]))

    def _tell(self, wl: Mapping[str, Any], result: str, why: str, message: str) -> None:
        """An Event on the Workload: Rejected, or Waiting when its reason is not the one last told."""
        uid = str(metadata_of(wl).get("uid"))
        with self._told_lock:
            if result == "waiting" and self._told.get(uid) == why:
                return
            self._told[uid] = why
            if not self._events_started:
                self.events.start()
                self._events_started = True
        if result == "waiting":
            self.events.record(wl, "Normal", "Waiting", message)
        else:
            self.events.record(wl, "Warning", "Rejected", message)

    def _write(self, wl: Mapping[str, Any], held: list[Held], work: Callable[..., Any], *args: Any) -> None:
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
                from agent.admission.controller import NotLeader  # (the controller imports this module)

                if isinstance(exc, NotLeader):
                    log.info("Workload %s: lost the lease before the write", object_key(wl))
                else:
                    log.warning("Workload %s: writing the decision failed (decided again): %s",
                                object_key(wl), exc)
                    self.metrics.decisions.labels(result="error").inc()
                    time.sleep(FAILED_WRITE_PAUSE_SECONDS)  # a persistent failure must not spin the passes
                failed = True
            finally:
                # After the response is in the store (_apply), so collect sees one or the other.
                with self._inflight_lock:
                    self._inflight.pop(uid, None)
            if failed:
                self.changed.set()  # decided again on the next pass

        try:
            self._pool.submit(run)
        except RuntimeError:  # stopping: nothing written, decided again by whoever leads next
            with self._inflight_lock:
                self._inflight.pop(uid, None)

    def _ready(self, p: Pending, placement: Placement, now: str) -> None:
        """Write Ready with the podSetUpdates; Rejected when they cannot pin the pods (runs on a writer)."""
        assert p.gang is not None
        try:
            updates = workloads.pod_set_updates(p.gang, placement, lambda _: self._owner_indexed(p.workload))
        except WorkloadSpecError as exc:
            self._refuse(p.workload, [workloads.rejected_state(c, str(exc), now) for c in p.checks],
                         "rejected", str(exc))
            return
        self._apply(p.workload, [workloads.ready_state(c, p.gang, placement, updates, now) for c in p.checks],
                    "admitted")

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
                self._indexed[uid] = jobs.job_indexed(job)
            return self._indexed[uid]
        return False

    def _apply(self, wl: Mapping[str, Any], states: list[dict[str, Any]], result: str | None) -> bool:
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
        self.workloads.put(out)
        if result == "admitted":
            self.crash_point("after-decision")
        if result is not None:
            self.metrics.decisions.labels(result=result).inc()
        due = self._due_at.pop(str(meta.get("uid")), None)
        log.info("Workload %s: %s %s (%s written in %.2f s, %d writes in flight): %s", object_key(wl),
                 states[0]["name"], states[0]["state"],
                 "" if due is None else f"due {time.monotonic() - due:.2f} s ago,",
                 time.perf_counter() - started, len(self._inflight), states[0]["message"])
        return True

    def _activate(self, ac: Mapping[str, Any]) -> None:
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
        self.checks.put(out)
        log.info("AdmissionCheck %s: Active", name)


def _entries(wl: Mapping[str, Any], records: Mapping[str, AdmissionRecord]) -> list[Held]:
    """The ledger entries of a Workload's decision, one per pod set."""
    templates = {str(as_dict(ps).get("name")): as_dict(as_dict(ps).get("template"))
                 for ps in as_dict(wl.get("spec")).get("podSets") or []}
    return [(_ledger_key(wl, pod_set), record,
             partial(jobs.gang_requests, {"spec": {"template": templates.get(pod_set, {})}}))
            for pod_set, record in records.items()]


def _held(p: Pending, placement: Placement, now: str) -> list[Held]:
    """The ledger entries the Ready state for `placement` will carry once written (the same records
    `records_of_state` reads back from it); none when it cannot be written (Rejected instead)."""
    assert p.gang is not None
    try:
        updates = workloads.pod_set_updates(p.gang, placement, lambda _: True)
        state = workloads.ready_state(p.checks[0], p.gang, placement, updates, now)
        return _entries(p.workload, workloads.records_of_state(p.workload, state))
    except WorkloadSpecError:
        return []

"""The `topolet.io/topology-fit` Kueue AdmissionCheck, decided inside the controller's pass.

`KueueCheck(kube, changed, metrics, submit, check_leader, clock, crash_point, identity)`:
`.reflectors`, `.due`, `.collect(pods, limit_defaults) -> Round`, `.decide(round, decide, left_out)`,
`.stop()`; `Round` (admitted, pod_slots, pending, refused); `kueue_served(kube)`.  Ready Workloads
join the one ledger with the admitted Jobs, so the routes never double-book; each decision is one
server-side apply carrying the resourceVersion it was decided on, so a stale store never decides twice.
The pass, latency and restart safety: agent/admission/kueue/README.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agent.admission.cluster.store import Reflector
from agent.admission.engine.model import Gang, Placement, Refusal
from agent.admission.gangs.jobset import JOBSET, TRAINJOB, controller_uid, pods_of_jobsets
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.slots import pods_by_owner
from agent.admission.kueue import tas, workloads
from agent.admission.kueue.holds import (
    MPI_JOB_NAME_LABEL,
    MPIJOB,
    Held,
    Holds,
    Refused,
    group_members,
    ready_entries,
)
from agent.admission.kueue.workloads import CONTROLLER_NAME, KUEUE_GROUP, KUEUE_VERSION, WorkloadSpecError
from agent.admission.kueue.writes import CheckWrites
from agent.admission.report.events import timestamp
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import as_dict, metadata_of, object_key
from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.leader import NotLeader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pending:
    """A Workload waiting for our decision: which of our checks (every one of ours that is Pending on
    it: one decision sets them all), the gang read from it, and its namespace's LimitRange defaults
    it was read with."""

    workload: dict[str, Any]
    checks: tuple[str, ...]
    gang: Gang | None
    error: str = ""
    limit_defaults: ContainerDefaults = NO_DEFAULTS


@dataclass(frozen=True)
class Round:
    """What one pass knows of Kueue (see README.md beside this module)."""

    admitted: list[Held]
    pod_slots: dict[str, tuple[str, str]]
    pending: list[Pending]
    refused: list[Refused] = field(default_factory=list)


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


def _quota_time(wl: Mapping[str, Any]) -> str:
    for cond in as_dict(wl.get("status")).get("conditions") or []:
        if as_dict(cond).get("type") == "QuotaReserved":
            return str(as_dict(cond).get("lastTransitionTime") or "")
    return ""


class KueueCheck:
    """The check's store and its part of a pass (see README.md beside this module)."""

    def __init__(self, kube: KubeClient, changed: Any, metrics: AdmissionMetrics,
                 submit: Callable[..., Future[Any]], check_leader: Callable[[], None],
                 clock: Callable[[], float],
                 crash_point: Callable[[str], None] = lambda step: None, identity: str = CONTROLLER_NAME
                 ) -> None:
        self.submit = submit
        self.check_leader = check_leader
        self.clock = clock
        self.metrics = metrics
        self.checks = Reflector(kube, resource_path(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks"),
                                "AdmissionChecks", changed)
        self.workloads = Reflector(kube, resource_path(KUEUE_GROUP, KUEUE_VERSION, "workloads"),
                                   "Workloads", changed, matters=self._workload_event,
                                   on_invalid=metrics.invalid_objects.labels(kind="Workload").inc)
        # Set when a watch event shows a Workload waiting for our decision: the controller then starts
        # its pass without the debounce it gives other changes (Kueue's admission waits on us).
        self.due = threading.Event()
        self._names: tuple[str, ...] = ()  # our checks' names as the last pass read them
        self.flavors = Reflector(kube, resource_path(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors"),
                                 "ResourceFlavors", changed)
        self.reflectors = (self.checks, self.workloads, self.flavors)
        self.holds = Holds()  # the Ready Workloads' ledger entries and pod slots, by version
        self.writes = CheckWrites(kube, metrics, self.workloads, self.checks, changed, check_leader, clock,
                                  crash_point, identity)

    def stop(self) -> None:
        """Wait for the decisions being written; start no more."""
        self.writes.stop()

    # -- reading --------------------------------------------------------------------------------------

    def collect(self, pods: Sequence[Mapping[str, Any]],
                limit_defaults: Mapping[str, ContainerDefaults] | None = None,
                jobsets: Sequence[Mapping[str, Any]] = ()) -> Round:
        """Activate our AdmissionChecks; read the Ready Workloads' slots and the Workloads to decide,
        each with its namespace's `limit_defaults` (namespace -> LimitRange container defaults);
        `jobsets`, the cluster's JobSets, tell a JobSet's or a TrainJob's pods apart."""
        checks = self.checks.snapshot()
        for ac in checks:
            if (as_dict(ac.get("spec")).get("controllerName") == CONTROLLER_NAME
                    and not workloads.check_active(ac)):
                self.check_leader()
                self.submit(self.writes.activate, ac)
        names = workloads.our_checks(checks)
        self._names = names
        round_ = Round([], {}, [])
        if not names:
            return round_
        by_owner = pods_by_owner(pods)
        by_uid = {str(metadata_of(p).get("uid")): p for p in pods}
        shapes = _jobsets_by_owner(jobsets)
        by_jobset = pods_of_jobsets(pods)
        by_mpijob: dict[tuple[str, str], list[Mapping[str, Any]]] = {}  # an MPIJob's launcher, by its name
        for p in pods:
            name = as_dict(metadata_of(p).get("labels")).get(MPI_JOB_NAME_LABEL)
            if isinstance(name, str):
                by_mpijob.setdefault((str(metadata_of(p).get("namespace")), name), []).append(p)
        groups = workloads.pod_group_notes(pods)
        flavors = {str(metadata_of(f).get("name")): as_dict(as_dict(f.get("spec")).get("nodeLabels"))
                   for f in self.flavors.snapshot()}
        # In flight first, then the store: a write that lands in between is then counted from memory
        # (its store entry may be either version), never from neither.
        inflight = self.writes.in_flight()
        every = sorted(self.workloads.snapshot(), key=object_key)
        defaults = limit_defaults or {}
        for wl in every:
            # One Workload that cannot be read costs only itself: logged, counted, skipped.
            try:
                self._collect_one(wl, names, by_owner, by_uid, groups, flavors, inflight, round_, shapes,
                                  by_jobset, by_mpijob,
                                  defaults.get(str(metadata_of(wl).get("namespace")), NO_DEFAULTS))
            except Exception as exc:  # noqa: BLE001 - whatever a tenant wrote, the pass goes on
                self._unreadable(wl, exc)
        live = {(str(metadata_of(wl).get("uid")), str(metadata_of(wl).get("resourceVersion")))
                for wl in every}
        self.holds.end_pass(live)
        self.writes.retain({uid for uid, _ in live},
                           {workloads.owner_uid(wl) for wl in every}
                           | {str(as_dict(workloads.group_owner(wl)).get("uid")) for wl in every})
        # First come, first served among those Kueue already gave quota to.
        round_.pending.sort(key=lambda p: (_quota_time(p.workload), object_key(p.workload)))
        return round_

    def _collect_one(self, wl: dict[str, Any], names: tuple[str, ...],
                     by_owner: Mapping[tuple[str, str], list[Mapping[str, Any]]],
                     by_uid: Mapping[str, Mapping[str, Any]],
                     groups: Mapping[tuple[str, str], dict[str, dict[str, str]]],
                     flavors: Mapping[str, Mapping[str, Any]], inflight: Mapping[str, list[Held]],
                     round_: Round,
                     shapes: Mapping[tuple[str, str], Mapping[str, Any]],
                     by_jobset: Mapping[tuple[str, str], list[Mapping[str, Any]]],
                     by_mpijob: Mapping[tuple[str, str], list[Mapping[str, Any]]],
                     limit_defaults: ContainerDefaults) -> None:
        """One Workload into `round_`: the slots it holds, or a decision to make (its pods created where
        the LimitRanges fill in `limit_defaults`)."""
        if str(metadata_of(wl).get("uid")) in inflight:
            round_.admitted.extend(inflight[str(metadata_of(wl).get("uid"))])
            return
        held = workloads.holding(wl, names)
        ours = workloads.checks_to_decide(wl, names)
        if held is not None:
            self.writes.due_at.pop(str(metadata_of(wl).get("uid")), None)  # (a late event of its Pending)
            owner = (str(metadata_of(wl).get("namespace")), workloads.owner_uid(wl) or "")
            # A Job's pods by their controller; a pod group's, the members its Workload names.
            members = group_members(wl)
            mine = [by_uid[u] for u in sorted(members) if u in by_uid] if members else by_owner.get(owner, [])
            # A JobSet's (a TrainJob's JobSet's) pods by the JobSet they are labelled with.
            js = shapes.get(owner) if workloads.owner_kind(wl) in (JOBSET, TRAINJOB) else None
            if js is not None:
                mine = by_jobset.get((owner[0], str(metadata_of(js).get("uid"))), [])
            elif workloads.owner_kind(wl) == MPIJOB:  # its workers, and its launcher (a Job's pod)
                name = str((workloads.controller_ref(wl) or {}).get("name"))
                uids = {str(metadata_of(p).get("uid")) for p in mine}
                mine = [*mine, *(p for p in by_mpijob.get((owner[0], name), [])
                                 if str(metadata_of(p).get("uid")) not in uids)]
            entries, slots, refused = self.holds.of(wl, held, list(mine), self.writes.known_indexed(wl),
                                                    limit_defaults, js)
            round_.admitted.extend(entries)
            round_.pod_slots.update(slots)
            round_.refused.extend(refused)
            if ours:
                self._copy_ready(wl, held, ours, entries)
            return
        if not ours:
            if any(workloads.check_state(wl, name) is not None for name in names):
                self.writes.read_ahead(wl)
            return
        notes = self.writes.known_notes(wl)
        if notes is None:  # a pod group's owner being read (its NUMA policy): decided on the next pass
            return
        if workloads.owner_kind(wl) == workloads.POD_OWNER:  # a plain pod group's: from its pods
            notes = groups.get((str(metadata_of(wl).get("namespace")), str(metadata_of(wl).get("name"))), {})
        try:
            gang = workloads.gang_from_workload(wl, flavors, limit_defaults=limit_defaults,
                                                template_notes=notes)
            round_.pending.append(Pending(wl, ours, gang, limit_defaults=limit_defaults))
        except WorkloadSpecError as exc:
            round_.pending.append(Pending(wl, ours, None, str(exc), limit_defaults))

    def _unreadable(self, wl: Mapping[str, Any], exc: Exception) -> None:
        """A Workload the pass failed on: logged with its trace, counted, skipped; losing the lease
        ends the pass."""
        if isinstance(exc, NotLeader):
            raise exc
        self.metrics.invalid_objects.labels(kind="Workload").inc()
        log.error("Workload %s skipped: %s", object_key(wl), exc, exc_info=True)

    def _workload_event(self, kind: str, wl: Mapping[str, Any]) -> bool:
        """Every Workload event calls for a pass; one that leaves a Workload waiting for our decision
        also sets `due` (runs on the watch thread)."""
        if kind != "DELETED" and self._names and workloads.to_decide(wl, self._names) is not None:
            uid = str(metadata_of(wl).get("uid"))
            if not self.writes.writing(uid):  # (its decision is being written: no pass decides it now)
                self.writes.due_at.setdefault(uid, time.monotonic())
                self.due.set()
        return True

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
        self.writes.write(wl, entries, self.writes.apply, wl, [ours(n) for n in sorted({*ready, *checks})],
                          None)

    # -- deciding -------------------------------------------------------------------------------------

    def decide(self, round_: Round, decide: Callable[[Gang], Placement | Refusal],
               left_out: Mapping[str, str]) -> None:
        """Decide each pending Workload on the pass's view and send its state (on the check's writers,
        not waited for: see README.md beside this module)."""
        for p in round_.pending:
            try:
                self._decide_one(p, decide, left_out)
            except Exception as exc:  # noqa: BLE001 - one Workload's decision costs only itself
                self._unreadable(p.workload, exc)

    def _decide_one(self, p: Pending, decide: Callable[[Gang], Placement | Refusal],
                    left_out: Mapping[str, str]) -> None:
        """Decide one Workload and send its state."""
        now = timestamp(self.clock())
        if p.gang is None:
            why = f"unreadable: {p.error}"
            self._send(p, "rejected", [workloads.rejected_state(c, why, now) for c in p.checks], why)
            return
        result = decide(p.gang)
        if isinstance(result, Placement):
            self.check_leader()
            self.writes.write(p.workload, ready_entries(p.workload, p.checks[0], p.gang, result, now,
                                                        p.limit_defaults),
                              self.writes.ready, p.workload, p.checks, p.gang, result, now)
            return
        # A gang that never fits inside its TAS assignment may fit inside the next one.
        by_tas = result.kind == "never" and tas.placed_by_tas(p.gang)
        if result.kind == "never" and not left_out and not by_tas:
            why = result.reason
            self._send(p, "rejected", [workloads.rejected_state(c, why, now) for c in p.checks], why)
        else:
            reason = result.reason
            if by_tas:
                reason = f"{reason} inside its Topology Aware Scheduling assignment"
            elif result.kind == "never":
                # "Never" counts only the usable nodes: one left out may come back.
                reason = f"{reason}; {len(left_out)} nodes are left out now"
            states = [workloads.retry_state(c, reason, workloads.retry_count(p.workload, c), now)
                      for c in p.checks]
            self._send(p, "waiting", states, reason)

    def _send(self, p: Pending, result: str, states: list[dict[str, Any]], why: str) -> None:
        """Write Retry (`result` waiting) or Rejected states, then say `why` in an Event on the Workload."""
        self.check_leader()
        self.writes.write(p.workload, [], self.writes.refuse, p.workload, states, result, why)


def _jobsets_by_owner(jobsets: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Each JobSet by (namespace, its uid) and, for a TrainJob's, by (namespace, the TrainJob's uid): the
    owner a Workload names."""
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for js in jobsets:
        meta = metadata_of(js)
        ns = str(meta.get("namespace"))
        out[(ns, str(meta.get("uid")))] = js
        trainjob = controller_uid(js, TRAINJOB)
        if trainjob is not None:
            out[(ns, trainjob)] = js
    return out

"""What each Ready Workload holds in the ledger: its entries, one per pod set, and its pods' slots.

Public API:

- `Held`: one pod set's ledger entry, `(gang key, AdmissionRecord, requests)`, where `requests()`
  gives one pod's requests; `PODSET_LABEL` (Kueue's label of a pod's pod set).
- `Holds()`: `.of(wl, check, pods, indexed) -> (entries, pod slots)`: a Ready Workload's ledger entries
  and the slot each of its live pods holds (pod uid -> (gang key, slot)), worked out again only when
  the Workload, one of its pods or what is known of its Job changed; none when its Ready state
  cannot be read (said once per Workload version).  `.end_pass(live)` keeps what this pass read, and
  the Workload versions `(uid, resourceVersion)` in `live`.
- `entries(wl, records)`: the ledger entries of a Workload's decision; `ready_entries(wl, check,
  gang, placement, now)`: the ones the Ready state for `placement` will carry once written.

Pure: no I/O.  The ledger keys a Workload's pod set `workload:<namespace>/<name>/<pod set>`
(`workloads.gang_key`): the ledger takes one request per gang.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from agent.admission.engine.model import Gang, Placement, Resources
from agent.admission.gangs.job import gang_requests
from agent.admission.gangs.record import AdmissionRecord
from agent.admission.gangs.slots import assign_slots
from agent.admission.kueue import workloads
from agent.admission.kueue.workloads import WorkloadSpecError
from agent.kube.objects import as_dict, metadata_of, object_key

log = logging.getLogger(__name__)

PODSET_LABEL = "kueue.x-k8s.io/podset"  # Kueue labels each pod with its pod set's name
Held = tuple[str, AdmissionRecord, Callable[[], Resources]]  # one pod set's entry in the ledger
# A Ready Workload's (uid, resourceVersion, check, Job indexed, its pods' (uid, resourceVersion)).
HoldKey = tuple[str, str, str, bool, tuple[tuple[str, str], ...]]


class Holds:
    """The Ready Workloads' ledger entries and pod slots by version: a pass on a big queue reads them
    from here (see the module docstring)."""

    def __init__(self) -> None:
        # `_read` collects those read this pass, which replace `_held` at its end.
        self._held: dict[HoldKey, tuple[list[Held], dict[str, tuple[str, str]]]] = {}
        self._read: dict[HoldKey, tuple[list[Held], dict[str, tuple[str, str]]]] = {}
        self._unreadable: set[tuple[str, str]] = set()  # (uid, resourceVersion) logged once

    def of(self, wl: dict[str, Any], check: str, pods: list[Mapping[str, Any]], indexed: bool
           ) -> tuple[list[Held], dict[str, tuple[str, str]]]:
        """The Workload's ledger entries and its pods' slots, held under our Ready `check`."""
        meta = metadata_of(wl)
        version = (str(meta.get("uid")), str(meta.get("resourceVersion")), check, indexed,
                   tuple(sorted((str(metadata_of(p).get("uid")), str(metadata_of(p).get("resourceVersion")))
                                for p in pods)))
        held = self._held.get(version)
        if held is None:
            held = self._now(wl, check, pods, indexed)
        self._read[version] = held
        return held

    def end_pass(self, live: set[tuple[str, str]]) -> None:
        """Keep what this pass read, and the unreadable Workload versions still `live`."""
        self._unreadable &= live  # bounded by the Workloads there are
        self._held, self._read = self._read, {}

    def _now(self, wl: dict[str, Any], check: str, pods: list[Mapping[str, Any]], indexed: bool
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
        held = entries(wl, records)
        slots: dict[str, tuple[str, str]] = {}
        for key, record, _ in held:
            pod_set = key.rsplit("/", 1)[1]
            mine = pods if len(records) == 1 else [
                p for p in pods if as_dict(metadata_of(p).get("labels")).get(PODSET_LABEL) == pod_set]
            assignment = assign_slots(record.slots, mine, indexed)
            slots.update({uid: (key, str(slot)) for uid, slot in assignment.held.items()})
        return held, slots


def _ledger_key(wl: Mapping[str, Any], pod_set: str) -> str:
    """The ledger's gang key of one pod set of a Workload (the ledger takes one request per gang)."""
    return f"{workloads.gang_key(wl)}/{pod_set}"


def entries(wl: Mapping[str, Any], records: Mapping[str, AdmissionRecord]) -> list[Held]:
    """The ledger entries of a Workload's decision, one per pod set."""
    templates = {str(as_dict(ps).get("name")): as_dict(as_dict(ps).get("template"))
                 for ps in as_dict(wl.get("spec")).get("podSets") or []}
    return [(_ledger_key(wl, pod_set), record,
             partial(gang_requests, {"spec": {"template": templates.get(pod_set, {})}}))
            for pod_set, record in records.items()]


def ready_entries(wl: Mapping[str, Any], check: str, gang: Gang, placement: Placement, now: str
                  ) -> list[Held]:
    """The ledger entries the Ready state for `placement` will carry once written (the same records
    `records_of_state` reads back from it); none when it cannot be written (Rejected instead)."""
    try:
        updates = workloads.pod_set_updates(gang, placement, lambda _: True)
        state = workloads.ready_state(check, gang, placement, updates, now)
        return entries(wl, workloads.records_of_state(wl, state))
    except WorkloadSpecError:
        return []

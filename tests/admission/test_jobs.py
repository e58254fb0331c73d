"""Job -> Gang (agent.admission.gangs.job), the admission record (gangs.record), the slots (gangs.slots) and
the patch bodies (agent.admission.jobs.patches), as tables."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.admission.engine.model import NodeSelectorRequirement, Resources, Toleration
from agent.admission.gangs.job import (
    ADMISSION_ANNOTATION,
    GATE,
    HOSTNAME_LABEL,
    NUMA_ZONE_ANNOTATION,
    JobSpecError,
    gang_from_job,
)
from agent.admission.gangs.record import (
    PLACEMENTS_ANNOTATION,
    PLACEMENTS_MAX_CHARS,
    AdmissionRecord,
    SlotPlacement,
    decode_record,
    placements_value,
    record_of,
)
from agent.admission.gangs.slots import assign_slots
from agent.admission.jobs.jobread import gone_nodes
from agent.admission.jobs.patches import (
    BY_INDEX_LABEL,
    decision_patch,
    job_started,
    lost_patch,
    pod_patch,
    requeue_patch,
    restart_patch,
    still_undecided,
    unpin_patch,
)

GI = 1 << 30


def _job(*, parallelism: Any = 2, completions: Any = None, indexed: bool = False,
         containers: list[dict[str, Any]] | None = None, init: list[dict[str, Any]] | None = None,
         template_annotations: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         pod_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": parallelism, "suspend": True}
    if completions is not None:
        spec["completions"] = completions
    if indexed:
        spec["completionMode"] = "Indexed"
    ps: dict[str, Any] = {"restartPolicy": "Never",
                          "containers": containers if containers is not None else [_c("2", "1Gi")]}
    if init:
        ps["initContainers"] = init
    ps.update(pod_spec or {})
    spec["template"] = {"metadata": {"annotations": template_annotations or {}}, "spec": ps}
    return {"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "7",
                         "annotations": annotations or {}},
            "spec": spec}


def _c(cpu: str | None = None, memory: str | None = None, *, limits: bool = False,
       extra: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None} | (extra or {})
    res = {"requests": req, "limits": dict(req)} if limits else {"requests": req}
    return {"name": "c", "image": "x", "resources": res, **kw}


GANGS = [
    # (what, job, expected count, expected Resources, expected policy)
    ("parallelism is the count", _job(parallelism=3), 3, Resources(cpu_milli=2000, memory=GI), "none"),
    ("indexed: min(parallelism, completions)", _job(parallelism=8, completions=4, indexed=True), 4,
     Resources(cpu_milli=2000, memory=GI), "none"),
    ("containers add up, millicores round up",
     _job(containers=[_c("500m", "1Gi"), _c("0.0001", "512Mi")]), 2,
     Resources(cpu_milli=501, memory=GI + GI // 2), "none"),
    ("an init container bigger than the containers sets the peak",
     _job(init=[_c("6", "1Gi")]), 2, Resources(cpu_milli=6000, memory=GI), "none"),
    ("a sidecar adds to the containers",
     _job(init=[_c("1", "1Gi", restartPolicy="Always")]), 2,
     Resources(cpu_milli=3000, memory=2 * GI), "none"),
    ("whole GPUs, MIG and hugepages",
     _job(containers=[_c("4", "8Gi", extra={"nvidia.com/gpu": "2", "hugepages-2Mi": "1Gi"})]), 2,
     Resources(cpu_milli=4000, memory=8 * GI, gpus=2, hugepages={"hugepages-2Mi": GI}),
     "restricted (devices)"),  # Burstable: its devices are aligned (the kubelet does), its CPUs not
    ("MIG devices by resource name",
     _job(containers=[_c("1", "1Gi", extra={"nvidia.com/mig-1g.10gb": "1"})]), 2,
     Resources(cpu_milli=1000, memory=GI, mig={"nvidia.com/mig-1g.10gb": 1}), "restricted (devices)"),
    ("every device plugin resource, kubernetes.io's own names aside",
     _job(containers=[_c("1", "1Gi", extra={"example.com/nic": "2", "rdma/hca": "1",
                                            "example.kubernetes.io/thing": "1"})]), 2,
     Resources(cpu_milli=1000, memory=GI, devices={"example.com/nic": 2, "rdma/hca": 1}),
     "restricted (devices)"),
    ("guaranteed with devices: all aligned",
     _job(containers=[_c("2", "1Gi", limits=True, extra={"example.com/nic": "1"})]), 2,
     Resources(cpu_milli=2000, memory=GI, devices={"example.com/nic": 1}), "restricted"),
    ("the annotation decides for devices too",
     _job(containers=[_c("1", "1Gi", extra={"example.com/nic": "1"})],
          template_annotations={"topolet.io/numa-policy": "none"}), 2,
     Resources(cpu_milli=1000, memory=GI, devices={"example.com/nic": 1}), "none"),
    ("the annotation sets the NUMA policy",
     _job(template_annotations={"topolet.io/numa-policy": "single-numa-node"}), 2,
     Resources(cpu_milli=2000, memory=GI), "single-numa-node"),
    ("guaranteed integer CPUs take the nodes' policy",
     _job(containers=[_c("4", "2Gi", limits=True)]), 2,
     Resources(cpu_milli=4000, memory=2 * GI), "restricted"),
    ("guaranteed but fractional CPUs: none",
     _job(containers=[_c("1500m", "2Gi", limits=True)]), 2, Resources(cpu_milli=1500, memory=2 * GI), "none"),
]


@pytest.mark.parametrize(("what", "job", "count", "requests", "policy"), GANGS, ids=[g[0] for g in GANGS])
def test_gang_from_job(what: str, job: dict[str, Any], count: int, requests: Resources, policy: str) -> None:
    gang = gang_from_job(job, {}, guaranteed_policy="restricted")
    (ps,) = gang.pod_sets
    got = ps.numa_policy + ("" if ps.cpu_aligned else " (devices)")
    assert (gang.key, ps.count, ps.requests, got) == ("ns/j", count, requests, policy)


def test_gang_placement_constraints_and_priority() -> None:
    job = _job(annotations={"topolet.io/colocate": "topology.kubernetes.io/rack"}, pod_spec={
        "priorityClassName": "high",
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}})
    gang = gang_from_job(job, {"high": 1000})
    (ps,) = gang.pod_sets
    assert gang.priority == 1000
    assert ps.colocate_label == "topology.kubernetes.io/rack"
    assert dict(ps.node_selector) == {"pool": "gpu"}
    assert ps.tolerations == (Toleration("gpu", "Exists", "", "NoSchedule"),)
    assert ps.required_affinity == ((NodeSelectorRequirement("zone", "In", ("a", "b")),),)


BAD = [
    ("zero parallelism", _job(parallelism=0)),
    ("indexed without completions", _job(indexed=True)),
    ("bad quantity", _job(containers=[_c("lots")])),
    ("fractional GPU", _job(containers=[_c("1", extra={"nvidia.com/gpu": "500m"})])),
    ("no containers", _job(containers=[])),
    ("unknown NUMA policy", _job(template_annotations={"topolet.io/numa-policy": "tight"})),
    ("bad colocate label", _job(annotations={"topolet.io/colocate": "not a label!"})),
    ("unknown priority class", _job(pod_spec={"priorityClassName": "nope"})),
    ("bad affinity operator", _job(pod_spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "Near"}]}]}}}})),
    ("whole GPUs and MIG",
     _job(containers=[_c("1", extra={"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"})])),
    ("fractional device", _job(containers=[_c("1", extra={"example.com/nic": "1500m"})])),
    ("invalid extended resource name", _job(containers=[_c("1", extra={"Example.com/nic": "1"})])),
    ("negative device count", _job(containers=[_c("1", extra={"example.com/nic": "-1"})])),
]


@pytest.mark.parametrize(("what", "job"), BAD, ids=[b[0] for b in BAD])
def test_gang_from_job_rejects(what: str, job: dict[str, Any]) -> None:
    with pytest.raises(JobSpecError):
        gang_from_job(job, {})


def test_record_round_trip_and_decision_patch() -> None:
    record = AdmissionRecord("admitted", "d-1", "2026-12-01T00:00:00Z",
                             {0: SlotPlacement("n1", 0), 1: SlotPlacement("n2", None)})
    assert decode_record(record.encode()) == record
    job = _job(pod_spec={"schedulingGates": [{"name": "other"}]})
    patch = decision_patch(job, record)
    assert patch["spec"]["template"]["spec"]["schedulingGates"] == [{"name": "other"}, {"name": GATE}]
    assert patch["metadata"]["resourceVersion"] == "7"
    assert patch["spec"]["suspend"] is False  # the same write unsuspends
    applied = copy.deepcopy(job)
    applied["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    gates = patch["spec"]["template"]["spec"]["schedulingGates"]
    applied["spec"]["template"]["spec"]["schedulingGates"] = gates
    assert record_of(applied) == record
    # Idempotent: a second patch computed from the patched Job adds no second gate.
    assert decision_patch(applied, record)["spec"]["template"]["spec"]["schedulingGates"] == \
        [{"name": "other"}, {"name": GATE}]


def test_decision_patch_of_an_indexed_job_carries_the_placements() -> None:
    record = AdmissionRecord("admitted", "d-1", "2026-12-01T00:00:00Z",
                             {1: SlotPlacement("n2", None), 0: SlotPlacement("n1", 3)})
    indexed = decision_patch(_job(indexed=True, completions=2), record)
    assert indexed["spec"]["template"]["metadata"] == {
        "annotations": ours({PLACEMENTS_ANNOTATION: "n1:3,n2:"}), "labels": {BY_INDEX_LABEL[0]: "true"}}
    # A non-indexed Job's pods have no index to look up: no annotation, the controller patches them.
    assert decision_patch(_job(), record)["spec"]["template"]["metadata"] == {"annotations": ours({})}


def ours(annotations: dict[str, str]) -> dict[str, str | None]:
    """The template annotations of a decision patch: the placements and zone it sets, and a removal
    (null) of any the tenant put there."""
    return {PLACEMENTS_ANNOTATION: None, NUMA_ZONE_ANNOTATION: None, **annotations}


ON_N1 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
ONE_NODE = [
    # (what, slots, indexed, the job's pod spec, expected template patch; None: the gate route)
    ("one node, one zone: the zone annotation, any Job",
     {0: SlotPlacement("n1", 2), 1: SlotPlacement("n1", 2)}, False, {},
     {"metadata": {"annotations": ours({NUMA_ZONE_ANNOTATION: "2"})},
      "spec": {"nodeSelector": {HOSTNAME_LABEL: "n1"}, "affinity": ON_N1}}),
    ("one node, no zone: the node only", {0: SlotPlacement("n1", None)}, False, {},
     {"metadata": {"annotations": ours({})},
      "spec": {"nodeSelector": {HOSTNAME_LABEL: "n1"}, "affinity": ON_N1}}),
    ("one node, zones by index: the placements",
     {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", 1)}, True, {},
     {"metadata": {"annotations": ours({PLACEMENTS_ANNOTATION: "n1:0,n1:1"})},
      "spec": {"nodeSelector": {HOSTNAME_LABEL: "n1"}, "affinity": ON_N1}}),
    ("a template with an affinity of its own keeps it",
     {0: SlotPlacement("n1", 0)}, True, {"affinity": {"podAntiAffinity": {}}},
     {"metadata": {"annotations": ours({NUMA_ZONE_ANNOTATION: "0"})},
      "spec": {"nodeSelector": {HOSTNAME_LABEL: "n1"}}}),
    ("an empty affinity of its own too",
     {0: SlotPlacement("n1", None)}, True, {"affinity": {}},
     {"metadata": {"annotations": ours({})}, "spec": {"nodeSelector": {HOSTNAME_LABEL: "n1"}}}),
    ("one node, zones differ, no index to tell the pods apart: gated",
     {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", 1)}, False, {}, None),
    ("two nodes: gated", {0: SlotPlacement("n1", 0), 1: SlotPlacement("n2", 0)}, True, {}, None),
]


@pytest.mark.parametrize(("what", "slots", "indexed", "pod_spec", "template"), ONE_NODE,
                         ids=[r[0] for r in ONE_NODE])
def test_decision_patch_pins_the_template_of_a_job_on_one_node(
        what: str, slots: dict[int, SlotPlacement], indexed: bool, pod_spec: dict[str, Any],
        template: dict[str, Any] | None) -> None:
    record = AdmissionRecord("admitted", "d-1", "2026-12-01T00:00:00Z", slots)
    patch = decision_patch(_job(indexed=indexed, completions=len(slots), pod_spec=pod_spec), record)
    assert patch["spec"]["suspend"] is False and ADMISSION_ANNOTATION in patch["metadata"]["annotations"]
    if template is None:
        assert patch["spec"]["template"]["spec"]["schedulingGates"] == [{"name": GATE}]
        assert HOSTNAME_LABEL not in patch["spec"]["template"]["spec"].get("nodeSelector", {})
    else:
        assert patch["spec"]["template"] == template


PLACEMENTS = [
    # (what, slots, indexed, expected value)
    ("in index order, an empty zone for a slot without one",
     {2: SlotPlacement("c", 0), 0: SlotPlacement("a", 1), 1: SlotPlacement("b", None)}, True, "a:1,b:,c:0"),
    ("non-indexed", {0: SlotPlacement("a", 1)}, False, None),
    ("slots with a gap are not indexes", {0: SlotPlacement("a", 1), 2: SlotPlacement("b", 0)}, True, None),
    ("too long for an annotation",
     {i: SlotPlacement("n" * 60, 7) for i in range(PLACEMENTS_MAX_CHARS // 60)}, True, None),
]


@pytest.mark.parametrize(("what", "slots", "indexed", "value"), PLACEMENTS, ids=[p[0] for p in PLACEMENTS])
def test_placements_value(what: str, slots: dict[int, SlotPlacement], indexed: bool,
                          value: str | None) -> None:
    record = AdmissionRecord("admitted", "d", "t", slots)
    assert placements_value(record, indexed) == value
    assert placements_value(AdmissionRecord("rejected", "d", "t", reason="no"), indexed) is None


@pytest.mark.parametrize("text", [
    "not json", "{}", '{"result":"maybe","decision":"d","time":"t"}',
    '{"result":"admitted","decision":"d","time":"t"}',
    '{"result":"admitted","decision":"d","time":"t","placement":{"x":{"node":"n"}}}',
    '{"result":"admitted","decision":"d","time":"t","placement":{"0":{"node":"n","zone":-1}}}',
])
def test_malformed_record(text: str) -> None:
    with pytest.raises(JobSpecError):
        record_of({"metadata": {"annotations": {ADMISSION_ANNOTATION: text}}})


def test_pod_patch_pins_and_ungates() -> None:
    pod: dict[str, Any] = {"metadata": {"resourceVersion": "3", "annotations": {}},
           "spec": {"schedulingGates": [{"name": GATE}], "nodeSelector": {"pool": "a"}}}
    patch = pod_patch(pod, "n1", 1)
    on_n1 = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}
    assert patch["spec"] == {"nodeSelector": {HOSTNAME_LABEL: "n1"}, "schedulingGates": None,
                             "affinity": {"nodeAffinity": on_n1}}
    assert patch["metadata"] == {"resourceVersion": "3", "annotations": {NUMA_ZONE_ANNOTATION: "1"}}
    pod["spec"]["schedulingGates"].append({"name": "keep"})
    assert pod_patch(pod, "n1", None)["spec"]["schedulingGates"] == [{"name": "keep"}]
    assert "annotations" not in pod_patch(pod, "n1", None)["metadata"]
    # Required node affinity of the pod's own is left as it is (a gated pod's may only be narrowed).
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}}}
    assert "affinity" not in pod_patch(pod, "n1", 1)["spec"]
    # A pod the placement policy did not pin still carries the template's placements: removed.
    pod["metadata"]["annotations"][PLACEMENTS_ANNOTATION] = "n1:1"
    assert pod_patch(pod, "n1", 1)["metadata"]["annotations"] == {PLACEMENTS_ANNOTATION: None,
                                                                  NUMA_ZONE_ANNOTATION: "1"}


def _pod(name: str, *, index: int | None = None, pinned: tuple[str, int] | None = None,
         phase: str = "Pending", created: int = 0) -> dict[str, Any]:
    ann = {} if index is None else {"batch.kubernetes.io/job-completion-index": str(index)}
    spec: dict[str, Any] = {"schedulingGates": [{"name": GATE}]}
    if pinned is not None:
        ann[NUMA_ZONE_ANNOTATION] = str(pinned[1])
        spec = {"nodeSelector": {HOSTNAME_LABEL: pinned[0]}}
    return {"metadata": {"name": name, "uid": name, "annotations": ann,
                         "creationTimestamp": f"2026-01-01T00:00:{created:02d}Z"},
            "spec": spec, "status": {"phase": phase}}


def _templated(name: str, index: int, placements: str) -> dict[str, Any]:
    """A pod of a one-node Job as the Job controller makes it: pinned by the template, no gate."""
    pod = _pod(name, index=index)
    pod["metadata"]["annotations"][PLACEMENTS_ANNOTATION] = placements
    pod["spec"] = {"nodeSelector": {HOSTNAME_LABEL: placements.split(":")[0]}}
    return pod


SLOTS = {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", 1), 2: SlotPlacement("n2", 0)}
ASSIGN = [
    ("one-node Job: its pods hold their index's slot from the template's placements",
     [_templated("t1", 1, "n1:0,n1:1"), _templated("t0", 0, "n1:0,n1:1")], True, {"t0": 0, "t1": 1}, []),
    ("a placements entry for another node gives no zone: that pod holds no slot",
     [_templated("t1", 1, "n1:0,n2:1")], True, {}, []),
    # (what, pods, indexed, expected held {uid: slot}, expected place [(name, slot)])
    ("indexed: by completion index", [_pod("b", index=2, created=1), _pod("a", index=0, created=2)], True,
     {"a": 0, "b": 2}, [("b", 2), ("a", 0)]),
    ("non-indexed: oldest pod first, lowest slot", [_pod("y", created=2), _pod("x", created=1)], False,
     {"x": 0, "y": 1}, [("x", 0), ("y", 1)]),
    ("a pinned pod keeps its slot, by (node, zone)",
     [_pod("p", pinned=("n1", 1)), _pod("q", created=1)], False, {"p": 1, "q": 0}, [("q", 0)]),
    ("a replacement takes the failed pod's slot",
     [_pod("old", pinned=("n2", 0), phase="Failed"), _pod("p0", pinned=("n1", 0)),
      _pod("p1", pinned=("n1", 1)), _pod("new", created=5)], False,
     {"p0": 0, "p1": 1, "new": 2}, [("new", 2)]),
    ("more gated pods than free slots: the rest wait",
     [_pod("a", created=1), _pod("b", created=2), _pod("c", created=3), _pod("d", created=4)], False,
     {"a": 0, "b": 1, "c": 2}, [("a", 0), ("b", 1), ("c", 2)]),
    ("indexed: an index beyond the slots takes a free one, after the pods with their own",
     [_pod("i5", index=5), _pod("i0", index=0, created=1)], True, {"i5": 1, "i0": 0}, [("i5", 1), ("i0", 0)]),
]


@pytest.mark.parametrize(("what", "pods", "indexed", "held", "place"), ASSIGN, ids=[a[0] for a in ASSIGN])
def test_assign_slots(what: str, pods: list[dict[str, Any]], indexed: bool, held: dict[str, int],
                      place: list[tuple[str, int]]) -> None:
    got = assign_slots(SLOTS, pods, indexed)
    assert dict(got.held) == held
    assert [(p["metadata"]["name"], slot) for p, slot in got.place] == place


def _moved_on(change: str) -> dict[str, Any]:
    """The `_job()` re-read after someone changed `change` (a 409 on our write)."""
    fresh = copy.deepcopy(_job())
    fresh["metadata"]["resourceVersion"] = "8"
    if change == "status":
        fresh["status"] = {"conditions": [{"type": "Suspended", "status": "True"}]}
    elif change == "decided":
        theirs = AdmissionRecord("admitted", "other", "2026-01-01T00:00:00Z",
                                 {0: SlotPlacement("n1"), 1: SlotPlacement("n2")})
        fresh["metadata"].setdefault("annotations", {})[ADMISSION_ANNOTATION] = theirs.encode()
    elif change == "unsuspended":
        fresh["spec"]["suspend"] = False
    elif change == "recreated":
        fresh["metadata"]["uid"] = "another-uid"
    elif change == "template":
        fresh["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    elif change == "scaled":
        fresh["spec"]["parallelism"] = 8
    return fresh


@pytest.mark.parametrize(("change", "retry"), [
    ("status", True),         # the Job controller wrote the status: our decision still holds
    ("decided", False),       # another replica recorded its own decision first
    ("unsuspended", False),   # someone else let it run
    ("recreated", False),     # a new Job of the same name
    ("template", False),      # other requests than the ones placed
    ("scaled", False),        # another size than the one placed (the record's shape would not match)
])
def test_still_undecided_after_a_conflict(change: str, retry: bool) -> None:
    job = _job()
    job["metadata"]["resourceVersion"] = "7"
    fresh = _moved_on(change)
    assert still_undecided(job, fresh) is retry
    if retry:  # the retried write carries the fresh resourceVersion, so it still guards against a race
        record = AdmissionRecord("admitted", "d1", "2026-01-01T00:00:00Z", {0: SlotPlacement("n1")})
        assert decision_patch(fresh, record)["metadata"]["resourceVersion"] == "8"


@pytest.mark.parametrize("slots", [
    {0: SlotPlacement("n1", 2)},  # one node, one zone: our numa-zone beside the tenant's placements
    {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", 1)},  # one node, zones by index
    {0: SlotPlacement("n1", 0), 1: SlotPlacement("n2", 1)},  # two nodes, gated
])
def test_a_tenants_own_placements_never_survive_the_decision(slots: dict[int, SlotPlacement]) -> None:
    """A template that came with the gate, the placement policy's label and placements of its own: the
    decision's placements replace them, or the decision removes them, and the same for the zone."""
    job = _job(indexed=True, completions=len(slots),
               template_annotations={PLACEMENTS_ANNOTATION: "n9:3,n9:3", NUMA_ZONE_ANNOTATION: "3"},
               pod_spec={"schedulingGates": [{"name": GATE}]})
    job["spec"]["template"]["metadata"]["labels"] = {BY_INDEX_LABEL[0]: BY_INDEX_LABEL[1]}
    record = AdmissionRecord("admitted", "d-1", "2026-12-01T00:00:00Z", slots)
    notes = decision_patch(job, record)["spec"]["template"]["metadata"]["annotations"]
    applied = {**job["spec"]["template"]["metadata"]["annotations"], **notes}
    applied = {k: v for k, v in applied.items() if v is not None}
    assert "n9" not in applied.get(PLACEMENTS_ANNOTATION, "")
    zones = {str(p.zone) for p in slots.values()}
    assert applied.get(NUMA_ZONE_ANNOTATION) in (zones if len(zones) == 1 else {None})


def test_requeue_patch_removes_the_record_under_the_version_read() -> None:
    assert requeue_patch(_job()) == {"metadata": {"resourceVersion": "7",
                                                  "annotations": {ADMISSION_ANNOTATION: None}}}


def _merged(obj: Any, patch: Any) -> Any:
    """`obj` with the JSON merge patch `patch` applied (RFC 7386)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(obj) if isinstance(obj, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merged(out.get(k), v)
    return out


@pytest.mark.parametrize(("what", "slots", "indexed", "pod_spec"), [
    ("one node, the template pinned", {0: SlotPlacement("gone", 0), 1: SlotPlacement("gone", 1)}, True, {}),
    ("one node, one zone, no index", {0: SlotPlacement("gone", 2), 1: SlotPlacement("gone", 2)}, False, {}),
    ("two nodes, gated, the placements", {0: SlotPlacement("gone", 0), 1: SlotPlacement("here", 1)}, True,
     {}),
    ("one node, an affinity of the tenant's own kept", {0: SlotPlacement("gone", 0)}, False,
     {"affinity": {"podAntiAffinity": {}}}),
])
def test_a_job_queued_again_after_its_node_was_gone_gets_its_template_back(
        what: str, slots: dict[int, SlotPlacement], indexed: bool, pod_spec: dict[str, Any]) -> None:
    """lost_patch, then (the Job controller's start time cleared: restart_patch) unpin_patch: the
    template is the one the Job was queued with, and nothing is left to unpin."""
    queued = _job(indexed=indexed, completions=len(slots) if indexed else None, pod_spec=pod_spec,
                  template_annotations={"user": "kept"})
    queued["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    record = AdmissionRecord("admitted", "d-1", "2026-12-01T00:00:00Z", slots)
    admitted = _merged(queued, decision_patch(queued, record))
    admitted["status"] = {"startTime": "2026-12-01T00:00:01Z", "active": 2}
    assert gone_nodes(admitted, record, {"here"}, [{"spec": {}}]) == ["gone"]
    assert gone_nodes(admitted, record, {"here"}, [{"spec": {"nodeName": "gone"}}]) == []  # bound: it runs
    assert gone_nodes({"status": {"failed": 1}}, record, {"here"}, []) == []  # it ran
    assert gone_nodes(admitted, record, {"here", "gone"}, []) == []

    lost = lost_patch(admitted)
    assert lost == {"metadata": {"resourceVersion": "7", "annotations": {ADMISSION_ANNOTATION: None}},
                    "spec": {"suspend": True}}
    suspended = _merged(admitted, lost)
    assert job_started(suspended)
    assert restart_patch(suspended) == {"metadata": {"resourceVersion": "7"}, "status": {"startTime": None}}
    restarted = _merged(suspended, restart_patch(suspended))
    assert not job_started(restarted)
    body = unpin_patch(restarted, {"here"})
    assert body is not None and set(body) == {"metadata", "spec"} and set(body["spec"]) == {"template"}
    unpinned = _merged(restarted, body)
    template = unpinned["spec"]["template"]
    want = queued["spec"]["template"]
    assert {k: v for k, v in template["spec"].items() if v not in ({}, [])} == \
        {k: v for k, v in want["spec"].items() if v not in ({}, [])}
    assert template["metadata"].get("annotations") == {"user": "kept"}
    assert not template["metadata"].get("labels")
    assert unpin_patch(unpinned, {"here"}) is None


def test_unpin_keeps_a_node_selector_on_a_node_that_is_there() -> None:
    job = _job(pod_spec={"nodeSelector": {HOSTNAME_LABEL: "here"}})
    assert unpin_patch(job, {"here"}) is None
    assert unpin_patch(job, set()) == {"metadata": {"resourceVersion": "7"}, "spec": {"template": {
        "spec": {"nodeSelector": {HOSTNAME_LABEL: None}}}}}

"""What NRI says of a container, read as the pod watch reads its pod (agent.kube.pods.nri_pods, and the
runtime's cgroupsPath reader in agent.enforce.kubepods): tables, and the same decision as plan_pod
on the API's pod for every row."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from agent.api.podplan import plan_pod
from agent.api.qos import QOSClass
from agent.enforce.kubepods import CgroupDriver, Runtime, container_cgroup_path, read_runtime_cgroups_path
from agent.kube.pods.nri_pods import cached_decision, kubelet_container, plan_from_nri, requested_cpus
from agent.nri import api_pb2

UID = "0b7f3c1e-5d2a-4c8e-9f10-2a3b4c5d6e7f"
CID = "ab" * 32
NODE = "node-a"

# (cgroupsPath, QoS, driver, runtime); None: not a kubelet pod's container we pin
G, B, BE = QOSClass.GUARANTEED, QOSClass.BURSTABLE, QOSClass.BESTEFFORT
FS, SD = CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD
PATHS: list[tuple[str, tuple[QOSClass, CgroupDriver, Runtime] | None]] = [
    (f"/kubepods/pod{UID}/{CID}", (G, FS, Runtime.CONTAINERD)),
    (f"/kubepods/burstable/pod{UID}/{CID}", (B, FS, Runtime.CONTAINERD)),
    (f"/kubepods/besteffort/pod{UID}/{CID}", (BE, FS, Runtime.CONTAINERD)),
    (f"/kubepods/pod{UID}/crio-{CID}", (G, FS, Runtime.CRIO)),
    (f"kubepods-pod{UID.replace('-', '_')}.slice:cri-containerd:{CID}", (G, SD, Runtime.CONTAINERD)),
    (f"kubepods-burstable-pod{UID.replace('-', '_')}.slice:crio:{CID}", (B, SD, Runtime.CRIO)),
    (f"/custom-root/kubepods/pod{UID}/{CID}", None),  # a kubelet --cgroup-root: the watch does not pin it
    (f"/kubepods/pod{UID}/{CID}/extra", None),
    (f"/kubepods/guaranteed/pod{UID}/{CID}", None),
    (f"/kubepods/pod{UID}/not-an-id", None),
    (f"system.slice:docker:{CID}", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "want"), PATHS, ids=[p[0][:48] or "empty" for p in PATHS])
def test_runtime_cgroups_path(text: str, want: tuple[QOSClass, CgroupDriver, Runtime] | None) -> None:
    read = read_runtime_cgroups_path(text)
    if want is None:
        assert read is None
        return
    assert read is not None
    assert (read.qos, read.driver, read.runtime, read.container_id) == (*want, CID)
    assert read.names_pod(UID) and not read.names_pod(UID[::-1])
    # Read back, the path names the cgroup the kubelet's mapping gives (the watch path's).
    rel = container_cgroup_path(UID, read.qos, CID, read.runtime, read.driver)
    if read.driver is CgroupDriver.CGROUPFS:
        assert "/" + rel == text
    else:
        assert rel.endswith(f"{text.split(':')[0]}/{text.split(':')[1]}-{CID}.scope")


def cpu(shares: int | None = None, quota: int | None = None, period: int | None = 100000) -> api_pb2.LinuxCPU:
    out = api_pb2.LinuxCPU()
    if shares is not None:
        out.shares.value = shares
    if quota is not None:
        out.quota.value = quota
        if period is not None:
            out.period.value = period
    return out


# (what, LinuxCPU, (request, limit)); kubelet: shares = milli*1024//1000 (min 2), quota = milli*period/1000
CPU_ROWS: list[tuple[str, api_pb2.LinuxCPU, tuple[Fraction | None, Fraction | None]]] = [
    ("2 CPUs, quota", cpu(2048, 200000), (Fraction(2), Fraction(2))),
    ("1 CPU, CFS quota off", cpu(1024), (Fraction(1), None)),
    ("1500m", cpu(1536, 150000), (Fraction(3, 2), Fraction(3, 2))),
    ("1024m: shares 1048, not whole", cpu(1048, 102400), (Fraction(1048, 1024), Fraction(1024, 1000))),
    ("best effort: shares 2", cpu(2), (Fraction(2, 1024), None)),
    ("request 1, limit 2", cpu(1024, 200000), (Fraction(1) + Fraction(1, 1024), Fraction(2))),
    ("request 1, limit 1500m", cpu(1024, 150000), (Fraction(1) + Fraction(1, 1024), Fraction(3, 2))),
    ("no quota set (-1)", cpu(4096, -1), (Fraction(4), None)),
    ("nothing set", cpu(), (None, None)),
]


@pytest.mark.parametrize(("row", "want"), [r[1:] for r in CPU_ROWS], ids=[r[0] for r in CPU_ROWS])
def test_requested_cpus(row: api_pb2.LinuxCPU, want: tuple[Fraction | None, Fraction | None]) -> None:
    assert requested_cpus(row) == want


def sandbox(annotations: dict[str, str] | None = None) -> api_pb2.PodSandbox:
    return api_pb2.PodSandbox(id="sandbox-1", uid=UID, namespace="ns", name="p",
                              annotations=annotations or {}, labels={"app": "x"})


def nri_container(qos: QOSClass, milli_req: int, milli_lim: int | None, mem: int | None = 1 << 30,
                  hugepages_2m: int = 0) -> api_pb2.Container:
    """A container as the kubelet hands it to containerd (cgroupfs driver) for these requests."""
    part = "" if qos is QOSClass.GUARANTEED else f"{qos.value}/"
    out = api_pb2.Container(id=CID, pod_sandbox_id="sandbox-1", name="c")
    out.linux.cgroups_path = f"/kubepods/{part}pod{UID}/{CID}"
    res = out.linux.resources
    res.cpu.CopyFrom(cpu(max(milli_req * 1024 // 1000, 2),
                         milli_lim * 100000 // 1000 if milli_lim else None))
    if mem is not None:
        res.memory.limit.value = mem
    if hugepages_2m:
        res.hugepage_limits.add(page_size="2MB", limit=hugepages_2m)
    return out


def api_pod(qos: QOSClass, milli_req: int, milli_lim: int | None, annotations: dict[str, str] | None = None,
            mem: str | None = "1Gi") -> dict[str, Any]:
    """The API's view of the same pod, running."""
    req: dict[str, str] = {"cpu": f"{milli_req}m"} if milli_req else {}
    lim: dict[str, str] = {"cpu": f"{milli_lim}m"} if milli_lim else {}
    if mem is not None:
        req["memory"] = lim["memory"] = mem
    names = {G: "Guaranteed", B: "Burstable", BE: "BestEffort"}
    resources = {"requests": req, "limits": lim}
    return {"metadata": {"uid": UID, "namespace": "ns", "name": "p", "annotations": annotations or {}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": resources}]},
            "status": {"phase": "Running", "qosClass": names[qos],
                       "containerStatuses": [{"name": "c", "containerID": f"containerd://{CID}",
                                              "state": {"running": {}}}]}}


EXCL = {"topolet.io/cpu-policy": "exclusive"}
INDEX = "batch.kubernetes.io/job-completion-index"
PLACED = {INDEX: "1", "topolet.io/placements": f"other:0,{NODE}:1"}
PLACED_ELSEWHERE = {INDEX: "0", "topolet.io/placements": f"other:0,{NODE}:1"}

# (what, QoS, request milli, limit milli, annotations, exclusive CPUs, warning reasons)
DECISIONS: list[tuple[str, QOSClass, int, int | None, dict[str, str], int, tuple[str, ...]]] = [
    ("guaranteed 2", QOSClass.GUARANTEED, 2000, 2000, {}, 2, ()),
    ("guaranteed 1", QOSClass.GUARANTEED, 1000, 1000, {}, 1, ()),
    ("guaranteed 1500m", QOSClass.GUARANTEED, 1500, 1500, {}, 0, ()),
    ("guaranteed 1024m", QOSClass.GUARANTEED, 1024, 1024, {}, 0, ()),
    ("guaranteed, opted out", QOSClass.GUARANTEED, 2000, 2000, {"topolet.io/cpu-policy": "shared"}, 0, ()),
    ("burstable", QOSClass.BURSTABLE, 2000, None, {}, 0, ()),
    ("burstable opted in, limit equal", QOSClass.BURSTABLE, 2000, 2000, EXCL, 2, ()),
    ("burstable opted in, limit above", QOSClass.BURSTABLE, 1000, 2000, EXCL, 0, ("NotEligible",)),
    ("burstable opted in, no limit", QOSClass.BURSTABLE, 1000, None, EXCL, 0, ("NotEligible",)),
    ("best effort", QOSClass.BESTEFFORT, 0, None, {}, 0, ()),
    ("bad annotation", G, 2000, 2000, {"topolet.io/smt": "half"}, 0, ("InvalidAnnotation",)),
    ("placed on this node, zone 1", QOSClass.GUARANTEED, 1000, 1000, PLACED, 1, ()),
    ("placed on another node", QOSClass.GUARANTEED, 1000, 1000, PLACED_ELSEWHERE, 0, ("InvalidAnnotation",)),
]


@pytest.mark.parametrize(("qos", "req", "lim", "notes", "cpus", "reasons"), [d[1:] for d in DECISIONS],
                         ids=[d[0] for d in DECISIONS])
def test_nri_decision_is_the_watch_decision(qos: QOSClass, req: int, lim: int | None, notes: dict[str, str],
                                            cpus: int, reasons: tuple[str, ...]) -> None:
    pod, ctr = sandbox(notes), nri_container(qos, req, lim)
    ref = kubelet_container(pod, ctr)
    assert ref is not None
    assert (ref.cgroup, ref.container_id, ref.qos) == (
        container_cgroup_path(UID, qos, f"containerd://{CID}", None, CgroupDriver.CGROUPFS),
        f"containerd://{CID}", qos)
    plan, c = plan_from_nri(pod, ctr, ref, NODE)
    assert (plan.uid, plan.namespace, plan.name, plan.qos) == (UID, "ns", "p", qos)
    assert c.cpus == cpus
    assert tuple(w.reason for w in plan.warnings) == reasons
    (watched,) = plan_pod(api_pod(qos, req, lim, notes)).containers
    assert (c.cpus, c.numa_policy, c.smt, c.memory_binding, c.numa_zone) == (
        watched.cpus, watched.numa_policy, watched.smt, watched.memory_binding, watched.numa_zone)


def test_refinements_memory_and_hugepages_reach_the_plan() -> None:
    pod = sandbox({"topolet.io/numa-policy": "single-numa-node", "topolet.io/smt": "full-cores",
                   "topolet.io/memory-binding": "true"})
    ctr = nri_container(QOSClass.GUARANTEED, 4000, 4000, mem=1 << 30, hugepages_2m=64 << 20)
    ref = kubelet_container(pod, ctr)
    assert ref is not None
    _, c = plan_from_nri(pod, ctr, ref, NODE)
    assert (c.cpus, c.numa_policy, c.smt, c.memory_binding) == (4, "single-numa-node", "full-cores", True)
    assert c.memory == (("hugepages-2Mi", 64 << 20), ("memory", 1 << 30))


@pytest.mark.parametrize("change", ["no uid", "another pod's path", "another container's id", "no path"])
def test_containers_that_are_not_this_pods_are_not_read(change: str) -> None:
    pod, ctr = sandbox(), nri_container(QOSClass.GUARANTEED, 1000, 1000)
    if change == "no uid":
        pod.uid = ""
    elif change == "another pod's path":
        ctr.linux.cgroups_path = ctr.linux.cgroups_path.replace(UID, UID[::-1])
    elif change == "another container's id":
        ctr.id = "cd" * 32
    else:
        ctr.linux.cgroups_path = ""
    assert kubelet_container(pod, ctr) is None


def test_the_cached_plan_decides_waiting_containers_with_the_runtime_id() -> None:
    obj = api_pod(QOSClass.GUARANTEED, 2000, 2000, {"topolet.io/smt": "full-cores"})
    obj["status"]["containerStatuses"] = []  # bound, its container not created yet
    plan = plan_pod(obj)
    pod, ctr = sandbox(), nri_container(QOSClass.GUARANTEED, 2000, 2000)
    ref = kubelet_container(pod, ctr)
    assert ref is not None
    c = cached_decision(plan, ref)
    assert c is not None and (c.cpus, c.smt, c.container_id) == (2, "full-cores", f"containerd://{CID}")
    ctr.name = "sidecar"  # not a regular container of the spec
    other = kubelet_container(pod, ctr)
    assert other is not None and cached_decision(plan, other) is None


@pytest.mark.parametrize(("root", "prefix", "read"), [
    ("", "", True),  # the kubelet at the hierarchy's top, the agent too
    ("/topolet-rn-a", "/topolet-rn-a", True),  # a kubelet --cgroup-root the agent's --cgroup-root names
    ("", "/topolet-rn-a", False),  # below a root the agent does not own: its path would be wrong
    ("/topolet-rn-a", "", False),
    ("/topolet-rn-a", "/topolet-rn-ab", False),  # a sibling whose name starts the same
])
def test_the_agents_cgroup_root_is_taken_off_the_runtimes_path(root: str, prefix: str, read: bool) -> None:
    pod, ctr = sandbox(), nri_container(QOSClass.GUARANTEED, 1000, 1000)
    ctr.linux.cgroups_path = prefix + ctr.linux.cgroups_path
    ref = kubelet_container(pod, ctr, root)
    assert (ref is not None) == read
    if ref is not None:
        assert ref.cgroup == container_cgroup_path(UID, QOSClass.GUARANTEED, f"containerd://{CID}", None,
                                                   CgroupDriver.CGROUPFS)

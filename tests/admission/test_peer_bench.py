"""The admission bench's NRT-plugin arm (bench/admission_peer.py) against the real control plane, and
the bench's gang counts and last line.

The peer scheduler (kube-scheduler + scheduler-plugins' NodeResourceTopologyMatch and Coscheduling,
built from third_party/) runs on the test cluster as the bench runs it: its own service account and
RBAC, a PodGroup per gang, the bench's Jobs.  A gang whose pods fit the node's zones binds whole; a
gang whose pods fit the node's totals but not its zones stays wholly pending (nothing partly bound)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.controlplane.cluster import NRT_GROUP, NRT_PLURAL, NRT_VERSION, Cluster, node_resources
from tests.controlplane.fixtures import _unavailable

sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission_api import ApiRun, _gang_counts, _job, last_line  # noqa: E402
from admission_peer import POD_GROUP_LABEL, PROFILE, PeerScheduler, build_peer, peer_objects  # noqa: E402

from agent.admission.engine.model import Gang, PodSet, Resources  # noqa: E402
from agent.enforce.state import State  # noqa: E402
from agent.kube.publish.nrt import nrt_object
from agent.kubeapi.client import KubeClient, resource_path  # noqa: E402

DUMP = "32em64t-2n8c+dax+nvme+mic+dimms"  # two zones of 8 CPUs


def _gang(key: str, pods: int, cpus: int) -> Gang:
    req = Resources(cpu_milli=cpus * 1000, memory=cpus * workload.GIB)
    return Gang(key=key, pod_sets=(PodSet(name="workers", count=pods, requests=req,
                                          numa_policy="single-numa-node"),))


# ---- pure parts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "want"), [
    ({"gang-00000": ["n1", "n1"], "gang-00001": ["n2", "n2", "n2", "n2"]}, (2, 0)),
    ({"gang-00000": ["n1", ""], "gang-00001": ["", "", "", ""]}, (0, 1)),
    ({"gang-00000": ["n1"], "gang-00001": []}, (0, 1)),  # a pod never made counts as unbound
    ({}, (0, 0)),
])
def test_gang_counts(nodes: dict[str, list[str]], want: tuple[int, int]) -> None:
    stream = [_gang("a", 2, 4), _gang("b", 4, 6)]
    assert _gang_counts(nodes, stream) == want


def test_peer_objects_put_the_pods_in_a_group_of_the_whole_gang() -> None:
    job = _job(_gang("g", 4, 6), 7, queued=False)
    (pg_path, pg), (job_path, peer_job) = peer_objects(job, "ns")
    assert pg_path == "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups"
    assert pg["metadata"]["name"] == "gang-00007" and pg["spec"]["minMember"] == 4
    assert job_path == "/apis/batch/v1/namespaces/ns/jobs"
    template = peer_job["spec"]["template"]
    assert template["metadata"]["labels"][POD_GROUP_LABEL] == "gang-00007"
    assert template["spec"]["schedulerName"] == PROFILE
    assert peer_job["spec"]["suspend"] is False
    assert "labels" not in job["spec"]["template"]["metadata"]  # the plain arm's Job is left as it was


def test_last_line_names_every_placer() -> None:
    def run(name: str, aligned: int, wall: float) -> list[ApiRun]:
        return [ApiRun(name, 10, 10, wall, aligned, gangs=5, whole=5)]

    runs = {"kube-scheduler only": run("kube-scheduler only", 9, 10.0),
            "topolet controller": run("topolet controller", 10, 12.0),
            "NRT plugin, scope pod": run("NRT plugin, scope pod", 10, 15.0)}
    assert last_line(runs) == ("admission: 10 pods aligned 100.0% vs scheduler-only 90.0% vs NRT-plugin "
                               "100.0%; wall with controller / scheduler-only = 1.20, / NRT-plugin = 0.80")


# ---- the peer on the real control plane -----------------------------------------------------------


@pytest.fixture(scope="module")
def peer_binary() -> Path:
    try:
        return build_peer()
    except (RuntimeError, OSError) as exc:
        _unavailable(f"the NRT-plugin peer did not build: {exc}")
        raise


def _pods(api: KubeClient, namespace: str, job: str) -> list[dict[str, Any]]:
    return list(api.list(f"/api/v1/namespaces/{namespace}/pods",
                         {"labelSelector": f"batch.kubernetes.io/job-name={job}"})["items"])


def _wait(what: str, probe: Any, pods: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            seen = [(p["metadata"]["name"], p["spec"].get("nodeName"), _judged(p)) for p in pods()]
            raise AssertionError(f"timed out waiting for {what}; pods (name, node, why not): {seen}")
        time.sleep(0.5)


def _judged(pod: dict[str, Any]) -> str:
    """Why the scheduler found no room for the pod ("" until it did)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "unschedulable")
    return ""


def test_peer_binds_a_fitting_gang_whole_and_leaves_a_misaligned_one_wholly_pending(
        cluster: Cluster, peer_binary: Path, api: KubeClient, namespace: str, tmp_path: Path) -> None:
    ((_, topo),) = workload.topologies(tmp_path, (DUMP,))
    zone_cpus = {len(n.cpus) for n in topo.numa_nodes if n.cpus}
    assert zone_cpus == {8} and len(topo.cpus) == 16
    capacity, allocatable = node_resources(topo)
    fit, nofit = f"{namespace}-fit", f"{namespace}-nofit"
    for node in (fit, nofit):
        uid = cluster.create_node_object(node, capacity, allocatable, api=api)
        api.create(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL),
                   nrt_object((node, uid), topo, State(), topology_manager_policy="single-numa-node",
                              topology_manager_scope="pod"))
    # The peer's reserve cache takes the NRTs it lists when it starts (a later one is not filtered on
    # until a resync matches its pod fingerprint): start it once they exist, as the bench does.
    peer = PeerScheduler(cluster, peer_binary)
    try:
        peer.start()
        # 2 x 4 CPUs fit the zones (not 2 x 8: until a resync sees a refreshed NRT, the peer counts a
        # reserved pod against every zone of its node).  3 x 5 CPUs: 15 of the node's 16, but a zone
        # holds one such pod.
        for index, (gang, node) in enumerate(((_gang("fit", 2, 4), fit), (_gang("nofit", 3, 5), nofit))):
            job = _job(gang, index, queued=False)
            job["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            for path, body in peer_objects(job, namespace):
                api.create(path, body)

        _wait("the fitting gang to bind",
              lambda: [p["spec"].get("nodeName") for p in _pods(api, namespace, "gang-00000")] == [fit, fit],
              lambda: _pods(api, namespace, "gang-00000"))

        def judged_whole() -> bool:  # every pod bound or turned down, one of them for its zones
            pods = _pods(api, namespace, "gang-00001")
            return (len(pods) == 3 and all(p["spec"].get("nodeName") or _judged(p) for p in pods)
                    and any("align" in _judged(p) for p in pods))

        _wait("the scheduler to turn the other gang down for its zones", judged_whole,
              lambda: _pods(api, namespace, "gang-00001"))
        assert [p["spec"].get("nodeName") for p in _pods(api, namespace, "gang-00001")] == [None] * 3
        assert peer.running()
    finally:
        print(peer.log_tail())
        peer.stop()
        for node in (fit, nofit):
            api.request("DELETE", f"/api/v1/nodes/{node}")

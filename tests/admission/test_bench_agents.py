"""The admission bench's stand-in kubelets and agents (bench/admission_agents.py) on the real control
plane: a pod bound to a node is pinned inside one zone when one holds it, the node's NRT is
republished with the CPUs it holds and the fingerprint of the node's pinned pods (what the NRT
plugin's reserve cache and topolet's ledger both wait for), and the pod is reported Running."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any

from tests.conftest import REPO
from tests.controlplane.cluster import NRT_GROUP, NRT_PLURAL, NRT_VERSION, Cluster, node_resources

sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission_agents import NodeAgents  # noqa: E402

from agent.api.fingerprint import pod_set_fingerprint
from agent.api.nrt import ATTR_FINGERPRINT
from agent.enforce.state import State  # noqa: E402
from agent.kube.publish.nrt import nrt_object
from agent.kubeapi.client import KubeClient, resource_path  # noqa: E402

DUMP = "32em64t-2n8c+dax+nvme+mic+dimms"  # two zones of 8 CPUs


def _pod(name: str, node: str, cpus: int) -> dict[str, Any]:
    res = {"cpu": str(cpus), "memory": f"{cpus}Gi"}
    return {"metadata": {"name": name},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res, "limits": res}}]}}


def _zones_free(nrt: dict[str, Any]) -> list[int]:
    return [int(r["available"]) for z in nrt["zones"] for r in z.get("resources") or [] if r["name"] == "cpu"]


def _fingerprint(nrt: dict[str, Any]) -> str | None:
    return next((a["value"] for a in nrt.get("attributes") or [] if a["name"] == ATTR_FINGERPRINT), None)


def _wait(what: str, probe: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _node(cluster: Cluster, api: KubeClient, namespace: str, tmp_path: Any) -> tuple[Any, str, str, str]:
    """A two-zone Node and its empty NRT: (topology, node name, uid, the NRT collection path)."""
    ((_, topo),) = workload.topologies(tmp_path, (DUMP,))
    node = f"{namespace}-node"
    uid = cluster.create_node_object(node, *node_resources(topo), api=api)
    nrt_path = resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL)
    api.create(nrt_path, nrt_object((node, uid), topo, State(), topology_manager_policy="single-numa-node",
                                    topology_manager_scope="pod"))
    return topo, node, uid, nrt_path


def test_bound_pods_run_pinned_and_the_nrt_follows(cluster: Cluster, api: KubeClient, namespace: str,
                                                   tmp_path: Any) -> None:
    topo, node, uid, nrt_path = _node(cluster, api, namespace, tmp_path)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    filler = api.create(pods, _pod("fill-0", node, 4))

    def nrt() -> dict[str, Any]:
        return dict(api.get(f"{nrt_path}/{node}"))

    def phase(name: str) -> str | None:
        return (api.get(f"{pods}/{name}").get("status") or {}).get("phase")

    agents = NodeAgents(cluster, SimpleNamespace(nodes=[{"metadata": {"name": node, "uid": uid}}],
                                                 pods=[filler]),
                        lambda _node: topo, "pod", namespace, namespace)
    try:
        agents.prime()
        assert phase("fill-0") == "Running"
        assert sorted(_zones_free(nrt())) == [4, 8]
        assert _fingerprint(nrt()) == pod_set_fingerprint([(namespace, "fill-0")])

        agents.start()
        api.create(pods, _pod("six", node, 6))  # only the empty zone holds it
        want = pod_set_fingerprint([(namespace, "fill-0"), (namespace, "six")])
        _wait("the six-CPU pod in the NRT", lambda: _fingerprint(nrt()) == want)
        _wait("the six-CPU pod Running", lambda: phase("six") == "Running")
        assert sorted(_zones_free(nrt())) == [2, 4]
        assert agents.aligned() == 1

        api.create(pods, _pod("five", node, 5))  # no zone holds it: it runs across both, unaligned
        want = pod_set_fingerprint([(namespace, "fill-0"), (namespace, "six"), (namespace, "five")])
        _wait("the five-CPU pod in the NRT", lambda: _fingerprint(nrt()) == want)
        assert sum(_zones_free(nrt())) == 1
        assert agents.aligned() == 1
        assert agents.errors == []
    finally:
        agents.stop()
        api.request("DELETE", f"/api/v1/nodes/{node}")


class _SlowWrites(NodeAgents):
    """NRT writes that take a second to start, as on a loaded API server; counted."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.writes = 0

    def _publish(self, node: Any) -> None:
        self.writes += 1
        time.sleep(1.0)
        super()._publish(node)


def test_a_slow_nrt_write_is_not_queued_again(cluster: Cluster, api: KubeClient, namespace: str,
                                              tmp_path: Any) -> None:
    """While a node's NRT write waits, the publisher queues no second one for it (it did, ten a second,
    which flooded the API server with duplicate writes and grew the bench by gigabytes in long runs)."""
    topo, node, uid, nrt_path = _node(cluster, api, namespace, tmp_path)
    agents = _SlowWrites(cluster, SimpleNamespace(nodes=[{"metadata": {"name": node, "uid": uid}}], pods=[]),
                         lambda _node: topo, "pod", namespace, namespace)
    try:
        agents.prime()
        primed = agents.writes
        agents.start()
        api.create(f"/api/v1/namespaces/{namespace}/pods", _pod("two", node, 2))
        want = pod_set_fingerprint([(namespace, "two")])
        _wait("the pod in the NRT", lambda: _fingerprint(dict(api.get(f"{nrt_path}/{node}"))) == want)
        time.sleep(1.5)  # the publisher looks ten times a second
        assert agents.writes - primed == 1
        ((key, where, _, aligned),) = agents.placements
        assert (key, where, aligned) == (f"{namespace}/two", node, True)
    finally:
        agents.stop()
        api.request("DELETE", f"/api/v1/nodes/{node}")


def test_the_workload_in_parts_is_the_whole_cluster(tmp_path: Any) -> None:
    """bench/admission.py reads 65,000 nodes `cluster_parts` at a time: the same nodes as `cluster`."""
    topos = workload.topologies(tmp_path, (DUMP, "64fake-4n2s2ca2c2t"))
    whole = workload.cluster(23, topos, 7)
    parts = list(workload.cluster_parts(23, topos, 7, size=5))
    assert [len(p.nodes) for p in parts] == [5, 5, 5, 5, 3]
    for field in ("nodes", "nrts", "pods"):
        assert [o for p in parts for o in getattr(p, field)] == getattr(whole, field)
    assert workload.cluster(0, topos, 7).nodes == []

"""The cluster view from API objects: what is free, what is left out and why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agent.admission.cluster.ledger import Entry, Ledger
from agent.admission.cluster.view import build_view, pod_requests
from agent.admission.engine.model import Resources, Taint

GI = 1 << 30


def node_obj(name: str, cpu: str = "16", memory: str = "64Gi", *, uid: str | None = None,
             ready: str | None = "True", **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"allocatable": {"cpu": cpu, "memory": memory, "pods": "10",
                                              "nvidia.com/gpu": "2"}}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": {"rack": "r1"}},
            "spec": spec, "status": status}


def zone(numa: int, cpu: tuple[int, int], memory: int = 32 * GI, gpus: tuple[int, int] | None = None,
         kind: str = "Node") -> dict[str, Any]:
    def res(name: str, total: int, free: int) -> dict[str, str]:
        return {"name": name, "capacity": str(total), "allocatable": str(total), "available": str(free)}
    resources = [res("cpu", *cpu), res("memory", memory, memory)]
    if gpus is not None:
        resources.append(res("nvidia.com/gpu", *gpus))
    return {"name": f"node-{numa}", "type": kind, "resources": resources}


def nrt_obj(name: str, zones: list[dict[str, Any]], *, owner_uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": owner_uid or f"uid-{name}"}]},
        "zones": zones, "attributes": []}


def pod_obj(name: str, node: str | None, containers: list[dict[str, str]], *,
            init: Sequence[dict[str, str]] = (), phase: str = "Running", job: str | None = None,
            index: str | None = None, sidecars: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {}, "annotations": {}}
    if job:
        meta["labels"]["batch.kubernetes.io/job-name"] = job
    if index is not None:
        meta["annotations"]["batch.kubernetes.io/job-completion-index"] = index
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "resources": {"requests": r}}
                                           for i, r in enumerate(containers)]}
    spec["initContainers"] = [{"name": f"i{i}", "resources": {"requests": r}} for i, r in enumerate(init)]
    spec["initContainers"] += [{"name": f"s{i}", "restartPolicy": "Always", "resources": {"requests": r}}
                               for i, r in enumerate(sidecars)]
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_free_is_allocatable_less_bound_pods_and_zones_are_the_nrt() -> None:
    view, out = build_view(
        [node_obj("a"), node_obj("b")],
        [nrt_obj("a", [zone(1, (8, 3), gpus=(1, 1)), zone(0, (8, 6)), zone(9, (0, 0), kind="Socket")])],
        [pod_obj("p1", "a", [{"cpu": "2", "memory": "4Gi"}]),
         pod_obj("p2", "a", [{"cpu": "500m"}]),
         pod_obj("done", "a", [{"cpu": "8"}], phase="Succeeded"),
         pod_obj("pending", None, [{"cpu": "8"}])],
        Ledger(), 0.0)
    assert out == {}
    a, b = view.nodes
    assert a.free == Resources(cpu_milli=13_500, memory=60 * GI, gpus=2)
    assert a.free_pods == 8
    assert [(z.numa, z.cpu_milli, z.cpu_capacity_milli, z.gpus) for z in a.zones] == [(0, 6000, 8000, 0),
                                                                                       (1, 3000, 8000, 1)]
    assert b.zones == () and b.free.cpu_milli == 16_000
    assert a.labels == {"rack": "r1"}
    empty_a = view.empty[0]
    assert empty_a.free.cpu_milli == 16_000 and [z.cpu_milli for z in empty_a.zones] == [8000, 8000]


@pytest.mark.parametrize(("containers", "init", "sidecars", "cpu"), [
    ([{"cpu": "2"}, {"cpu": "1"}], [], [], 3000),
    ([{"cpu": "2"}], [{"cpu": "4"}], [], 4000),  # the biggest init container wins
    ([{"cpu": "2"}], [{"cpu": "1"}], [{"cpu": "1"}], 3000),  # a sidecar runs beside the app
    ([{"cpu": "1"}], [{"cpu": "4"}], [{"cpu": "1"}], 4000),
])
def test_pod_requests_count_like_the_scheduler(containers: list[dict[str, str]], init: list[dict[str, str]],
                                                sidecars: list[dict[str, str]], cpu: int) -> None:
    r = pod_requests(pod_obj("p", "a", containers, init=init, sidecars=sidecars))
    assert r is not None and r.cpu_milli == cpu


def test_ledger_entries_are_subtracted_until_their_pod_is_bound() -> None:
    ledger = Ledger((Entry("ns/j", "0", "a", 0, Resources(cpu_milli=4000, memory=GI), 0.0),
                     Entry("ns/j", "1", "a", 0, Resources(cpu_milli=2000, memory=GI), 0.0)))
    bound = pod_obj("j-1", "a", [{"cpu": "2", "memory": "1Gi"}], job="j", index="1")
    view, _ = build_view([node_obj("a")], [nrt_obj("a", [zone(0, (8, 8))])], [bound], ledger, 0.0)
    a = view.nodes[0]
    # node totals: the bound pod counts once (from the pods list), the unbound entry from the ledger
    assert a.free.cpu_milli == 16_000 - 2000 - 4000
    assert a.free_pods == 10 - 2
    # zones: the NRT does not show either yet, so both come off
    assert a.zones[0].cpu_milli == 8000 - 6000


@pytest.mark.parametrize(("nodes", "nrts", "reason"), [
    ([node_obj("a", ready="False")], [], "NotReady"),
    ([node_obj("a")], [nrt_obj("a", [zone(0, (8, 8))], owner_uid="old")], "stale NRT"),
    ([node_obj("a", cpu="lots")], [], "malformed quantity cpu"),
    ([node_obj("a")], [nrt_obj("a", [{"name": "numa0", "type": "Node"}])], "not node-<N>"),
    ([node_obj("a")], [nrt_obj("a", [{"name": "node-0", "type": "Node", "resources": [
        {"name": "cpu", "available": "x", "allocatable": "8"}]}])],
     "malformed quantity"),
    ([node_obj("a")], [nrt_obj("a", [zone(0, (8, 8)), zone(0, (8, 8))])], "zone twice"),
    ([node_obj("a", taints=[{"key": "k", "effect": "Sometimes"}])], [], "malformed taint"),
])
def test_nodes_left_out_with_a_reason(nodes: list[dict[str, Any]], nrts: list[dict[str, Any]],
                                      reason: str) -> None:
    view, out = build_view(nodes + [node_obj("ok")], nrts, [], Ledger(), 0.0)
    assert [n.name for n in view.nodes] == ["ok"]
    assert reason in out["a"]


def test_node_without_conditions_counts_as_ready_and_spec_fields_are_read() -> None:
    obj = node_obj("a", ready=None, unschedulable=True,
                   taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])
    view, out = build_view([obj], [], [], Ledger(), 0.0)
    assert out == {}
    assert view.nodes[0].unschedulable
    assert view.nodes[0].taints == (Taint("gpu", "yes", "NoSchedule"),)


@pytest.mark.parametrize("cpu", ["two", "1e33", "9" * 5000, "²"])
def test_pod_with_unreadable_requests_costs_only_itself(cpu: str) -> None:
    """A bound pod with `cpu: 1e33` (the API server takes it): its node stays, the pod counts as one
    pod requesting nothing, and the other pods' requests still count."""
    pods = [pod_obj("p", "a", [{"cpu": cpu}]), pod_obj("q", "a", [{"cpu": "2"}])]
    view, out = build_view([node_obj("a")], [], pods, Ledger(), 0.0)
    assert out == {}
    (node,) = view.nodes
    assert node.free.cpu_milli == 14_000 and node.free_pods == 8


NIC = "example.com/nic"


def device_zone(numa: int, nics: tuple[int, int]) -> dict[str, Any]:
    z = zone(numa, (8, 8))
    z["resources"].append({"name": NIC, "capacity": str(nics[0]), "allocatable": str(nics[0]),
                           "available": str(nics[1])})
    return z


def test_device_plugin_resources_per_zone_and_at_node_level() -> None:
    obj = node_obj("a")
    obj["status"]["allocatable"].update({NIC: "4", "example.com/fpga": "2", "kubernetes.io/x": "7"})
    pods = [pod_obj("p", "a", [{"cpu": "1", NIC: "1", "example.com/fpga": "1"}])]
    ledger = Ledger((Entry("ns/j", "0", "a", 1, Resources(cpu_milli=1000, devices={NIC: 1}), 0.0),))
    view, out = build_view([obj], [nrt_obj("a", [device_zone(0, (2, 1)), device_zone(1, (2, 2))])], pods,
                           ledger, 0.0)
    assert out == {}
    a = view.nodes[0]
    # node level: allocatable less the bound pod and the unbound ledger entry; kubernetes.io's own
    # names are not devices
    assert a.free.devices == {NIC: 2, "example.com/fpga": 1}
    # per zone: the NRT's available, less the ledger entry counted on zone 1
    assert [dict(z.devices) for z in a.zones] == [{NIC: 1}, {NIC: 1}]
    assert [dict(z.devices) for z in view.empty[0].zones] == [{NIC: 2}, {NIC: 2}]
    assert pod_requests(pods[0]) == Resources(cpu_milli=1000, devices={NIC: 1, "example.com/fpga": 1})


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("Example.com/nic", "1", "invalid extended resource name"),
    ("example.com/nic", "1500m", "not a whole number"),
    ("example.com/nic", "-1", "malformed quantity"),
    ("example.com/nic", "lots", "malformed quantity"),
])
def test_bad_devices_cost_only_their_node_or_pod(name: str, value: str, reason: str) -> None:
    bad_node = node_obj("a")
    bad_node["status"]["allocatable"][name] = value
    bad_zone = device_zone(0, (1, 1))
    bad_zone["resources"][-1].update({"name": name, "available": value})
    view, out = build_view([bad_node, node_obj("b"), node_obj("ok")],
                           [nrt_obj("b", [bad_zone])], [], Ledger(), 0.0)
    assert [n.name for n in view.nodes] == ["ok"]
    assert reason in out["a"] and reason in out["b"]
    assert pod_requests(pod_obj("p", "ok", [{"cpu": "1", name: value}])) is None

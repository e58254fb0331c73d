"""A JobSet queued on the native route runs on the real node, pinned from its pods' first instruction.

Real parts: kubelet v1.37.2, containerd v2.4.2 with NRI, runc, the agent on the node's NRI socket
(bench/realnode_arms.py's NRI arm), the real JobSet controller v0.11.1 (tests/controlplane/operators.py,
started on this session's real-node cluster), `topolet controller` and its placement policy.  The JobSet,
created suspended and labelled `topolet.io/queue`, has two replicated Jobs: `exclusive` (one Guaranteed
1-CPU pod, single-numa-node) and `shared` (one Guaranteed 250m pod).  The controller admits it whole,
the placement policy pins each pod to its slot on the node (and the exclusive one to its zone), and the
agent pins the exclusive pod's container as NRI creates it: what its first instruction reads of itself
(`/proc/self/status` with shell builtins, then `nproc`) is its allocation in the agent's state, and the
shared pod's first instruction sees none of it.  The node has two CPUs: one exclusive CPU at most.

Needs what tests/realnode needs, containerd 2.4.2 and two CPUs: a skip on a laptop, a failure under
CI=true.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent.topology.cpuset import CPUSet
from tests.conftest import require
from tests.controlplane.cluster import Cluster
from tests.controlplane.operators import collection_path, jobset, start_operators
from tests.realnode.node import RealNodeParts, wait
from tests.realnode.test_first_instruction import arms_module

pytestmark = pytest.mark.integration

NS = "default"


def _template(cpu: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    from tests.realnode.node import guaranteed_pod

    arms = arms_module()
    pod = guaranteed_pod("unused", node, cpu=cpu, annotations=annotations)
    pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", arms.FIRST_INSTRUCTIONS]
    pod["spec"]["restartPolicy"] = "Never"
    return {"metadata": {"annotations": annotations}, "spec": pod["spec"]}


def queued_jobset(name: str, node: str) -> dict[str, Any]:
    body = jobset(name, None, replicas=1, pods=1)
    body["metadata"]["labels"] = {"topolet.io/queue": "default"}
    body["spec"]["suspend"] = True
    (only,) = body["spec"]["replicatedJobs"]
    shared = json.loads(json.dumps(only))
    only["name"], shared["name"] = "exclusive", "shared"
    aligned = {"topolet.io/numa-policy": "single-numa-node"}
    only["template"]["spec"]["template"] = _template("1", node, aligned)
    shared["template"]["spec"]["template"] = _template("250m", node, {})
    body["spec"]["replicatedJobs"] = [only, shared]
    return body


def test_a_native_jobset_runs_pinned_from_its_first_instruction(
        realnode_cluster: Cluster, realnode_parts: RealNodeParts, tmp_path: Path) -> None:
    arms = arms_module()
    require(realnode_parts.containerd2 is not None, "no containerd 2.4.2 among the real node's parts")
    require(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs to tell a pinned pod from the pool")
    arm = arms.Arm(arms.NRI, realnode_cluster, realnode_parts)
    operators = None
    name = f"rn-{uuid.uuid4().hex[:6]}"
    path = collection_path("JobSet", NS)
    try:
        arm.start()
        operators = start_operators(realnode_cluster, tmp_path / "operators", names=("jobset",))
        realnode_cluster.start_controller("--resync-seconds", "2", "--kueue", "off")
        node = arm.node
        held = arms.Held(node, arm.agent)
        with node.api() as api:
            api.create(path, queued_jobset(name, node.name))

            def pods() -> list[dict[str, Any]]:
                listed = api.list(f"/api/v1/namespaces/{NS}/pods",
                                  {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={name}"})
                out = [p for p in listed.get("items") or []
                       if (p.get("status") or {}).get("phase") == "Running"]
                return out if len(out) == 2 else []

            running = {p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"]: p
                       for p in wait(pods, f"both pods of JobSet {name} Running", 180)}
            made = api.get(f"{path}/{name}")
            record = json.loads(made["metadata"]["annotations"]["topolet.io/admission"])
            assert record["result"] == "admitted" and made["spec"]["suspend"] is False
            # Slots in name order: exclusive 0, shared 1; both on this node, the exclusive one in a zone.
            assert [record["placement"][s]["node"] for s in ("0", "1")] == [node.name, node.name]
            exclusive, shared = running["exclusive"], running["shared"]
            for pod in (exclusive, shared):
                assert pod["spec"]["nodeName"] == node.name
                assert not pod["spec"].get("schedulingGates")
            zone = record["placement"]["0"]["zone"]
            assert exclusive["metadata"]["annotations"]["topolet.io/numa-zone"] == str(zone)

            mine = held.of(exclusive["metadata"]["uid"])
            assert "c" in mine, f"no allocation: {arm.agent.log()[-3000:] if arm.agent else ''}"
            cpus, mems = mine["c"]
            seen = arms.first_read(node, exclusive, "c")
            assert arms.seen_as(seen) == (cpus.cpulist(), mems.cpulist(), str(len(cpus))), seen
            seen_shared = arms.first_read(node, shared, "c")
            print(f"\nexclusive pod: first instruction saw {arms.seen_as(seen)}, allocation "
                  f"{cpus.cpulist()}; shared pod saw {arms.seen_as(seen_shared)}")
            assert not CPUSet.parse(seen_shared.get("Cpus_allowed_list", "")) & cpus, seen_shared
            api.request("DELETE", f"{path}/{name}", body={"propagationPolicy": "Foreground"},
                        content_type="application/json")
            wait(lambda: not held.of(exclusive["metadata"]["uid"]), "the exclusive pod's CPU released", 120)
    finally:
        realnode_cluster.stop_controllers()
        if operators is not None:
            operators.stop()
        arm.close()

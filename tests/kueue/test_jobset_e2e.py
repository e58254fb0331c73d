"""A JobSet gang placed pod by pod through Kueue, end to end: real Kueue v0.17.0 and the real JobSet
controller v0.11.1 (tests/controlplane/operators.py), the `topolet.io/topology-fit` check decided by
`topolet controller --kueue on`, the kueue component's placement policy, the real kube-scheduler and
the nodes' agents.

Each node of DUMP has 4 NUMA zones of 16 CPUs: single-numa-node pods of 12 CPUs take a zone each, so a
JobSet of 2 Jobs x 3 such pods spans both nodes by construction.  The check's Ready state carries the
slots by rank and the rank rule Kueue's topologyRequest gives (job index x 3 + completion index); Kueue
copies both onto the JobSet's template, the JobSet controller into its Jobs, the Job controller into
the pods, and the policy pins each pod to its rank's slot.  Deleting the JobSet frees every slot: a
second one, Retried while the first holds its zones, is then placed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.api.ranks import parse_rank_rule
from tests.controlplane.fixtures import kueue, kueue_session, operators
from tests.controlplane.kueue import KueueScope, kueue_path
from tests.controlplane.operators import Operators, collection_path, jobset
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import FAILSAFE, slots
from tests.kueue.test_check_e2e import NUMA, Setup

__all__ = ["kueue", "kueue_session", "operators"]

pytestmark = pytest.mark.integration

REQUESTS = {"cpu": "12", "memory": "64Mi"}


def submit(s: Setup, name: str) -> dict[str, Any]:
    """A JobSet of 2 Jobs x 3 single-numa-node pods of 12 CPUs, queued in the setup's LocalQueue."""
    body = jobset(name, "lq", replicas=2, pods=3, requests=REQUESTS)
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {"annotations": NUMA}
    made: dict[str, Any] = s.api.create(collection_path("JobSet", s.ns), body)
    return made


def state_of(s: Setup, uid: str) -> dict[str, Any]:
    """Our check's state on the JobSet's Workload ({} before there is one)."""
    listed = s.api.list(kueue_path("workloads", namespace=s.ns),
                        {"labelSelector": f"kueue.x-k8s.io/job-uid={uid}"})
    for wl in listed.get("items") or []:
        for entry in wl.get("status", {}).get("admissionChecks") or []:
            if entry["name"] == s.check:
                return dict(entry)
    return {}


def pods_of(s: Setup, name: str) -> list[dict[str, Any]]:
    listed = s.api.list(f"/api/v1/namespaces/{s.ns}/pods",
                        {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={name}"})
    return [p for p in listed.get("items") or [] if not p["metadata"].get("deletionTimestamp")]


def placed_by_rank(s: Setup, name: str, uid: str) -> bool:
    """Every pod of the JobSet bound on its rank's slot, in its zone, and pinned there by the agent."""
    state = state_of(s, uid)
    pods = pods_of(s, name)
    if state.get("state") != "Ready" or len(pods) != 6 or not all(p["spec"].get("nodeName") for p in pods):
        return False
    (update,) = state["podSetUpdates"]
    rule = parse_rank_rule(update["annotations"]["topolet.io/placement-rank"])
    assert rule is not None and rule.per_sub_group == 3, update
    placed = slots(state)
    assert len({n for n, _ in placed}) == 2  # both nodes: the gang cannot fit one
    ranks = set()
    for pod in pods:
        meta = pod["metadata"]
        rank = rule.rank(meta)
        assert rank is not None, meta
        ranks.add(rank)
        node, zone = placed[rank]
        assert pod["spec"]["nodeName"] == node and meta["annotations"]["topolet.io/numa-zone"] == str(zone)
        assert FAILSAFE not in pod["spec"]["nodeSelector"]
        assert "topolet.io/placements" not in meta["annotations"]
        assert "topolet.io/placement-rank" not in meta["annotations"]
        sim = s.kueue.cluster.nodes[node]
        allocs = [a for a in sim.state().allocations if a.owner.pod_uid == meta["uid"]]
        if not allocs:
            return False
        assert {sim.topology.numa_of(c) for c in allocs[0].cpus} == {zone}
    assert ranks == set(range(6))  # one pod a slot
    return True


def test_a_jobset_lands_pod_by_pod_and_frees_its_slots(
        kueue: KueueScope, operators: Operators, dump_root: Callable[[str], Path]) -> None:
    assert operators.running("jobset")
    # Quota for two such gangs (72 CPUs each): only the zones keep the second out.
    s = Setup(kueue, dump_root, 160)
    first = submit(s, f"a-{uuid.uuid4().hex[:4]}")
    name, uid = first["metadata"]["name"], first["metadata"]["uid"]
    wait_for(lambda: placed_by_rank(s, name, uid), "the JobSet's pods on their ranks' slots", timeout=180)

    second = submit(s, "b")
    wait_for(lambda: state_of(s, second["metadata"]["uid"]).get("state") == "Retry",
             "the second JobSet Retried while the first holds its zones", timeout=120)
    assert "pod needs 12 CPUs" in state_of(s, second["metadata"]["uid"])["message"]
    s.api.request("DELETE", f"{collection_path('JobSet', s.ns)}/{name}",
                  body={"propagationPolicy": "Foreground"}, content_type="application/json")
    wait_for(lambda: placed_by_rank(s, "b", second["metadata"]["uid"]),
             "the second JobSet placed once the first is deleted", timeout=240)

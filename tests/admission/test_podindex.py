"""The pod index kept across passes, and the view and ledger built from it with a per-node memo: the
same answers as built from scratch, whatever changed between passes."""

from __future__ import annotations

import copy
import random
from typing import Any

from agent.admission.cluster.ledger import Entry, Ledger, agent_pins, job_slot
from agent.admission.cluster.podindex import NodeUse, PodIndex
from agent.admission.cluster.view import build_view, pod_requests
from agent.admission.engine.model import Resources
from tests.admission.test_ledger import pod as ledger_pod
from tests.admission.test_view import node_obj, nrt_obj, pod_obj, zone

GI = 1 << 30


def versioned(obj: dict[str, Any], rv: int, uid: str | None = None) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = str(rv)
    obj["metadata"]["uid"] = uid or obj["metadata"].get("uid") or f"uid-{obj['metadata']['name']}"
    return obj


def index_of(pods: list[dict[str, Any]], index: PodIndex | None = None) -> PodIndex:
    return (index or PodIndex(pod_requests, agent_pins)).update(pods, job_slot)


def test_used_sums_the_live_bound_pods_of_each_node() -> None:
    pods = [versioned(pod_obj("a", "n1", [{"cpu": "2", "memory": "1Gi"}]), 1),
            versioned(pod_obj("b", "n1", [{"cpu": "500m"}]), 2),
            versioned(pod_obj("done", "n1", [{"cpu": "8"}], phase="Succeeded"), 3),
            versioned(pod_obj("c", "n2", [{"cpu": "1"}]), 4),
            versioned(pod_obj("unbound", None, [{"cpu": "4"}]), 5)]
    index = index_of(pods)
    assert index.used("n1") == NodeUse(Resources(cpu_milli=2500, memory=GI), 2)
    assert index.used("n2") == NodeUse(Resources(cpu_milli=1000), 1)
    assert index.used("n3") == NodeUse()


def test_a_pod_with_unreadable_requests_counts_as_a_pod_and_is_named() -> None:
    bad = versioned(pod_obj("bad", "n1", [{"cpu": "1e33"}]), 1)
    index = index_of([bad, versioned(pod_obj("a", "n1", [{"cpu": "1"}]), 2)])
    assert index.used("n1") == NodeUse(Resources(cpu_milli=1000), 2, (bad,))
    assert index.unreadable() == [bad]


def test_versions_move_only_for_the_nodes_whose_pods_changed() -> None:
    pods = [versioned(pod_obj("a", "n1", [{"cpu": "1"}]), 1),
            versioned(pod_obj("b", "n2", [{"cpu": "1"}]), 2)]
    index = index_of(pods)
    v1, v2 = index.version("n1"), index.version("n2")
    index_of(pods, index)  # the same versions: nothing moves
    assert (index.version("n1"), index.version("n2")) == (v1, v2)
    pods[0] = versioned(pod_obj("a", "n1", [{"cpu": "3"}]), 7)
    index_of(pods, index)
    assert index.version("n1") != v1 and index.version("n2") == v2
    assert index.used("n1").requests.cpu_milli == 3000
    index_of(pods[1:], index)  # a is gone
    assert index.used("n1") == NodeUse() and index.version("n1") == 0


def test_a_pod_without_a_version_is_read_every_time() -> None:
    pod = pod_obj("a", "n1", [{"cpu": "1"}])
    pod["metadata"]["uid"] = "u"
    index = index_of([pod])
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    index_of([pod], index)
    assert index.used("n1").requests.cpu_milli == 2000


def test_slots_and_eligible_pods() -> None:
    pinned = versioned(ledger_pod("j-0", "n1"), 1)  # Guaranteed, running: its agent pins it
    shared = versioned(ledger_pod("s", "n1", job="s", cpu="500m"), 2)
    index = index_of([pinned, shared])
    facts = index.slot(("ns/j", "0"))
    assert facts is not None and facts.node == "n1" and facts.ident == ("ns", "j-0")
    assert index.eligible("n1") == (("ns", "j-0"),)
    assert index.slot(("ns/j", "1")) is None


# -- the memoised view and the indexed ledger against the plain ones ----------------------------------

def _cluster(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, nrts = [], []
    for i in range(6):
        name = f"n{i}"
        nodes.append(versioned(node_obj(name), 100 + i))
        nrts.append(versioned(nrt_obj(name, [zone(0, (8, 8)), zone(1, (8, rng.randint(2, 8)))]), 200 + i))
    return nodes, nrts


def test_memoised_view_matches_a_fresh_build_through_random_changes() -> None:
    rng = random.Random(7)
    nodes, nrts = _cluster(rng)
    pods: list[dict[str, Any]] = []
    entries: list[Entry] = []
    rv = 1000
    index = PodIndex(pod_requests, agent_pins)
    memo: dict[str, Any] = {}
    for step in range(300):
        rv += 1
        action = rng.random()
        if action < 0.35 or not pods:  # a gang pod appears, with its ledger entry
            job, slot, node = f"j{step}", "0", f"n{rng.randrange(6)}"
            pod = pod_obj(f"{job}-0", node if rng.random() < 0.5 else None, [{"cpu": str(rng.randint(1, 3))}],
                          job=job, index=slot)
            pods.append(versioned(pod, rv, uid=f"p{step}"))
            entries.append(Entry(f"ns/{job}", slot, node, rng.choice([0, 1, None]),
                                 Resources(cpu_milli=1000), 0.0))
        elif action < 0.55:  # a pod is bound, finishes or changes
            pod = copy.deepcopy(rng.choice(pods))
            pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or f"n{rng.randrange(6)}"
            if rng.random() < 0.3:
                pod["status"]["phase"] = "Succeeded"
            pods = [pod if p["metadata"]["uid"] == pod["metadata"]["uid"] else p for p in pods]
            versioned(pod, rv)
        elif action < 0.7:  # a pod is deleted
            pods.pop(rng.randrange(len(pods)))
        elif action < 0.8 and entries:  # an entry clears
            entries.pop(rng.randrange(len(entries)))
        elif action < 0.9:  # a node changes (cordoned, or its allocatable)
            i = rng.randrange(6)
            nodes[i] = copy.deepcopy(nodes[i])
            nodes[i]["spec"]["unschedulable"] = rng.random() < 0.5
            versioned(nodes[i], rv)
        else:  # an NRT is published again
            i = rng.randrange(6)
            nrts[i] = versioned(nrt_obj(f"n{i}", [zone(0, (8, rng.randint(0, 8))), zone(1, (8, 8))]), rv)
        ledger = Ledger(tuple(entries), timeout=1e9)
        fresh, fresh_out = build_view(nodes, nrts, pods, ledger, 0.0)
        kept, kept_out = build_view(nodes, nrts, pods, ledger, 0.0, index=index.update(pods, job_slot),
                                    memo=memo)
        assert (kept, kept_out) == (fresh, fresh_out), f"step {step}"
        assert ledger.settle(nrts, pods, 0.0, index=index) == ledger.settle(nrts, pods, 0.0), f"step {step}"


def test_requests_are_read_again_only_when_the_spec_changed() -> None:
    calls: list[str] = []

    def counted(pod: dict[str, Any]) -> Resources | None:
        calls.append(pod["metadata"]["name"])
        return pod_requests(pod)

    pod = versioned(pod_obj("a", None, [{"cpu": "1"}]), 1)
    index = PodIndex(counted, agent_pins).update([pod], job_slot)
    bound = versioned(copy.deepcopy(pod), 2)
    bound["spec"]["nodeName"] = "n1"
    index.update([bound], job_slot)
    assert index.used("n1").requests.cpu_milli == 1000
    assert calls == ["a"]  # read once: nothing was read of the unbound version
    resized = versioned(copy.deepcopy(bound), 3)
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    index.update([resized], job_slot)
    assert index.used("n1").requests.cpu_milli == 2000 and calls == ["a", "a"]
    again = versioned(copy.deepcopy(resized), 4)  # a status update: the same spec
    index.update([again], job_slot)
    assert index.used("n1").requests.cpu_milli == 2000 and calls == ["a", "a"]

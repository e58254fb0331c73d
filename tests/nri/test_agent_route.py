"""The agent's NRI route end to end against NRI's own runtime side (pkg/adaptation, as containerd
embeds it, in main.go's -script mode): the real PinningEngine, state file, PodPinner and NRIPinning
over real cgroup v1/v2 cpusets in a private root, with processes in them; only the kubelet and runc
are played by the test (tests/nri/agent_parts.py): pod and container cgroups made as they make them,
the container's cpuset taken from the runtime's adjusted spec.

Checked: CreateContainer's adjustment is the state file's allocation (committed before the answer)
and its updates narrow the shared containers; StopContainer releases and widens them again; the pod
watch seeing the same pod afterwards (waiting, then running) neither allocates again nor releases;
Synchronize after an agent restart pins what started meanwhile and releases what stopped; a runtime
restart brings a new connection and a new Synchronize; refusals answer the shared pool and warn;
an internal error fails only a container that asks for exclusive CPUs.

Needs root, a writable cpuset hierarchy with 2 CPUs or more, and go: skips on a laptop, fails under
CI=true.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.api.podplan import plan_pod
from agent.api.qos import QOSClass
from agent.enforce.state import State
from agent.kube.pods.pinner import alloc_id
from agent.kube.pods.watch import Changed, Synced
from agent.topology.cpuset import CPUSet
from tests.conftest import require, writable_cpuset_hierarchy
from tests.nri.agent_parts import AgentParts, Container, Node, api_pod, bound_pod, connected, private_node
from tests.nri.goruntime import ScriptedRuntime


@pytest.fixture
def node(short_tmp: Path) -> Iterator[Node]:
    system = writable_cpuset_hierarchy()
    with private_node(system, short_tmp) as n:
        require(len(n.cpus) >= 2, "needs at least 2 CPUs")
        yield n


@pytest.fixture
def runtime(runtime_binary: str, short_tmp: Path) -> Iterator[ScriptedRuntime]:
    rt = ScriptedRuntime(runtime_binary, short_tmp / "nri.sock")
    try:
        rt.wait_listening()
        yield rt
    finally:
        rt.close()


def cpuset_of(adjust_or_update: dict[str, Any]) -> tuple[str, str]:
    """(cpus, mems) of an adjustment or update as the runtime printed it (protojson)."""
    cpu = adjust_or_update.get("linux", {}).get("resources", {}).get("cpu", {})
    return str(cpu.get("cpus", "")), str(cpu.get("mems", ""))


def updates(reply: dict[str, Any]) -> dict[str, str]:
    """Container id → cpus of the updates in a reply (or a Synchronize line)."""
    listed = reply.get("update") or (reply.get("response") or {}).get("update") or []
    return {u["container_id"]: cpuset_of(u)[0] for u in listed}


def allocations(parts: AgentParts) -> State:
    return parts.state_file.load(missing_ok=True)


def start_shared(node: Node, runtime: ScriptedRuntime) -> Container:
    """A Burstable pod's container that runs before the agent connects (the runtime lists it)."""
    pod = node.pod("shared", QOSClass.BURSTABLE)
    shared = node.container(pod, "app", 100, limit=False)
    node.start(shared)
    pods, containers = node.live()
    runtime.request("existing", pods=pods, containers=containers)
    return shared


def test_create_pins_before_the_container_runs_and_the_watch_agrees(node: Node,
                                                                    runtime: ScriptedRuntime) -> None:
    shared = start_shared(node, runtime)
    parts = AgentParts(node.layout, node.tmp / "state")
    try:
        assert parts.connect(runtime.socket) == "nri"
        sync = runtime.wait_event("Synchronize")
        everything = node.cpus
        assert updates(sync) == {shared.message.id: everything.cpulist()}

        pod = node.pod("pinned", QOSClass.GUARANTEED, {"topolet.io/smt": "any"})
        g = node.container(pod, "main", 1000)
        reply = runtime.request("create", pod=pod, container=g.message)
        assert "error" not in reply, reply
        cpus, mems = cpuset_of(reply["response"]["adjust"])
        (alloc,) = allocations(parts).allocations
        # The record came first and names the cgroup runc is about to make; the answer is that record.
        want = (alloc_id(pod.uid, "main"), g.cgroup, "main")
        assert (alloc.id, alloc.cgroup, alloc.owner.container) == want
        assert CPUSet.parse(cpus) == alloc.cpus and len(alloc.cpus) == 1 and mems == ""
        pool = everything - alloc.cpus
        assert updates(reply) == {shared.message.id: pool.cpulist()}  # narrowed through the runtime...
        assert node.cgroup_cpus(shared) == pool  # ...and in its cgroup by the engine

        # runc makes the container with the adjusted cpuset: its first instruction runs there.
        pid = node.start(g, cpus)
        assert node.cgroup_cpus(g) == alloc.cpus and pid > 0
        generation = allocations(parts).generation
        # The watch sees the pod: first with the container still waiting, then running.
        parts.pinner.handle(Changed(plan_pod(api_pod(g, running=False))))
        assert allocations(parts).allocations == (alloc,), "the watch released a pin it had not seen run"
        parts.pinner.handle(Changed(plan_pod(api_pod(g, running=True))))
        parts.pinner.handle(Synced({pod.uid: plan_pod(api_pod(g, running=True))}))  # a relist as well
        assert allocations(parts).allocations == (alloc,)
        assert allocations(parts).generation == generation, "the watch rewrote the state"
        assert parts.allocated() == 1.0
        assert parts.pinner.created == {}  # handed over to the watch
        parts.engine.reconcile()  # drift repair writes the same CPUs
        assert node.cgroup_cpus(g) == alloc.cpus

        # UpdateContainer (a resize the kubelet sends) keeps the container's cpuset.
        reply = runtime.request("update", pod=pod, container=g.message,
                                resources=g.message.linux.resources)
        assert updates(reply) == {g.message.id: alloc.cpus.cpulist()}

        node.stop(g)
        reply = runtime.request("stop", pod=pod, container=g.message)
        assert "error" not in reply, reply
        assert allocations(parts).allocations == ()
        assert updates(reply) == {shared.message.id: everything.cpulist()}
        assert node.cgroup_cpus(shared) == everything
        reply = runtime.request("remove", pod=pod, container=g.message)  # idempotent
        assert "error" not in reply and parts.allocated("released") == 1.0
        # The watch hears of the stop afterwards: nothing left to release.
        parts.pinner.handle(Changed(plan_pod(api_pod(g, running=False) | {"status": {"phase": "Succeeded"}})))
        assert parts.allocated("released") == 1.0
    finally:
        parts.stop()


def test_the_watch_first_then_nri_synchronize_allocates_once(node: Node, runtime: ScriptedRuntime) -> None:
    start_shared(node, runtime)
    parts = AgentParts(node.layout, node.tmp / "state")
    pod = node.pod("early", QOSClass.GUARANTEED)
    g = node.container(pod, "main", 1000)
    node.start(g)  # started while no plugin was connected: on every CPU
    parts.pinner.handle(Changed(plan_pod(api_pod(g, running=True))))  # the watch pins it first
    (alloc,) = allocations(parts).allocations
    pods, containers = node.live()
    runtime.request("existing", pods=pods, containers=containers)
    try:
        parts.connect(runtime.socket)
        sync = runtime.wait_event("Synchronize")
        assert allocations(parts).allocations == (alloc,) and parts.allocated() == 1.0
        assert updates(sync)[g.message.id] == alloc.cpus.cpulist()
    finally:
        parts.stop()


def test_a_restarted_agent_pins_what_started_meanwhile(node: Node, runtime: ScriptedRuntime) -> None:
    shared = start_shared(node, runtime)
    first = AgentParts(node.layout, node.tmp / "state")
    first.connect(runtime.socket)
    runtime.wait_event("Synchronize")
    pod_a = node.pod("a", QOSClass.GUARANTEED)
    a = node.container(pod_a, "main", 1000)
    reply = runtime.request("create", pod=pod_a, container=a.message)
    node.start(a, cpuset_of(reply["response"]["adjust"])[0])
    first.stop()  # the agent is killed: no plugin answers now

    # Meanwhile a stops and b starts unpinned (the runtime asks no plugin: none is connected).
    node.stop(a)
    runtime.request("stop", pod=pod_a, container=a.message)
    pod_b = node.pod("b", QOSClass.GUARANTEED)
    b = node.container(pod_b, "main", 1000)
    reply = runtime.request("create", pod=pod_b, container=b.message)
    assert cpuset_of((reply["response"] or {}).get("adjust") or {}) == ("", "")
    node.start(b)
    assert node.cgroup_cpus(b) == node.cpus
    pods, containers = node.live()
    runtime.request("existing", pods=pods, containers=containers)

    second = AgentParts(node.layout, node.tmp / "state")  # the restarted agent, the same state file
    try:
        second.connect(runtime.socket)
        sync = runtime.wait_event("Synchronize")
        (alloc,) = allocations(second).allocations
        assert alloc.id == alloc_id(pod_b.uid, "main") and alloc.cgroup == b.cgroup
        pool = node.cpus - alloc.cpus
        assert updates(sync) == {b.message.id: alloc.cpus.cpulist(), shared.message.id: pool.cpulist()}
        assert node.cgroup_cpus(b) == alloc.cpus and node.cgroup_cpus(shared) == pool
        assert second.allocated("released") == 1.0  # a's, which stopped while the agent was away
    finally:
        second.stop()


def test_a_restarted_runtime_synchronizes_again(node: Node, runtime_binary: str, short_tmp: Path) -> None:
    first = ScriptedRuntime(runtime_binary, short_tmp / "nri.sock")
    parts = AgentParts(node.layout, node.tmp / "state")
    try:
        first.wait_listening()
        shared = start_shared(node, first)
        parts.connect(first.socket)
        first.wait_event("Synchronize")
        first.close()  # containerd restarts
        second = ScriptedRuntime(runtime_binary, short_tmp / "nri.sock")
        try:
            second.wait_listening()
            pods, containers = node.live()
            second.request("existing", pods=pods, containers=containers)
            sync = second.wait_event("Synchronize", timeout=60)  # the route connected again
            assert updates(sync) == {shared.message.id: node.cpus.cpulist()}
            assert parts.route is not None and connected(parts.route, 2)
        finally:
            second.close()
    finally:
        parts.stop()
        first.close()


def test_refusals_answer_the_shared_pool_and_warn(node: Node, runtime: ScriptedRuntime) -> None:
    start_shared(node, runtime)
    parts = AgentParts(node.layout, node.tmp / "state")
    try:
        parts.connect(runtime.socket)
        runtime.wait_event("Synchronize")
        everything = node.cpus
        too_big = node.pod("too-big", QOSClass.GUARANTEED)
        big = node.container(too_big, "main", 1000 * len(everything))  # the pool would be empty
        reply = runtime.request("create", pod=too_big, container=big.message)
        assert "error" not in reply, reply
        assert cpuset_of(reply["response"]["adjust"])[0] == everything.cpulist()
        assert allocations(parts).allocations == () and not updates(reply)
        assert [(u, r) for u, r, _ in parts.warnings] == [(too_big.uid, "AllocationFailed")]
        assert parts.metrics.registry.get_sample_value(
            "topolet_allocation_refusals_total", {"reason": "capacity"}) == 1.0

        bad = node.pod("bad", QOSClass.GUARANTEED, {"topolet.io/numa-policy": "nearest"})
        ctr = node.container(bad, "main", 1000)
        reply = runtime.request("create", pod=bad, container=ctr.message)
        assert cpuset_of(reply["response"]["adjust"])[0] == everything.cpulist()
        assert (bad.uid, "InvalidAnnotation") in [(u, r) for u, r, _ in parts.warnings]
        assert allocations(parts).allocations == ()
    finally:
        parts.stop()


def test_an_internal_error_fails_only_containers_asking_for_exclusive_cpus(node: Node,
                                                                          runtime: ScriptedRuntime) -> None:
    parts = AgentParts(node.layout, node.tmp / "state", lock_seconds=0.2)
    try:
        parts.connect(runtime.socket)
        runtime.wait_event("Synchronize")
        held, release = threading.Event(), threading.Event()

        def busy_enforcer() -> None:  # the enforcer thread stuck with the pod cache
            with parts.pinner.lock:
                held.set()
                release.wait(10)

        threading.Thread(target=busy_enforcer, daemon=True).start()
        assert held.wait(5)
        pod = node.pod("g", QOSClass.GUARANTEED)
        g = node.container(pod, "main", 1000)
        reply = runtime.request("create", pod=pod, container=g.message)
        assert "PinnerBusy" in reply.get("error", ""), reply  # containerd fails it; the kubelet retries
        be = node.pod("be", QOSClass.BESTEFFORT)
        other = node.container(be, "main", 0, limit=False)
        reply = runtime.request("create", pod=be, container=other.message)
        assert "error" not in reply, reply
        assert cpuset_of((reply["response"] or {}).get("adjust") or {}) == ("", "")  # unadjusted
        release.set()
        reply = runtime.request("create", pod=pod, container=g.message)  # the kubelet's retry
        assert "error" not in reply and cpuset_of(reply["response"]["adjust"])[0]
    finally:
        parts.stop()


def test_the_watch_reserves_ahead_and_create_answers_without_a_write(node: Node,
                                                                     runtime: ScriptedRuntime) -> None:
    shared = start_shared(node, runtime)
    parts = AgentParts(node.layout, node.tmp / "state")
    parts.pinner.ahead = True  # as the agent runs the NRI route (agent.kube.daemon)
    try:
        parts.connect(runtime.socket)
        runtime.wait_event("Synchronize")
        pod = node.pod("pinned", QOSClass.GUARANTEED, {"topolet.io/smt": "any"})
        g = node.container(pod, "main", 1000)
        parts.pinner.handle(Changed(plan_pod(bound_pod(g))))  # bound: the watch allocates now
        (alloc,) = allocations(parts).allocations
        assert alloc.id == alloc_id(pod.uid, "main") and alloc.cgroup != g.cgroup  # a planned cgroup
        pool = node.cpus - alloc.cpus
        assert node.cgroup_cpus(shared) == pool  # the pool shrank when the reservation was made
        writes = parts.state_file.writes

        reply = runtime.request("create", pod=pod, container=g.message)
        assert "error" not in reply, reply
        assert CPUSet.parse(cpuset_of(reply["response"]["adjust"])[0]) == alloc.cpus
        assert parts.state_file.writes == writes, "the answer wrote the state: it was committed ahead"
        assert updates(reply) == {}  # the pool did not move in the request
        node.start(g, cpuset_of(reply["response"]["adjust"])[0])
        assert node.cgroup_cpus(g) == alloc.cpus

        # UpdateContainer before the watch has caught up keeps the reserved CPUs, not the pool.
        reply = runtime.request("update", pod=pod, container=g.message, resources=g.message.linux.resources)
        assert updates(reply) == {g.message.id: alloc.cpus.cpulist()}
        # The status lists it running: the watch moves the allocation to the container's cgroup.
        parts.pinner.handle(Changed(plan_pod(api_pod(g, running=True))))
        (moved,) = allocations(parts).allocations
        assert (moved.cpus, moved.cgroup) == (alloc.cpus, g.cgroup) and parts.allocated() == 1.0
        parts.engine.reconcile()
        assert node.cgroup_cpus(g) == alloc.cpus and node.cgroup_cpus(shared) == pool

        node.stop(g)
        reply = runtime.request("stop", pod=pod, container=g.message)
        assert allocations(parts).allocations == ()
        assert updates(reply) == {shared.message.id: node.cpus.cpulist()}
    finally:
        parts.stop()


def test_a_container_created_unadjusted_while_the_agent_was_away_gets_its_reservation(
        node: Node, runtime: ScriptedRuntime) -> None:
    shared = start_shared(node, runtime)
    first = AgentParts(node.layout, node.tmp / "state")
    first.pinner.ahead = True
    pod = node.pod("pinned", QOSClass.GUARANTEED, {"topolet.io/smt": "any"})
    g = node.container(pod, "main", 1000)
    first.pinner.handle(Changed(plan_pod(bound_pod(g))))  # reserved, then the agent is killed
    (alloc,) = allocations(first).allocations
    reply = runtime.request("create", pod=pod, container=g.message)  # no plugin: unadjusted
    assert cpuset_of((reply["response"] or {}).get("adjust") or {}) == ("", "")
    node.start(g)
    pods, containers = node.live()
    runtime.request("existing", pods=pods, containers=containers)

    second = AgentParts(node.layout, node.tmp / "state")
    second.pinner.ahead = True
    try:
        second.connect(runtime.socket)
        sync = runtime.wait_event("Synchronize")
        pool = node.cpus - alloc.cpus
        # Its reservation, not the pool, and no second allocation.
        assert updates(sync) == {g.message.id: alloc.cpus.cpulist(), shared.message.id: pool.cpulist()}
        assert [a.cpus for a in allocations(second).allocations] == [alloc.cpus]
        assert second.allocated() == 0.0
    finally:
        second.stop()

"""The agent on a real control plane: pods created through the API get exclusive, aligned CPUs in their
real cgroups; shared pods shrink at once; deletions free CPUs; bad annotations give Events; a relist
re-pins nothing; garbage objects do not crash it.  Only the kubelet is a stand-in (kubelet_standin.py).

With 2 CPUs here at most 1 CPU is exclusive while any shared pod exists (the pool is never emptied).
"""

from __future__ import annotations

import signal

from agent.enforce.cgroup import read_cpuset, write_cpuset
from agent.enforce.state_file import StateFile
from agent.topology.cpuset import CPUSet
from tests.kube.kubelet_standin import KubeNode, kube_node, metric_sum, proc_cpus, wait_for

__all__ = ["kube_node"]

G1 = {"cpu": "1", "memory": "64Mi"}  # Guaranteed, one whole CPU


def allowed(node: KubeNode) -> CPUSet:
    return read_cpuset(node.layout, "", effective=True)[0]


def state(node: KubeNode) -> object:
    return StateFile(node.state_dir).load(missing_ok=True)


def results(node: KubeNode) -> dict[str, float]:
    """topolet_allocations_total by result, and the refusals by reason (as `refused:<reason>`)."""
    port = node.metrics_port()
    assert port is not None, "agent serves no metrics yet"
    out = {r: metric_sum(port, "topolet_allocations_total", result=r)
           for r in ("allocated", "refused", "released", "error")}
    return out | {f"refused:{r}": metric_sum(port, "topolet_allocation_refusals_total", reason=r)
                  for r in ("capacity", "alignment", "invalid")}


def test_guaranteed_pod_gets_an_exclusive_cpu_and_shared_pods_shrink(kube_node: KubeNode) -> None:
    node = kube_node
    everything = allowed(node)
    node.start_agent()
    shared = node.run_pod("shared", cpu="100m", memory="32Mi", limits=False)
    wait_for(lambda: node.nrt() is not None, "the first NodeResourceTopology")
    pinned = node.run_pod("pinned", **G1)
    sleeper = pinned.containers["c0"]

    def exclusive_cpu() -> CPUSet | None:
        cpus = proc_cpus(sleeper.pid)
        return CPUSet.parse(cpus) if cpus and len(CPUSet.parse(cpus)) == 1 else None

    mine = wait_for(exclusive_cpu, "the Guaranteed container's process to run on one CPU")
    assert isinstance(mine, CPUSet)
    pool = everything - mine
    wait_for(lambda: proc_cpus(shared.containers["c0"].pid) == pool.cpulist(), "the shared pod to shrink")
    # The record names the kubelet's container cgroup and its owner; the cgroup holds what was recorded.
    # (The pod-cgroup route pinned the pod before its container ran: the watch then names the container.)
    alloc = wait_for(lambda: next((a for a in StateFile(node.state_dir).load().allocations
                                   if a.owner.pod_uid == pinned.uid and a.cgroup == sleeper.cgroup), None),
                     "the record to name the container's cgroup")
    assert alloc.owner.container == "c0" and alloc.cpus == mine
    assert read_cpuset(node.layout, sleeper.cgroup)[0] == mine
    wait_for(lambda: node.nrt_available_cpus() == len(everything) - 1, "NRT to count the allocation")

    node.kubelet.delete_pod(pinned)
    wait_for(lambda: proc_cpus(shared.containers["c0"].pid) == everything.cpulist(),
             "the shared pod to get every CPU back after the deletion")
    wait_for(lambda: node.nrt_available_cpus() == len(everything), "NRT to show the CPU free again")
    assert not StateFile(node.state_dir).load().allocations
    # One pinned, one released (by the pod watch, in-cluster), nothing refused or failed.
    counted = {"allocated": 1.0, "released": 1.0}
    wait_for(lambda: results(node) == {k: counted.get(k, 0.0) for k in results(node)},
             f"the agent to count {counted} (has {results(node)})")
    assert node.agent is not None and node.agent.poll() is None


def test_restarted_container_keeps_its_cpus_and_exited_one_frees_them(kube_node: KubeNode) -> None:
    node = kube_node
    node.start_agent()
    pod = node.run_pod("restarts", **G1)
    first = wait_for(lambda: proc_cpus(pod.containers["c0"].pid) if
                     len(CPUSet.parse(proc_cpus(pod.containers["c0"].pid) or "")) == 1 else None,
                     "the container to be pinned")
    again = node.kubelet.restart_container(pod, "c0")
    wait_for(lambda: proc_cpus(again.pid) == first, "the restarted container (new ID) on the same CPU")
    wait_for(lambda: StateFile(node.state_dir).load().allocations[0].cgroup == again.cgroup,
             "the record to name the restarted container's cgroup")
    node.kubelet.stop_container(pod, "c0", exit_code=0)
    wait_for(lambda: not StateFile(node.state_dir).load().allocations, "the exited container's release")


def test_bad_annotation_gives_an_event_and_keeps_the_pod_shared(kube_node: KubeNode) -> None:
    node = kube_node
    everything = allowed(node)
    node.start_agent()
    pod = node.run_pod("bad", **G1, annotations={"topolet.io/numa-policy": "closest-please"})
    events = wait_for(lambda: [e for e in node.events(pod.uid) if e.reason == "InvalidAnnotation"],
                      "an InvalidAnnotation event on the pod")
    assert events[0].type == "Warning" and "closest-please" in events[0].message
    # Shared pool: every CPU, nothing recorded — and it stays that way across reconciles.
    wait_for(lambda: node.metric("topolet_last_reconcile_timestamp_seconds") > 0, "a reconcile")
    assert proc_cpus(pod.containers["c0"].pid) == everything.cpulist()
    assert not StateFile(node.state_dir).load().allocations
    # A refusal for an invalid annotation, counted once across reconciles; no error.
    assert results(node) == {"allocated": 0, "refused": 1, "released": 0, "error": 0, "refused:capacity": 0,
                             "refused:alignment": 0, "refused:invalid": 1}
    assert node.agent is not None and node.agent.poll() is None


def test_opt_out_and_burstable_opt_in(kube_node: KubeNode) -> None:
    node = kube_node
    everything = allowed(node)
    node.start_agent()
    out = node.run_pod("optout", **G1, annotations={"topolet.io/cpu-policy": "shared"})
    opt_in = node.run_pod("optin", cpu="1", memory="64Mi", annotations={"topolet.io/cpu-policy": "exclusive"})
    # Burstable (memory limit absent is not what makes it Burstable here: cpu request == limit, opt-in).
    wait_for(lambda: len(CPUSet.parse(proc_cpus(opt_in.containers["c0"].pid) or "0-1")) == 1,
             "the opted-in container to be pinned")
    # The opted-out container may be joined to the pool a moment later (its cgroup looked for again).
    pool = (everything - CPUSet.parse(proc_cpus(opt_in.containers["c0"].pid) or "")).cpulist()
    wait_for(lambda: proc_cpus(out.containers["c0"].pid) == pool, "the opted-out container on the pool")


def test_relist_repins_nothing_and_drift_is_repaired(kube_node: KubeNode) -> None:
    node = kube_node
    everything = allowed(node)
    # The watch alone (an NRI route whose runtime never answers): on the pod-cgroup route the pod
    # cgroups would keep the kernel from taking the drift written below (tests/kube/test_pod_cgroup_route.py).
    node.start_agent("--route", "nri", "--nri-socket", str(node.tmp / "absent.sock"))
    shared = node.run_pod("shared", cpu="100m", memory="32Mi", limits=False)
    pinned = node.run_pod("pinned", **G1)
    wait_for(lambda: len(StateFile(node.state_dir).load(missing_ok=True).allocations) == 1, "the allocation")
    wait_for(lambda: node.nrt_available_cpus() == len(everything) - 1, "NRT after the allocation")
    before = StateFile(node.state_dir).load()
    lists = node.metric("topolet_pod_lists_total")
    writes = node.metric("topolet_pool_cgroup_writes_total")
    nrt_writes = node.metric("topolet_api_writes_total")
    assert node.agent is not None
    node.agent.send_signal(signal.SIGHUP)  # the same path as an expired watch: relist, resync
    wait_for(lambda: node.metric("topolet_pod_lists_total") > lists, "the relist")
    wait_for(lambda: node.metric("topolet_last_reconcile_timestamp_seconds") > 0, "a reconcile")
    after = StateFile(node.state_dir).load()
    assert after.generation == before.generation and after.allocations == before.allocations
    assert node.metric("topolet_pool_cgroup_writes_total") == writes
    assert node.metric("topolet_api_writes_total") == nrt_writes

    # Drift: someone rewrites both cgroups; the next reconcile puts them back.
    alloc = after.allocations[0]
    write_cpuset(node.layout, shared.containers["c0"].cgroup, alloc.cpus)
    write_cpuset(node.layout, pinned.containers["c0"].cgroup, everything)
    wait_for(lambda: proc_cpus(pinned.containers["c0"].pid) == alloc.cpus.cpulist()
             and proc_cpus(shared.containers["c0"].pid) == (everything - alloc.cpus).cpulist(),
             "drift repair")
    assert node.metric("topolet_cgroup_drift_total") >= 1


def test_garbage_objects_do_not_crash_the_agent(kube_node: KubeNode) -> None:
    node = kube_node
    node.start_agent()
    # A pod whose status claims containers that do not exist, with a runtime we cannot map, and junk
    # annotations of every shape the API accepts.
    node.create_pod("junk", **G1, annotations={"topolet.io/smt": "", "topolet.io/unknown": "x"})
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(node.api)
    core.patch_namespaced_pod_status("junk", node.namespace, {"status": {
        "phase": "Running", "qosClass": "Guaranteed",
        "containerStatuses": [
            {"name": "c0", "containerID": "docker://" + "a" * 64, "state": {"running": {}},
             "ready": True, "restartCount": 0, "image": "x", "imageID": "x"},
            {"name": "ghost", "containerID": "containerd://" + "b" * 64, "state": {"running": {}},
             "ready": True, "restartCount": 0, "image": "x", "imageID": "x"},
        ]}})
    ok = node.run_pod("fine", **G1)
    wait_for(lambda: len(CPUSet.parse(proc_cpus(ok.containers["c0"].pid) or "0-1")) == 1,
             "a good pod next to the junk one to be pinned")
    assert node.agent is not None and node.agent.poll() is None
    text = node.log_text()
    assert "Traceback" not in text, text[-3000:]
    # The junk pod holds nothing.
    uids = {a.owner.pod_uid for a in StateFile(node.state_dir).load().allocations}
    assert uids == {ok.uid}


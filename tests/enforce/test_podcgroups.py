"""The pod-cgroup route's watcher and writer on real cgroups (v1 here, v2 in tests/vm's guest).

Each test plays the kubelet and runc in a private subtree: the kubelet's cgroup root is the test's
parent cgroup, its folders are made the way libcontainer makes them (on v1 a new cgroup copies its
parent's cpus and mems when they are empty; on v2 it is left to inherit), and a "container" is a
real process in a cgroup below the pod.  The policy is a dict: pod UID → (cpus, mems).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.api.qos import QOSClass
from agent.enforce.bundles import CONTAINER_NAME, CONTAINER_TYPE, SANDBOX_UID
from agent.enforce.cgroup import (
    CgroupLayout,
    create_cgroup,
    exists,
    move_pid,
    read_cpus,
    read_mems,
    write_set,
)
from agent.enforce.kubepods import CgroupDriver, pod_cgroup_path, qos_cgroup_path
from agent.enforce.podcgroups import PodCgroupWatcher, PodCpuset
from agent.enforce.subtrees import write_subtrees
from agent.topology.cpuset import EMPTY, CPUSet
from tests.enforce.conftest import proc_status

Spawn = Callable[[], "subprocess.Popen[bytes]"]
GUARANTEED_UID = "0c4f0a4e-1111-4c3e-9d3a-5a8b7e7e0001"
BURSTABLE_UID = "0c4f0a4e-2222-4c3e-9d3a-5a8b7e7e0002"
OTHER_UID = "0c4f0a4e-3333-4c3e-9d3a-5a8b7e7e0003"
CONTAINER = "a" * 64


def eventually(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def kubelet_mkdir(layout: CgroupLayout, rel: str) -> str:
    """A cgroup made as libcontainer makes it (the kubelet's pod cgroup, runc's container): v1 fills
    an empty child's cpus and mems from its parent, after the mkdir; v2 enables the controller in the
    parent's subtree_control first and leaves the child to inherit."""
    up = rel.rsplit("/", 1)[0] if "/" in rel else ""
    if layout.version == 2:
        control = os.path.join(layout.abspath(up), "cgroup.subtree_control")
        with open(control) as f:
            enabled = "cpuset" in f.read().split()
        if not enabled:
            with open(control, "w") as f:
                f.write("+cpuset")
    os.mkdir(layout.abspath(rel))
    if layout.version == 1:
        for key, read in (("cpus", read_cpus), ("mems", read_mems)):
            if not read(layout, rel):
                write_set(layout, rel, key, read(layout, up))
    return rel


@pytest.fixture
def kube(cpuset_root: CgroupLayout) -> CgroupLayout:
    """A layout whose root is the test's parent cgroup: the kubelet's cgroup root."""
    create_cgroup(cpuset_root, cpuset_root.parent, read_cpus(cpuset_root, "", effective=True),
                  read_mems(cpuset_root, "", effective=True))
    return CgroupLayout(cpuset_root.version, cpuset_root.abspath(cpuset_root.parent))


def make_qos_folders(kube: CgroupLayout, driver: CgroupDriver) -> None:
    for qos in (QOSClass.GUARANTEED, QOSClass.BURSTABLE, QOSClass.BESTEFFORT):
        path = qos_cgroup_path(qos, driver)
        for i in range(path.count("/") + 1):
            part = "/".join(path.split("/")[: i + 1])
            if not exists(kube, part):
                kubelet_mkdir(kube, part)


class Node:
    """The watcher under test, its policy (a dict) and the pool; stopped after the test."""

    def __init__(self, kube: CgroupLayout, cpus: tuple[int, int], driver: CgroupDriver) -> None:
        self.kube = kube
        self.driver = driver
        self.pool, self.pinned = CPUSet([cpus[0]]), CPUSet([cpus[1]])
        self.policy: dict[str, PodCpuset] = {}
        self.watcher = PodCgroupWatcher(kube, driver, self.policy.get, lambda: self.pool)

    def pod(self, uid: str, qos: QOSClass) -> str:
        return pod_cgroup_path(uid, qos, self.driver)

    def make_pod(self, uid: str, qos: QOSClass) -> str:
        return kubelet_mkdir(self.kube, self.pod(uid, qos))

    def run_container(self, pod: str, spawn: Spawn) -> tuple[str, int]:
        """A container made in `pod` as runc makes it, a real process in it: (its cgroup, the pid)."""
        container = kubelet_mkdir(self.kube, f"{pod}/{CONTAINER}")
        p = spawn()
        move_pid(self.kube, container, p.pid)
        return container, p.pid

    def cpus(self, rel: str) -> CPUSet:
        """What a process there runs on: the effective set (v2 inherits into empty files)."""
        return read_cpus(self.kube, rel, effective=True)


@pytest.fixture(params=[CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD])
def node(request: pytest.FixtureRequest, kube: CgroupLayout, two_cpus: tuple[int, int]) -> Iterator[Node]:
    n = Node(kube, two_cpus, request.param)
    yield n
    n.watcher.stop()


def test_pods_there_before_the_watch_are_written(node: Node, spawn: Spawn) -> None:
    """The watch sees only what comes: start() looks at what the folders hold already, containers
    (a real process) included, and keeps the shared folders at the pool."""
    make_qos_folders(node.kube, node.driver)
    pod = node.make_pod(GUARANTEED_UID, QOSClass.GUARANTEED)
    container, pid = node.run_container(pod, spawn)
    burstable = node.make_pod(BURSTABLE_UID, QOSClass.BURSTABLE)
    node.policy[GUARANTEED_UID] = (node.pinned, EMPTY)

    node.watcher.start()
    assert node.cpus(pod) == node.cpus(container) == node.pinned
    assert proc_status(pid, "Cpus_allowed_list") == node.pinned
    for folder in (qos_cgroup_path(q, node.driver) for q in (QOSClass.BURSTABLE, QOSClass.BESTEFFORT)):
        assert read_cpus(node.kube, folder) == node.pool
    assert node.cpus(burstable) == node.pool
    assert set(node.watcher.pods()) == {GUARANTEED_UID, BURSTABLE_UID}


def test_a_new_pod_cgroup_is_written_before_its_first_container(node: Node, spawn: Spawn) -> None:
    """The route itself: the pod's cgroup appears, the watcher writes it, the container made in it
    afterwards (as runc makes it) starts on the pod's CPUs; a Burstable pod starts on the pool."""
    make_qos_folders(node.kube, node.driver)
    node.watcher.start()
    node.policy[GUARANTEED_UID] = (node.pinned, EMPTY)
    pod = node.make_pod(GUARANTEED_UID, QOSClass.GUARANTEED)
    eventually(lambda: node.cpus(pod) == node.pinned, "the pod cgroup written")
    _, pid = node.run_container(pod, spawn)
    assert proc_status(pid, "Cpus_allowed_list") == node.pinned

    # No wait: a Burstable pod copies its folder's pool, before the watcher writes it.
    _, pid = node.run_container(node.make_pod(BURSTABLE_UID, QOSClass.BURSTABLE), spawn)
    assert proc_status(pid, "Cpus_allowed_list") == node.pool
    eventually(lambda: set(node.watcher.pods()) == {GUARANTEED_UID, BURSTABLE_UID}, "both pods seen")


def test_a_pod_the_policy_does_not_know_gets_the_pool_then_its_answer(node: Node, spawn: Spawn) -> None:
    """A Guaranteed pod seen before its decision starts on the pool, never on another pod's CPUs;
    write_pod() moves it (and what runs in it) once the policy answers."""
    make_qos_folders(node.kube, node.driver)
    node.watcher.start()
    pod = node.make_pod(OTHER_UID, QOSClass.GUARANTEED)
    eventually(lambda: node.cpus(pod) == node.pool, "the pod on the pool")
    container, pid = node.run_container(pod, spawn)
    assert proc_status(pid, "Cpus_allowed_list") == node.pool

    node.policy[OTHER_UID] = (node.pinned, read_mems(node.kube, pod, effective=True))
    writes = node.watcher.write_pod(OTHER_UID)
    assert {w.path for w in writes if w.key == "cpus"} >= {pod}
    assert node.cpus(pod) == node.cpus(container) == node.pinned
    assert proc_status(pid, "Cpus_allowed_list") == node.pinned
    assert node.watcher.write_pod(OTHER_UID) == []  # nothing left to write
    assert node.watcher.write_pod("0c4f0a4e-9999-4c3e-9d3a-5a8b7e7e0009") == []  # no such cgroup


def test_nothing_undoes_the_pod_write(node: Node) -> None:
    """Someone else's write to a written pod cgroup (the kubelet's late copy from the parent) or to a
    shared folder is written back."""
    make_qos_folders(node.kube, node.driver)
    node.policy[GUARANTEED_UID] = (node.pinned, EMPTY)
    node.watcher.start()
    pod = node.make_pod(GUARANTEED_UID, QOSClass.GUARANTEED)
    eventually(lambda: node.cpus(pod) == node.pinned, "the pod cgroup written")
    undone = node.watcher.undone
    write_set(node.kube, pod, "cpus", node.pool | node.pinned)
    eventually(lambda: node.cpus(pod) == node.pinned, "the pod cgroup restored")
    folder = qos_cgroup_path(QOSClass.BESTEFFORT, node.driver)
    write_set(node.kube, folder, "cpus", node.pool | node.pinned)
    eventually(lambda: read_cpus(node.kube, folder) == node.pool, "the BestEffort folder restored")
    assert node.watcher.undone >= undone + 2


def test_a_burstable_pod_the_policy_pins_widens_its_folder(node: Node) -> None:
    """A pod in a shared folder given exclusive CPUs (topolet.io/cpu-policy: exclusive): the folder
    holds the pool and those CPUs, the other pods there only the pool."""
    make_qos_folders(node.kube, node.driver)
    node.watcher.start()
    node.policy[BURSTABLE_UID] = (node.pinned, EMPTY)
    pinned = node.make_pod(BURSTABLE_UID, QOSClass.BURSTABLE)
    eventually(lambda: node.cpus(pinned) == node.pinned, "the Burstable pod pinned")
    folder = qos_cgroup_path(QOSClass.BURSTABLE, node.driver)
    assert read_cpus(node.kube, folder) == node.pool | node.pinned
    other = node.make_pod(OTHER_UID, QOSClass.BURSTABLE)
    eventually(lambda: node.cpus(other) == node.pool, "the other Burstable pod on the pool")

    del node.policy[BURSTABLE_UID]
    node.pool = node.pool | node.pinned  # its CPUs went back to the pool
    node.watcher.keep_shared()
    assert read_cpus(node.kube, folder) == node.cpus(pinned) == node.cpus(other) == node.pool


def test_kubepods_made_after_the_start_and_pods_removed(node: Node) -> None:
    """A watcher started before the kubelet made kubepods waits for it; a removed pod is forgotten."""
    node.policy[GUARANTEED_UID] = (node.pinned, EMPTY)
    node.watcher.start()
    assert node.watcher.pods() == {}
    make_qos_folders(node.kube, node.driver)
    pod = node.make_pod(GUARANTEED_UID, QOSClass.GUARANTEED)
    eventually(lambda: node.cpus(pod) == node.pinned, "the pod cgroup written")
    burstable = qos_cgroup_path(QOSClass.BURSTABLE, node.driver)
    eventually(lambda: read_cpus(node.kube, burstable) == node.pool, "the Burstable folder at the pool")
    os.rmdir(node.kube.abspath(pod))
    eventually(lambda: node.watcher.pods() == {}, "the pod forgotten")


def test_write_subtrees_narrows_children_first_and_keeps_their_own_narrowing(
    kube: CgroupLayout, two_cpus: tuple[int, int]
) -> None:
    """A child keeps what it holds of the new set (the engine's per-container pin); one outside it
    (v1 would refuse the parent's write otherwise) is brought inside; a v2 child that inherits is left
    to inherit."""
    a, b = two_cpus
    both = CPUSet([a, b])
    pod = kubelet_mkdir(kube, "kubepods")
    pinned = kubelet_mkdir(kube, f"{pod}/pinned")
    elsewhere = kubelet_mkdir(kube, f"{pod}/elsewhere")
    inherits = kubelet_mkdir(kube, f"{pod}/inherits")
    write_set(kube, pod, "cpus", both)
    write_set(kube, pinned, "cpus", CPUSet([b]))
    write_set(kube, elsewhere, "cpus", CPUSet([a]))
    write_subtrees(kube, [(pod, CPUSet([b]), EMPTY)])
    assert read_cpus(kube, pod) == read_cpus(kube, pinned) == read_cpus(kube, elsewhere) == CPUSet([b])
    assert read_cpus(kube, inherits, effective=True) == CPUSet([b])
    if kube.version == 2:
        assert read_cpus(kube, inherits) == EMPTY


def test_each_container_of_a_mixed_pod_is_written_as_runc_makes_it(
        kube: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn, tmp_path: Path) -> None:
    """A pod with an exclusive and a shared container: its cgroup holds both sets, and each container's
    cgroup gets its own as it appears (told apart by containerd's bundle), so the exclusive one's first
    instruction runs on its CPUs and the shared one's on the pool.  The sandbox and a cgroup without a
    bundle keep the pod's set.  Both drivers' container names (`<id>`, `cri-containerd-<id>.scope`)."""
    for driver in (CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD):
        mixed_pod(kube, two_cpus, spawn, tmp_path / driver.value, driver)


def mixed_pod(kube: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn, tmp_path: Path,
              driver: CgroupDriver) -> None:
    tmp_path.mkdir()
    node = Node(kube, two_cpus, driver)
    both = node.pool | node.pinned
    node.policy[GUARANTEED_UID] = (both, EMPTY)
    answers = {"main": (node.pinned, EMPTY), "side": (node.pool, EMPTY)}
    ids = {name: (c * 64) for name, c in (("main", "b"), ("side", "c"), ("pause", "d"), ("nobundle", "e"))}
    for name in ("main", "side", "pause"):
        (tmp_path / ids[name]).mkdir()
        kind = "sandbox" if name == "pause" else "container"
        (tmp_path / ids[name] / "config.json").write_text(json.dumps({"annotations": {
            CONTAINER_TYPE: kind, SANDBOX_UID: GUARANTEED_UID, CONTAINER_NAME: name}}))
    watcher = PodCgroupWatcher(kube, driver, node.policy.get, lambda: node.pool,
                               container_cpuset=lambda uid, name: answers.get(name) if uid == GUARANTEED_UID
                               else None, bundles=str(tmp_path))
    make_qos_folders(kube, driver)
    watcher.start()
    try:
        pod = node.make_pod(GUARANTEED_UID, QOSClass.GUARANTEED)
        eventually(lambda: node.cpus(pod) == both, "the pod cgroup holding both sets")
        early = kubelet_mkdir(kube, f"{pod}/{ids['side']}" if driver is CgroupDriver.CGROUPFS
                              else f"{pod}/cri-containerd-{ids['side']}.scope")  # maybe before the watch

        def cgroup(name: str) -> str:
            cid = ids[name]
            return f"{pod}/cri-containerd-{cid}.scope" if driver is CgroupDriver.SYSTEMD else f"{pod}/{cid}"

        assert early == cgroup("side")
        for name in ("pause", "main", "nobundle"):
            kubelet_mkdir(kube, cgroup(name))
        eventually(lambda: node.cpus(cgroup("main")) == node.pinned, "the exclusive container written")
        eventually(lambda: node.cpus(cgroup("side")) == node.pool, "the shared container written")
        p = spawn()
        move_pid(kube, cgroup("main"), p.pid)  # runc start: the container's first instruction
        assert proc_status(p.pid, "Cpus_allowed_list") == node.pinned
        assert node.cpus(cgroup("pause")) == node.cpus(cgroup("nobundle")) == both
        # main and side, the containers with a bundle: once each, or again where libcontainer's fill
        # from the parent (check-then-write, as runc does) landed after our write and the file watch
        # put it back (the sets above are the final word on which containers were touched).
        assert watcher.containers_written >= 2

        write_set(kube, cgroup("main"), "cpus", both)  # someone widens it: put back
        eventually(lambda: node.cpus(cgroup("main")) == node.pinned, "the exclusive container restored")
    finally:
        watcher.stop()

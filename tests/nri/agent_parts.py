"""The agent's pinning pieces as the Kubernetes agent wires them (real engine, state file, pinner, NRI
handler and route) over a private cpuset root, and what the kubelet and runc would do there: pod and
container cgroups with real processes, and the NRI messages containerd would send for them.

Shared by tests/nri/test_agent_route.py and bench/nri.py.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.api.podplan import PodPlan, PodWarning
from agent.api.qos import QOSClass
from agent.enforce.cgroup import CgroupLayout, create_cgroup, exists, read_cpuset
from agent.enforce.kubepods import CgroupDriver, container_cgroup_path, pod_cgroup_path
from agent.enforce.state_file import StateFile
from agent.kube.pods.nri_pinning import NRIPinning
from agent.kube.pods.pinner import PodPinner
from agent.kube.pods.route import NRI, PinningRoute
from agent.metrics.registry import Metrics
from agent.nri import api_pb2
from agent.pinning.engine import PinningEngine
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from tests.kube.kubelet_standin import join_cgroup

NODE = "node-a"
_QOS_PART = {QOSClass.GUARANTEED: "", QOSClass.BURSTABLE: "burstable/", QOSClass.BESTEFFORT: "besteffort/"}


class AgentParts:
    """One agent's pinning pieces on `layout` with its state in `state_dir` (a restart: a new one)."""

    def __init__(self, layout: CgroupLayout, state_dir: Path, *, lock_seconds: float = 1.0) -> None:
        self.metrics = Metrics()
        self.state_file = StateFile(str(state_dir))
        self.engine = PinningEngine(discover("/"), layout, self.state_file, on_release=self.metrics.released)
        self.warnings: list[tuple[str, str, str]] = []  # (pod uid, reason, message) sent as Events
        self.pinner = PodPinner(self.engine, self.metrics, self._warn)
        self.handler = NRIPinning(self.pinner, NODE, lock_seconds=lock_seconds)
        self.route: PinningRoute | None = None

    def _warn(self, plan: PodPlan, w: PodWarning) -> None:
        self.warnings.append((plan.uid, w.reason, w.message))

    def connect(self, socket: Path, asked: str = NRI) -> str:
        """Start the route on the runtime's `socket`; the route's name."""
        self.route = PinningRoute(asked, str(socket), lambda: self.handler, register_seconds=10.0)
        return self.route.start()

    def stop(self) -> None:
        if self.route is not None:
            self.route.stop()

    def allocated(self, result: str = "allocated") -> float:
        value = self.metrics.registry.get_sample_value("topolet_allocations_total", {"result": result})
        return float(value or 0.0)


@dataclass
class Container:
    """A container of the stand-in kubelet: its NRI message and, once runc made it, cgroup and process."""

    pod: api_pb2.PodSandbox
    message: api_pb2.Container
    cgroup: str
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Node:
    """A private cpuset root standing in for the node: what the kubelet and runc make there."""

    layout: CgroupLayout
    tmp: Path
    containers: list[Container] = field(default_factory=list)

    @property
    def cpus(self) -> CPUSet:
        return read_cpuset(self.layout, "", effective=True)[0]

    def pod(self, name: str, qos: QOSClass, annotations: dict[str, str] | None = None) -> api_pb2.PodSandbox:
        """A pod sandbox (its cgroup made as the kubelet makes it)."""
        uid = str(uuid.uuid4())
        parent = pod_cgroup_path(uid, qos, CgroupDriver.CGROUPFS)
        cpus, mems = read_cpuset(self.layout, "")
        create_cgroup(self.layout, parent, cpus=cpus, mems=mems)
        pod = api_pb2.PodSandbox(id=secrets.token_hex(32), uid=uid, namespace="default", name=name,
                                 annotations=annotations or {}, labels={"app": name})
        pod.linux.cgroup_parent = "/" + parent
        return pod

    def container(self, pod: api_pb2.PodSandbox, name: str, milli_cpu: int, *, limit: bool = True,
                  memory: int = 64 << 20) -> Container:
        """A container as the kubelet asks containerd for it (CRI resources, cgroupfs driver)."""
        cid = secrets.token_hex(32)
        qos = qos_of_parent(pod.linux.cgroup_parent)
        msg = api_pb2.Container(id=cid, pod_sandbox_id=pod.id, name=name, state=api_pb2.CONTAINER_CREATED)
        msg.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{cid}"
        res = msg.linux.resources
        res.cpu.shares.value = max(milli_cpu * 1024 // 1000, 2)
        if limit and milli_cpu:
            res.cpu.quota.value = milli_cpu * 100
            res.cpu.period.value = 100000
            res.memory.limit.value = memory
        c = Container(pod, msg, container_cgroup_path(pod.uid, qos, f"containerd://{cid}", None,
                                                      CgroupDriver.CGROUPFS))
        self.containers.append(c)
        return c

    def start(self, c: Container, cpus: str = "") -> int:
        """runc's part: the container's cgroup with `cpus` (the adjusted spec's; "" the parent's) and
        its process, which joins before it execs; its pid."""
        parent_cpus, parent_mems = read_cpuset(self.layout, c.cgroup.rsplit("/", 1)[0])
        create_cgroup(self.layout, c.cgroup, cpus=CPUSet.parse(cpus) if cpus else parent_cpus,
                      mems=parent_mems)
        procs = os.path.join(self.layout.abspath(c.cgroup), "cgroup.procs")
        c.process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL,
                                     preexec_fn=lambda: join_cgroup(procs))
        c.message.state = api_pb2.CONTAINER_RUNNING
        return c.process.pid

    def stop(self, c: Container) -> None:
        """The container exits and the runtime removes its cgroup."""
        if c.process is not None and c.process.poll() is None:
            c.process.send_signal(signal.SIGKILL)
            c.process.wait()
        _rmdir(self.layout.abspath(c.cgroup))
        c.message.state = api_pb2.CONTAINER_STOPPED

    def cgroup_cpus(self, c: Container) -> CPUSet:
        return read_cpuset(self.layout, c.cgroup)[0]

    def live(self) -> tuple[list[api_pb2.PodSandbox], list[api_pb2.Container]]:
        """What the runtime would list at Synchronize: every pod and its live containers."""
        running = [c for c in self.containers if c.message.state == api_pb2.CONTAINER_RUNNING]
        pods = {c.pod.id: c.pod for c in running}
        return list(pods.values()), [c.message for c in running]


def api_pod(c: Container, *, running: bool) -> dict[str, Any]:
    """The pod as the API server shows it to the watch: Guaranteed, its container waiting or running."""
    res = c.message.linux.resources
    cpu = str(res.cpu.shares.value // 1024)
    state = {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}
    status: dict[str, Any] = {"name": c.message.name, "containerID": f"containerd://{c.message.id}",
                              "state": state}
    return {"metadata": {"uid": c.pod.uid, "namespace": c.pod.namespace, "name": c.pod.name,
                         "annotations": dict(c.pod.annotations)},
            "spec": {"nodeName": "node-a", "containers": [{"name": c.message.name, "resources": {
                "requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}}]},
            "status": {"phase": "Running" if running else "Pending", "qosClass": "Guaranteed",
                       "containerStatuses": [status]}}


def bound_pod(c: Container) -> dict[str, Any]:
    """The pod as the watch first lists it: bound to the node, no container created yet."""
    pod = api_pod(c, running=False)
    pod["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
    return pod


def connected(route: PinningRoute, count: int, timeout: float = 10.0) -> bool:
    """Whether the route counts `count` registrations within `timeout` s (it counts them a poll after
    the runtime answers, which may be after the runtime's Synchronize line)."""
    deadline = time.monotonic() + timeout
    while route.connections < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return route.connections == count


def qos_of_parent(parent: str) -> QOSClass:
    for qos, part in _QOS_PART.items():
        if part and f"/kubepods/{part}" in parent + "/":
            return qos
    return QOSClass.GUARANTEED


def _rmdir(path: str) -> None:
    for _ in range(200):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # an exiting process lingers in its cgroup for a moment


@contextmanager
def private_node(system: CgroupLayout, tmp: Path) -> Iterator[Node]:
    """A private cpuset root under `system` with every allowed CPU; removed with what runs in it."""
    cpus, mems = read_cpuset(system, "", effective=True)
    rel = f"topolet-nri-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    create_cgroup(system, rel, cpus=cpus, mems=mems)
    node = Node(CgroupLayout(system.version, system.abspath(rel)), tmp)
    try:
        yield node
    finally:
        for c in node.containers:
            if c.process is not None and c.process.poll() is None:
                c.process.kill()
                c.process.wait()
        root = system.abspath(rel)
        for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
            _rmdir(dirpath)
        assert not exists(system, rel), f"{root} left behind"

"""The three arms of `bench/kube.py --real-node` (issue 20): first instruction pinned, on a real node.

Each arm is a real node of its own (tests/realnode/node.py) on one test cluster, run one after the
other:

- `pod-cgroup`: Debian's containerd 1.6, the real agent with `--route pod-cgroup`;
- `nri`: containerd 2.4.2 with NRI, the real agent with `--route nri --nri-socket <node.nri_socket>`;
- `static`: containerd 1.6, no topolet, the kubelet's own `cpuManagerPolicy: static` with CPU 0
  reserved (as tests/realnode/test_cpu_manager.py sets it up): the anchor.

Over each, `pods` Guaranteed pods (1 CPU, requests = limits) come one at a time: created, their
containers' first instruction read from the container log on the node, deleted (and their CPU
released) before the next.  Every `MEMORY_EVERY`th carries `topolet.io/memory-binding: "true"`; the
middle one has a second container (100m, so on the shared pool: a 2-CPU node has one exclusive
CPU; not on `static`, whose node has one allocatable CPU, CPU 0 being reserved); every
`burstable_every`th is joined, while it holds its CPU, by a Burstable pod whose first
instruction must see none of the CPUs held exclusively.

What the containers run first (tests/realnode/test_nri_route.py's FIRST_INSTRUCTIONS) prints
`Cpus_allowed_list`, `Mems_allowed_list` (shell builtins, nothing exec'd before) and `nproc`.  A
pinned pod is one where every exclusive container printed its allocation (the agent's state file;
for `static` the kubelet's cpu_manager_state) with nproc its size and Mems_allowed_list its memory
nodes (the node's when memory is not bound), and every shared container printed no held CPU.

`run_arms(..., waves=...)` runs pods together instead, for a node with room (tests/vm's guest: 4
vCPUs over two NUMA nodes): each wave's Guaranteed pods (of 1 or 2 CPUs) are created at once and held
together, a Burstable pod is started among them, every first instruction is checked as above, and
all are deleted and released before the next wave; no timings then.

Times per pod (CLOCK_MONOTONIC): created (the API's answer) → Running (phase seen on a watch), and
created → pinned (a cgroup under the pod first seen holding exactly the allocation: the pod cgroup on
the pod-cgroup route, the container's on the others; polled every `POLL_S`, which costs all three arms
alike).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.api.names import MEMORY_BINDING
from agent.topology.cpuset import CPUSet
from tests.controlplane.cluster import Cluster
from tests.realnode.containerd import CONTAINERD_1_6, CONTAINERD_2_4
from tests.realnode.node import (
    NodeAgent,
    RealNode,
    RealNodeParts,
    guaranteed_pod,
    milestone,
    request_timeout,
    wait,
)
from tests.realnode.test_nri_route import FIRST_INSTRUCTIONS

POD_CGROUP, NRI, STATIC = "pod-cgroup", "nri", "static"
ARMS = (POD_CGROUP, NRI, STATIC)
NS = "default"
MEMORY_EVERY = 3  # every third Guaranteed pod binds its memory
POLL_S = 0.002
PINNED_GRACE_S = 3.0  # after Running, how long a cgroup may still take to show the allocation


@dataclass
class ArmResult:
    """What one arm measured."""

    arm: str
    guaranteed: int = 0
    pinned: int = 0
    burstable: int = 0
    burstable_clean: int = 0
    running_s: list[float] = field(default_factory=list)  # created -> Running
    pinned_s: list[float] = field(default_factory=list)  # created -> pinned
    misses: list[str] = field(default_factory=list)  # what a pod's first instruction saw instead
    bound_mems: list[str] = field(default_factory=list)  # Mems_allowed_list of memory-bound containers
    seen: list[str] = field(default_factory=list)  # run_together: each pod's first read vs its allocation
    agent_mib: float | None = None  # the agent's RSS at the end (topolet arms)


def pod_spec(name: str, node: str, kind: str, cpus: int = 1) -> dict[str, Any]:
    """kind: "g" (Guaranteed, `cpus` CPUs), "mem" (and memory-binding), "multi" (a second 100m
    container), "burstable" (a memory request only: the static arm's node has no CPU left to request)."""
    if kind == "burstable":
        pod = guaranteed_pod(name, node, cpu=None, limits=False)
    else:
        binding = {MEMORY_BINDING: "true"} if kind == "mem" else None
        pod = guaranteed_pod(name, node, cpu=str(cpus), annotations=binding)
    containers = pod["spec"]["containers"]
    containers[0]["command"] = ["/bin/sh", "-c", FIRST_INSTRUCTIONS]
    if kind == "multi":
        res = {"cpu": "100m", "memory": "32Mi"}
        containers.append({**containers[0], "name": "d", "resources": {"requests": res, "limits": dict(res)}})
    return pod


def plan(pods: int, multi: bool = True) -> list[str]:
    """The kinds of the Guaranteed pods, in order: the middle one multi-container (`multi`)."""
    kinds = ["mem" if i % MEMORY_EVERY == 1 else "g" for i in range(pods)]
    if pods and multi:
        kinds[pods // 2] = "multi"
    return kinds


def first_read(node: RealNode, pod: dict[str, Any], container: str, timeout: float = 90.0) -> dict[str, str]:
    """What a container's first instructions printed, from its CRI log on the node."""
    meta = pod["metadata"]
    folder = node.dir / "pod-logs" / f"{NS}_{meta['name']}_{meta['uid']}" / container

    def printed() -> dict[str, str] | None:
        lines = [line.split(" ", 3)[3] for f in sorted(folder.glob("*.log"))
                 for line in f.read_text(errors="replace").splitlines() if line.count(" ") >= 3]
        got = dict(line.split(": ", 1) for line in lines if ": " in line)
        return got if "nproc" in got else None

    return dict(wait(printed, f"the first lines of {meta['name']}/{container}", timeout))


class Held:
    """Who holds which exclusive CPUs on an arm's node: the agent's state or the kubelet's."""

    def __init__(self, node: RealNode, agent: NodeAgent | None) -> None:
        self.node = node
        self.agent = agent
        self.mems = CPUSet.parse((node.cpuset_root / "cpuset.mems").read_text().strip())

    def of(self, uid: str) -> dict[str, tuple[CPUSet, CPUSet]]:
        """Container name -> (CPUs, memory nodes) held exclusively for pod `uid`."""
        if self.agent is not None:
            return {str(a.owner.container): (a.cpus, a.mems or self.mems)
                    for a in self.agent.state().allocations if a.owner.pod_uid == uid}
        try:
            entries = json.loads(self.node.cpu_manager_state.read_text()).get("entries") or {}
        except (OSError, ValueError):
            return {}
        return {c: (CPUSet.parse(cpus), self.mems) for c, cpus in (entries.get(uid) or {}).items()}

    def all(self) -> CPUSet:
        if self.agent is not None:
            return CPUSet().union(*(a.cpus for a in self.agent.state().allocations))
        try:
            entries = json.loads(self.node.cpu_manager_state.read_text()).get("entries") or {}
        except (OSError, ValueError):
            return CPUSet()
        return CPUSet().union(*(CPUSet.parse(c) for e in entries.values() for c in e.values()))


def seen_as(seen: dict[str, str]) -> tuple[str, str, str]:
    return seen.get("Cpus_allowed_list", "?"), seen.get("Mems_allowed_list", "?"), seen.get("nproc", "?")


class Arm:
    """One arm's node (and agent) on `cluster`; `run(kinds)` measures; `close()` tears it down."""

    def __init__(self, arm: str, cluster: Cluster, parts: RealNodeParts, *agent_args: str) -> None:
        if arm == STATIC:
            self.node = RealNode(cluster, parts, cpu_manager_policy="static", reserved_cpus="0")
        else:
            self.node = RealNode(cluster, parts, runtime=CONTAINERD_2_4 if arm == NRI else CONTAINERD_1_6)
        self.arm = arm
        self.agent_args = agent_args
        self.agent: NodeAgent | None = None
        self.partial = ArmResult(arm)  # what run() measured so far

    def start(self) -> None:
        node = self.node
        node.start()
        milestone(f"{self.arm} node ready")
        if self.arm == STATIC:
            return
        route = ("--route", NRI, "--nri-socket", str(node.nri_socket)) if self.arm == NRI else \
            ("--route", POD_CGROUP)
        self.agent = agent = NodeAgent(node, *route, *self.agent_args)
        agent.start()
        ready = f"pinning route: {NRI} (registered" if self.arm == NRI else "pod-cgroup route: watching"
        wait(lambda: ready in agent.log() or not agent.running(), f"the agent's {self.arm} route", 60)
        wait(lambda: self._nrt_published() or not agent.running(), "the agent's first NRT", 60)
        if not agent.running():
            raise RuntimeError(f"the agent on the {self.arm} arm exited:\n{agent.log()[-4000:]}")
        milestone(f"{self.arm} agent serving")

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        self.node.stop()

    def run(self, kinds: list[str], burstable_every: int,
            rss: Callable[[int], float] | None = None) -> ArmResult:
        node, result = self.node, self.partial
        held = Held(node, self.agent)
        with node.api() as api:
            times = PodTimes(api, NS)
            try:
                for i, kind in enumerate(kinds):
                    name = f"{self.arm}-{i}"
                    made = api.create(f"/api/v1/namespaces/{NS}/pods", pod_spec(name, node.name, kind))
                    created = time.monotonic()
                    uid = made["metadata"]["uid"]
                    result.guaranteed += 1
                    t_pinned = self._pinned_at(uid, held, times, name)
                    wait(lambda n=name: n in times.running, f"{name} Running")
                    result.running_s.append(times.running[name] - created)
                    if t_pinned is not None:
                        result.pinned_s.append(t_pinned - created)
                    if self._check(made, kind, held, result):
                        result.pinned += 1
                    extra = []
                    if burstable_every and (i + 1) % burstable_every == 0:
                        extra.append(self._burstable(api, f"{name}-b", held, times, result))
                    for gone in (made, *extra):
                        api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{gone['metadata']['name']}")
                    for gone in (made, *extra):
                        self._wait_released(gone["metadata"]["uid"], held)
            finally:
                times.stop()
        if self.agent is not None and self.agent.proc is not None and rss is not None:
            result.agent_mib = rss(self.agent.proc.popen.pid)
        return result

    def run_together(self, waves: list[list[tuple[str, int]]]) -> ArmResult:
        """Each wave's Guaranteed pods ((kind, CPUs), see pod_spec) created at once and held together
        with a Burstable pod started among them; checked, then all deleted and released."""
        node, result = self.node, self.partial
        held = Held(node, self.agent)
        with node.api() as api:
            for w, wave in enumerate(waves):
                made = [(api.create(f"/api/v1/namespaces/{NS}/pods",
                                    pod_spec(f"{self.arm}-w{w}-{i}", node.name, kind, cpus),
                                    timeout=request_timeout()), kind)
                        for i, (kind, cpus) in enumerate(wave)]
                result.guaranteed += len(made)
                for pod, _ in made:  # all started: their allocations are held together now
                    first_read(node, pod, "c")
                milestone(f"{self.arm} wave {w} started")
                for pod, kind in made:
                    if self._check(pod, kind, held, result):
                        result.pinned += 1
                    seen = seen_as(first_read(node, pod, "c"))
                    cpus, mems = held.of(pod["metadata"]["uid"]).get("c", (CPUSet(), CPUSet()))
                    result.seen.append(f"{pod['metadata']['name']} ({kind}): Cpus {seen[0]} Mems {seen[1]} "
                                       f"nproc {seen[2]}; allocation {cpus.cpulist() or 'none'} "
                                       f"mems {mems.cpulist() or 'none'}")
                    if kind == "mem":
                        result.bound_mems.append(seen[1])
                extra = self._burstable(api, f"{self.arm}-w{w}-b", held, None, result)
                seen = seen_as(first_read(node, extra, "c"))
                result.seen.append(f"{extra['metadata']['name']} (Burstable): Cpus {seen[0]} Mems {seen[1]} "
                                   f"nproc {seen[2]}; exclusive held {held.all().cpulist() or 'none'}")
                gone = [pod for pod, _ in made] + [extra]
                for pod in gone:
                    api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}",
                                timeout=request_timeout())
                for pod in gone:
                    self._wait_released(pod["metadata"]["uid"], held)
                milestone(f"{self.arm} wave {w} released")
        return result

    def _nrt_published(self) -> bool:
        """Whether the node's NodeResourceTopology exists; False while the API does not answer in time
        (a loaded host under emulation), so the wait polls again."""
        from agent.errors import KubeAPIError

        try:
            return self.node.cluster.nrt(self.node.name) is not None
        except KubeAPIError as exc:
            if exc.status is not None:
                raise
            return False

    def _pod_dir(self, uid: str, qos: str = "") -> Path:
        return self.node.cpuset_root / "kubepods" / qos / f"pod{uid}"

    def _pinned_at(self, uid: str, held: Held, times: Any, name: str) -> float | None:
        """When a cgroup under the pod (the pod's, or a container's with a process in it) was first
        seen holding exactly its allocation; None if not by PINNED_GRACE_S after Running."""
        pod_dir = self._pod_dir(uid)
        deadline = time.monotonic() + 120.0
        want: CPUSet | None = None
        while time.monotonic() < deadline:
            if want is None:
                mine = held.of(uid)
                want = CPUSet().union(*(c for c, _ in mine.values())) if mine else None
            if want is not None:
                text = want.cpulist()
                for d in (pod_dir, *(p for p in _subdirs(pod_dir))):
                    try:
                        if (d / "cpuset.cpus").read_text().strip() == text and (
                                d == pod_dir or (d / "cgroup.procs").read_text().strip()):
                            return time.monotonic()
                    except OSError:
                        continue
            if name in times.running and time.monotonic() > times.running[name] + PINNED_GRACE_S:
                return None
            time.sleep(POLL_S)
        return None

    def _check(self, pod: dict[str, Any], kind: str, held: Held, result: ArmResult) -> bool:
        """Whether every container's first instruction saw what it should (misses noted)."""
        uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
        mine = held.of(uid)
        ok = True
        for c in [c["name"] for c in pod["spec"]["containers"]]:
            seen = first_read(self.node, pod, c)
            if c == "c":
                if c not in mine:
                    result.misses.append(f"{name}/{c} ({kind}): no exclusive allocation recorded; "
                                         f"saw {seen_as(seen)}")
                    ok = False
                    continue
                cpus, mems = mine[c]
                want = (cpus.cpulist(), mems.cpulist(), str(len(cpus)))
                if seen_as(seen) != want:
                    result.misses.append(f"{name}/{c} ({kind}): saw {seen_as(seen)}, allocation {want}")
                    ok = False
            else:  # a shared container: none of the exclusive CPUs
                taken = CPUSet().union(*(cpus for cpus, _ in mine.values()))
                cpus_seen = CPUSet.parse(seen.get("Cpus_allowed_list", ""))
                if not cpus_seen or cpus_seen & taken:
                    result.misses.append(f"{name}/{c} (shared, {kind}): saw {seen_as(seen)}, exclusive "
                                         f"{taken.cpulist()}")
                    ok = False
        return ok

    def _burstable(self, api: Any, name: str, held: Held, times: Any, result: ArmResult) -> dict[str, Any]:
        made = dict(api.create(f"/api/v1/namespaces/{NS}/pods", pod_spec(name, self.node.name, "burstable"),
                               timeout=request_timeout()))
        taken = held.all()
        seen = first_read(self.node, made, "c")
        cpus_seen = CPUSet.parse(seen.get("Cpus_allowed_list", ""))
        result.burstable += 1
        if cpus_seen and not cpus_seen & taken and taken:
            result.burstable_clean += 1
        else:
            result.misses.append(f"{name} (Burstable): saw {seen_as(seen)}, "
                                 f"exclusive {taken.cpulist() or 'none'}")
        return made

    def _wait_released(self, uid: str, held: Held) -> None:
        folders = (self._pod_dir(uid), self._pod_dir(uid, "burstable"))
        wait(lambda: not any(d.exists() for d in folders), f"pod {uid}'s cgroup removed", 90)
        wait(lambda: not held.of(uid), f"pod {uid}'s CPUs released", 90)


class PodTimes:
    """When each pod (by name) was first seen Running, from a watch on a thread."""

    def __init__(self, api: object, namespace: str) -> None:
        import threading

        self.api = api
        self.namespace = namespace
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._stream: object = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from agent.errors import KubeAPIError

        api: Any = self.api
        while not self._stop.is_set():
            try:
                with api.watch(f"/api/v1/namespaces/{self.namespace}/pods", {"timeoutSeconds": 60},
                               timeout=(5.0, 90.0)) as stream:
                    self._stream = stream
                    for event in stream:
                        if self._stop.is_set():
                            return
                        obj = (event or {}).get("object") or {}
                        name = obj.get("metadata", {}).get("name")
                        if (obj.get("status") or {}).get("phase") == "Running" and name not in self.running:
                            self.running[name] = time.monotonic()
            except KubeAPIError:
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        stream: Any = self._stream
        if stream is not None:
            stream.shutdown()


def _subdirs(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


def run_arms(cluster: Cluster, parts: RealNodeParts, pods: int, burstable_every: int,
             arms: tuple[str, ...] = ARMS, agent_args: tuple[str, ...] = (),
             rss: Callable[[int], float] | None = None,
             log: Callable[[str], None] = print, multi: bool = True,
             waves: list[list[tuple[str, int]]] | None = None) -> dict[str, ArmResult]:
    """Run each arm in turn on `cluster`: a node of its own, started and stopped (`multi`: with the
    multi-container pod; `waves`: Arm.run_together's pods instead of `pods` one at a time)."""
    out: dict[str, ArmResult] = {}
    for arm in arms:
        one = Arm(arm, cluster, parts, *agent_args)
        started = time.monotonic()
        try:
            one.start()
            # The static node has one allocatable CPU (CPU 0 reserved): no room for a second container.
            out[arm] = one.run_together(waves) if waves is not None else \
                one.run(plan(pods, multi=multi and arm != STATIC), burstable_every, rss)
        except Exception as exc:  # noqa: BLE001 - an arm that fails is reported, the others still run
            log(f"--- {arm} arm failed: {exc}; node logs ---\n{one.node.logs()}")
            if one.agent is not None:
                log(f"--- agent ---\n{one.agent.log()[-4000:]}")
            out[arm] = one.partial
            out[arm].misses.append(f"the arm failed: {type(exc).__name__}: {exc}")
        finally:
            one.close()
        log(f"  ({arm} arm: {time.monotonic() - started:.0f} s)")
    return out

"""The admission API bench's nodes, doing what their kubelets and topolet agents would: pods bound to a
node run there, and the node's NRT follows what they hold.

Without it the bench's NRTs are static: a scheduler that trusts its own bookkeeping (topolet's
controller, with its ledger) is not hurt, but the NUMA-aware peer is. Its reserve cache counts a pod it
placed against every zone of the node until the node's NRT shows a pod fingerprint equal to that of
the Running pods it sees there, and a static NRT never does; the peer then starves on its own
reservations.  A real cluster's agents publish within a second or so of a pod starting, so every arm
runs with these stand-ins (the plain scheduler reads no NRT; it gets the same API load).

`NodeAgents(cluster, objects, topology_of, scope, namespace, filler_namespace)`, one per run
(`objects`: the workload's nodes and filler pods; `topology_of(node name)`: its machine):

- `prime()`, before the run's clock starts: every filler pod is reported Running (the status patch a
  kubelet writes), then every node's NRT is published with the fingerprint of its pods;
- `start()`: a watch on `namespace`'s pods; each pod bound to a node, in the order the bindings
  arrive, gets CPUs from the agent's allocator on its node's free CPUs under single-numa-node, inside
  the zone topolet's controller named for it (`pod_target`), as the agent pins; a pod that no zone
  holds gets CPUs all the same (policy best-effort: a kubelet with the single-numa-node topology manager
  would fail it with TopologyAffinityError and the Job controller would make another, which no arm
  here models), counted unaligned.  Its node's NRT is republished — `available` from the CPUs its
  pinned pods hold, `nodeTopologyPodsFingerprint` of those pods (method "with-exclusive-resources"),
  built by the agent's own `nrt_object`, at most once per `PUBLISH_S` per node as an agent coalesces
  its writes, one write per node queued at most — and the pod is reported Running.  The agent pins a
  pod before its containers run (its pod cgroup or NRI route), so its NRT may count a pod the
  scheduler does not see Running yet: then the fingerprints differ and the peer keeps its
  reservations, the safe way round;
- `settle(bound)`: waits until it has run every one of `bound` pods and published since;
- `aligned()`: how many gang pods it pinned inside one zone (`placements`: each pod's node, time and
  whether aligned); `stop()`.

All API writes go through a pool of `WRITERS` threads, so a slow write never holds up the decisions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agent.admission.gangs.slots import pod_target
from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.api.fingerprint import pod_set_fingerprint
from agent.enforce.state import Allocation, Owner, State
from agent.errors import AllocationError, KubeAPIError
from agent.kube.publish.nrt import nrt_object
from agent.kubeapi.client import KubeClient, resource_path
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology
from tests.controlplane.cluster import NRT_GROUP, NRT_PLURAL, NRT_VERSION
from tests.kube.kubelet_standin import running_status

PUBLISH_S = 1.0  # an agent writes its NRT at most this often
WRITERS = 6


def _cpus(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"])


@dataclass
class _Node:
    name: str
    uid: str
    topo: Topology
    free: CPUSet
    # "namespace/name" of each pod pinned here -> its CPUs (None: it got none, the node being full)
    pinned: dict[str, Allocation | None] = field(default_factory=dict)
    last_publish: float = 0.0
    dirty: bool = False  # pinned pods changed since the NRT was last written
    queued: bool = False  # a write of its NRT waits in the pool: no second one is queued


class NodeAgents:
    """The bench nodes' kubelets and agents (see the module docstring)."""

    def __init__(self, cluster: Any, objects: Any, topology_of: Callable[[str], Topology], scope: str,
                 namespace: str, filler_namespace: str) -> None:
        self.cluster, self.scope, self.namespace = cluster, scope, namespace
        self.filler_namespace = filler_namespace
        self._fillers = objects.pods
        self._nodes: dict[str, _Node] = {}
        for obj in objects.nodes:
            name = obj["metadata"]["name"]
            topo = topology_of(name)
            self._nodes[name] = _Node(name, obj["metadata"]["uid"], topo, topo.cpus)
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # "namespace/name" of the pods placed
        self._ran: set[str] = set()  # pod uids reported Running
        # each gang pod placed: ("namespace/name", node, wall clock time, aligned)
        self.placements: list[tuple[str, str, float, bool]] = []
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="node-agents")
        self._local = threading.local()
        self._stop = threading.Event()
        self._stream: Any = None
        self._threads: list[threading.Thread] = []
        self._clients: list[KubeClient] = []
        self.errors: list[str] = []

    # ---- API -------------------------------------------------------------------------------------

    def _api(self) -> KubeClient:
        if not hasattr(self._local, "api"):
            self._local.api = KubeClient(self.cluster.plane.client())
            with self._lock:
                self._clients.append(self._local.api)
        return self._local.api  # type: ignore[no-any-return]

    def _run_pod(self, pod: dict[str, Any]) -> None:
        """The kubelet's status patch once the pod's containers run."""
        meta = pod["metadata"]
        path = resource_path("", "v1", "pods", meta["name"], namespace=meta["namespace"])
        self._api().patch(path + "/status", running_status(pod), "application/strategic-merge-patch+json")

    def _publish(self, node: _Node) -> None:
        with self._lock:
            pinned = dict(node.pinned)
            node.dirty, node.last_publish = False, time.monotonic()
        held = tuple(sorted((a for a in pinned.values() if a is not None), key=lambda a: a.id))
        pods = [(ns, name) for ns, _, name in (key.partition("/") for key in pinned)]
        body = nrt_object((node.name, node.uid), node.topo, State(allocations=held),
                          topology_manager_policy="single-numa-node", topology_manager_scope=self.scope,
                          pods_fingerprint=pod_set_fingerprint(pods),
                          pods_fingerprint_method="with-exclusive-resources")
        self._api().patch(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL, node.name),
                          {"zones": body["zones"], "attributes": body["attributes"]},
                          "application/merge-patch+json")

    # ---- placement -------------------------------------------------------------------------------

    @staticmethod
    def _place(node: _Node, uid: str, cpus: int, near: frozenset[int] | None) -> tuple[
            Allocation | None, bool]:
        """CPUs for one pod on `node` (single-numa-node, else anywhere); (its allocation, aligned)."""
        aligned = True
        try:
            got = allocate(node.topo, node.free, Request(cpus=cpus, numa_policy="single-numa-node",
                                                         preferred_numa=near))
        except AllocationError:
            aligned = False
            if not node.free:
                return None, False
            got = allocate(node.topo, node.free, Request(cpus=min(cpus, len(node.free)),
                                                         numa_policy="best-effort"))
        node.free = node.free - got
        alloc = Allocation(id=uid, cpus=got, mems=EMPTY, cgroup=f"kubepods/{uid}",
                           owner=Owner(pod_uid=uid, container="main"), policy="single-numa-node",
                           created_at=0.0)
        return alloc, aligned

    def prime(self) -> None:
        """Fillers Running and their CPUs held (in the workload's order), then every NRT published."""
        for pod in self._fillers:
            node = self._nodes[pod["spec"]["nodeName"]]
            key = f"{self.filler_namespace}/{pod['metadata']['name']}"
            alloc, _ = self._place(node, pod["metadata"]["uid"], _cpus(pod), None)
            node.pinned[key] = alloc
            self._seen.add(key)
        for _ in self._pool.map(lambda p: self._run_pod(dict(p, metadata={
                "name": p["metadata"]["name"], "namespace": self.filler_namespace})), self._fillers):
            pass
        for _ in self._pool.map(self._publish, self._nodes.values()):
            pass

    def _handle(self, pod: dict[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = self._nodes.get(spec.get("nodeName") or "")
        uid = meta.get("uid")
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if node is None or not uid or key in self._seen or meta.get("deletionTimestamp"):
            return
        self._seen.add(key)
        target = pod_target(pod)
        near = frozenset((target.zone,)) if target is not None and target.zone is not None else None
        alloc, aligned = self._place(node, uid, _cpus(pod), near)
        self.placements.append((key, node.name, time.time(), aligned))
        with self._lock:  # pinned (as the agent pins before the containers run): the next NRT shows it
            node.pinned[key] = alloc
            node.dirty = True

        def run() -> None:
            try:
                self._run_pod(pod)
            except KubeAPIError as exc:
                if exc.status != 404:
                    self.errors.append(f"{key}: {exc}")
                return
            with self._lock:
                self._ran.add(uid)

        self._pool.submit(run)

    # ---- threads ---------------------------------------------------------------------------------

    def start(self) -> None:
        api = KubeClient(self.cluster.plane.client())
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        query = {"fieldSelector": "spec.nodeName!="}
        listed = api.list(path, query)
        for pod in listed.get("items") or []:
            self._handle(pod)
        rv = listed["metadata"]["resourceVersion"]

        def watch() -> None:
            nonlocal rv
            try:
                while not self._stop.is_set():
                    try:
                        with api.watch(path, {**query, "resourceVersion": rv, "timeoutSeconds": 60,
                                              "allowWatchBookmarks": True}, timeout=(5.0, 90.0)) as stream:
                            self._stream = stream
                            for event in stream:
                                if event is None or self._stop.is_set():
                                    continue
                                obj = event.get("object") or {}
                                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                                if event.get("type") in ("ADDED", "MODIFIED"):
                                    try:
                                        self._handle(obj)
                                    except (AllocationError, KeyError, TypeError, ValueError) as exc:
                                        # no CPU left on the node, or a pod it cannot read: that pod only
                                        self.errors.append(f"place: {exc!r}")
                    except KubeAPIError as exc:
                        if not self._stop.is_set():
                            self.errors.append(f"watch: {exc}")
                            self._stop.wait(0.5)
            finally:
                api.close()

        def publisher() -> None:
            while not self._stop.wait(0.1):
                now = time.monotonic()
                with self._lock:
                    due = [n for n in self._nodes.values()
                           if n.dirty and not n.queued and now - n.last_publish >= PUBLISH_S]
                    for node in due:
                        node.queued = True
                for node in due:
                    self._pool.submit(self._publish_logged, node)

        self._threads = [threading.Thread(target=watch, name="node-agents-watch", daemon=True),
                         threading.Thread(target=publisher, name="node-agents-publish", daemon=True)]
        for t in self._threads:
            t.start()

    def _publish_logged(self, node: _Node) -> None:
        try:
            self._publish(node)
        except KubeAPIError as exc:
            with self._lock:
                node.dirty = True
            self.errors.append(f"NRT {node.name}: {exc}")
        finally:
            with self._lock:
                node.queued = False

    def settle(self, bound: set[str], timeout_s: float = 60.0) -> None:
        """Wait until every pod uid in `bound` runs and every node's NRT shows it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                done = bound <= self._ran and not any(n.dirty for n in self._nodes.values())
            if done:
                return
            time.sleep(0.2)

    def aligned(self) -> int:
        return sum(1 for *_, aligned in self.placements if aligned)

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.shutdown()
        for t in self._threads:
            t.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for api in self._clients:
            api.close()

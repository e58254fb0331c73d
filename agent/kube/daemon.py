"""`topolet agent` in Kubernetes mode: pin this node's pods, publish labels and NodeResourceTopology.

Three threads, so that losing the API server stops publishing, never enforcing:

- the pod watch (`agent.kube.watch.PodWatcher`) reads the API and queues pod changes;
- the enforcer (this module's main loop) owns the pod cache and the `PodPinner`: it turns each
  change into engine calls (state first, then cgroups), repairs drift every reconcile, and never
  calls the API;
- the publisher writes what the enforcer changed — the NodeResourceTopology after every
  allocation change, labels when the topology changes, Events for bad annotations — retrying
  every second at most while the API is down, so it catches up within seconds of its return.

MIG follows NVIDIA MIG manager's protocol on the Node: the user's label `topolet.io/mig.config`
names the layout (else `--mig-config`), and the agent answers in `topolet.io/mig.config.state`
(pending, success, failed).  The publisher re-reads the Node every reconcile period and hands the
layout to the enforcer, which applies it through NVML on its own thread — with the API down, the
last layout read stays applied.  Until this run has read the Node once, no MIG change is made: its
label may name another layout than the flag.

GPUs the kubelet handed to containers (its pod-resources socket, read on the enforcer thread only
when the node has GPUs) count as taken in the NRT, and their MIG instances as in use.

The container's cgroup is the kubelet's (`agent.enforce.kubepods`); the cgroup driver is found by
looking for `kubepods.slice` (systemd) or `kubepods` (cgroupfs) under the cpuset hierarchy, and per
pod when neither exists yet at startup.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from agent.alloc.request import Request
from agent.enforce import CgroupDriver, container_cgroup_path, detect_layout, exists
from agent.enforce.state import Owner, State, StateFile
from agent.errors import EnforcementError, TopoletError
from agent.kube.pods import ContainerPlan, PodPlan, PodWarning
from agent.kube.watch import Changed, Gone, PodChange, PodWatcher, Synced
from agent.labels import build_labels
from agent.metrics import Metrics, MetricsServer, staleness_health
from agent.standalone.engine import PinningEngine
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology

if TYPE_CHECKING:
    from agent.gpu.model import GPU
    from agent.gpu.reconcile import MigReconciler
    from agent.kube.client import KubeClient

log = logging.getLogger("topolet.kube")

RETRY_MAX_SECONDS = 1.0  # publishing and watching retry at least this often while the API is down
PENDING_RETRY_SECONDS = 0.2  # a running container whose cgroup is not there yet is looked for again
REASON_ALLOCATION_FAILED = "AllocationFailed"


@dataclass(frozen=True, slots=True)
class MigConfigChanged:
    """The Node asks for another MIG layout: the enforcer applies it now, not at its next reconcile."""


class MigStatus:
    """The MIG layout the Node asks for and how applying it went, shared by the publisher (reads the
    Node, publishes the state) and the enforcer (applies the layout); fields are replaced whole."""

    def __init__(self, fallback: str) -> None:
        self.fallback = fallback  # --mig-config: the layout while the Node carries no label
        self.desired: str | None = None  # None until this run has read the Node
        # The layout the enforcer may apply: `desired` once the publisher has put the state label
        # that goes with it ("pending" for a new layout) on the Node, so no change starts unannounced.
        self.released: str | None = None
        self.result: tuple[str, str | None] = ("", None)  # (layout, state) of the enforcer's last pass
        self.changed_since_start = False
        self.live_state: str | None = None  # the state label the Node carried when first read

    def node_labels(self, labels: Mapping[str, str]) -> bool:
        """Take the layout from the Node's labels; True when it differs from the one known before."""
        from agent.gpu.applier import STATE_LABEL
        from agent.gpu.reconcile import CONFIG_LABEL, STATES

        wanted = str(labels.get(CONFIG_LABEL) or "").strip() or self.fallback
        if self.desired is None:
            live = labels.get(STATE_LABEL)
            self.live_state = live if live in STATES else None
        elif wanted != self.desired:
            self.changed_since_start = True
        changed = wanted != self.desired
        self.desired = wanted
        return changed

    def report(self, layout: str, state: str | None) -> bool:
        """The enforcer's outcome for `layout`; True when it differs from the last one."""
        changed = (layout, state) != self.result
        self.result = (layout, state)
        return changed

    def state(self) -> str | None:
        """The value of `topolet.io/mig.config.state` now (None: no label).

        "pending" from the moment the Node asks for a layout the enforcer has not reported on yet;
        after a restart the Node's own value stands until the first pass, so that an agent restart
        on a node whose layout already holds does not flip it to pending and back.
        """
        if not self.desired:
            return None
        layout, state = self.result
        if layout == self.desired:
            return state
        if self.changed_since_start:
            return "pending"
        return self.live_state or "pending"

    def labels(self) -> dict[str, str]:
        """The state label to publish; never `topolet.io/mig.config` itself (the user's label)."""
        from agent.gpu.applier import STATE_LABEL

        state = self.state()
        return {STATE_LABEL: state} if state else {}


def alloc_id(pod_uid: str, container: str) -> str:
    """The state file id of a pod container's allocation (uids and container names hold no ".")."""
    return f"pod-{pod_uid}.{container}"


class PodPinner:
    """The pod cache and what it means for the engine; every method runs on the enforcer thread."""

    def __init__(self, engine: PinningEngine, metrics: Metrics,
                 warn: Callable[[PodPlan, PodWarning], None],
                 gpu_numa: Callable[[PodPlan, ContainerPlan], frozenset[int] | None] | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.warn = warn
        self.gpu_numa = gpu_numa  # the NUMA nodes of a container's GPUs (kubelet's pod-resources), if known
        self.pods: dict[str, PodPlan] = {}
        self.shared: dict[tuple[str, str], str] = {}  # (uid, container) → cgroup on the pool
        self.pending: set[str] = set()  # uids with a running container whose cgroup is not found yet
        self.unsatisfied: set[str] = set()  # uids with a container refused exclusive CPUs (retry later)
        self.warned: set[tuple[str, str, str]] = set()
        self.driver: CgroupDriver | None = self._detect_driver()

    # -- cgroups ---------------------------------------------------------------------------------

    def _detect_driver(self) -> CgroupDriver | None:
        layout = self.engine.layout
        if exists(layout, "kubepods.slice"):
            return CgroupDriver.SYSTEMD
        if exists(layout, "kubepods"):
            return CgroupDriver.CGROUPFS
        return None

    def cgroup_of(self, plan: PodPlan, c: ContainerPlan) -> str | None:
        """The container's cgroup (relative to the cpuset root) if it exists; None if not (yet)."""
        drivers = [self.driver] if self.driver else [CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD]
        for driver in drivers:
            try:
                rel = container_cgroup_path(plan.uid, plan.qos, c.container_id, None, driver)
            except EnforcementError as exc:
                self._warn_once(plan, PodWarning("UnsupportedContainer", f"container {c.name}: {exc}"))
                return None
            if exists(self.engine.layout, rel):
                self.driver = driver
                return rel
        return None

    # -- changes ---------------------------------------------------------------------------------

    def handle(self, change: PodChange) -> None:
        """Apply one change from the pod watch."""
        if isinstance(change, Synced):
            for uid in set(self.pods) - set(change.plans):
                self.forget(uid)
            # Allocations of pods the API no longer lists (deleted while we were away) go too.
            for a in self._state().allocations:
                if a.owner.pod_uid is not None and a.owner.pod_uid not in change.plans:
                    self._release(a.id)
            for plan in change.plans.values():
                self.apply(plan)
        elif isinstance(change, Changed):
            self.apply(change.plan)
        elif isinstance(change, Gone):
            self.forget(change.uid)

    def _state(self) -> State:
        return self.engine.state_file.load(missing_ok=True)

    def _warn_once(self, plan: PodPlan, w: PodWarning) -> None:
        key = (plan.uid, w.reason, w.message)
        if key not in self.warned:
            self.warned.add(key)
            log.warning("pod %s/%s: %s: %s", plan.namespace, plan.name, w.reason, w.message)
            self.warn(plan, w)

    def _release(self, aid: str) -> None:
        if self.engine.release_container(aid):
            self.metrics.allocations.labels(result="released").inc()
            log.info("released %s", aid)
            # Freed CPUs may now satisfy a container that was refused them.
            self.pending |= self.unsatisfied

    def _set_shared(self) -> None:
        self.engine.extra_shared = frozenset(self.shared.values())

    def forget(self, uid: str) -> None:
        """A pod the API says is gone: free its CPUs, drop its containers from the pool set."""
        self.pods.pop(uid, None)
        self.pending.discard(uid)
        self.unsatisfied.discard(uid)
        self.warned = {k for k in self.warned if k[0] != uid}
        for key in [k for k in self.shared if k[0] == uid]:
            del self.shared[key]
        self._set_shared()
        for a in self._state().allocations:
            if a.owner.pod_uid == uid:
                self._release(a.id)

    def apply(self, plan: PodPlan, *, force: bool = False) -> None:
        """Bring the engine to `plan`: unchanged containers are left alone (no write, no state commit)."""
        if not force and self.pods.get(plan.uid) == plan and plan.uid not in self.pending:
            return
        self.pods[plan.uid] = plan
        self.pending.discard(plan.uid)
        self.unsatisfied.discard(plan.uid)
        for w in plan.warnings:
            self._warn_once(plan, w)
        running = {c.name: c for c in plan.containers}
        mine = {a.owner.container: a for a in self._state().allocations if a.owner.pod_uid == plan.uid}
        # Stopped containers and ones that turned shared (or changed size) give their CPUs back first.
        for name, a in list(mine.items()):
            c = running.get(name or "")
            if c is None or len(a.cpus) != c.cpus:
                self._release(a.id)
                del mine[name]
        for key in [k for k in self.shared if k[0] == plan.uid and k[1] not in running]:
            del self.shared[key]
        paths: dict[str, str] = {}
        for c in plan.containers:
            rel = self.cgroup_of(plan, c)
            if rel is None:
                self.pending.add(plan.uid)
                self.shared.pop((plan.uid, c.name), None)
                continue
            paths[c.name] = rel
            if c.exclusive:
                self.shared.pop((plan.uid, c.name), None)
            else:
                self.shared[(plan.uid, c.name)] = rel
        self._set_shared()
        for c in plan.containers:
            rel = paths.get(c.name)
            if rel is None:
                continue
            if not c.exclusive:
                self._join_pool(rel)
                continue
            held = mine.get(c.name)
            if held is None:
                self._allocate(plan, c, rel)
            elif held.cgroup != rel:
                self.engine.rebind(held.id, rel)  # a restarted container keeps its CPUs, as with kubelet
                log.info("%s moved to restarted container %s", held.id, rel)

    def _join_pool(self, rel: str) -> None:
        try:
            if self.engine.join_pool(rel):
                self.metrics.pool_writes.inc()
        except EnforcementError as exc:
            log.warning("shared container %s: %s", rel, exc)

    def _allocate(self, plan: PodPlan, c: ContainerPlan, rel: str) -> None:
        started = time.perf_counter()
        aid = alloc_id(plan.uid, c.name)
        near = self.gpu_numa(plan, c) if self.gpu_numa is not None else None
        try:
            a = self.engine.allocate(
                aid, Request(c.cpus, c.numa_policy, c.smt, near), Owner(pod_uid=plan.uid, container=c.name),
                memory_binding=c.memory_binding, policy=f"{c.numa_policy}/{c.smt}", cgroup=rel)
        except TopoletError as exc:
            # Refused (no room, policy unmet) or the cgroup write failed: the container stays shared.
            self.metrics.allocations.labels(result="error").inc()
            self.unsatisfied.add(plan.uid)
            self._warn_once(plan, PodWarning(REASON_ALLOCATION_FAILED,
                                             f"container {c.name}: {c.cpus} exclusive CPUs: {exc}"))
            self.shared[(plan.uid, c.name)] = rel
            self._set_shared()
            self._join_pool(rel)
            return
        self.metrics.allocations.labels(result="success").inc()
        self.metrics.pin_latency.observe(time.perf_counter() - started)
        log.info("pod %s/%s container %s: CPUs %s (%s%s)", plan.namespace, plan.name, c.name, a.cpus,
                 a.policy, f", GPUs on NUMA {sorted(near)}" if near else "")

    def retry(self, *, refused: bool = True) -> None:
        """Look again for cgroups that were missing and (with `refused`) CPUs for refused containers."""
        for uid in sorted(self.pending | self.unsatisfied if refused else self.pending):
            plan = self.pods.get(uid)
            if plan is None:
                self.pending.discard(uid)
                self.unsatisfied.discard(uid)
                continue
            self.apply(plan, force=True)


class Publisher:
    """Writes to the API on its own thread: NRT on state change, labels on topology change, Events."""

    def __init__(self, api: KubeClient, node: str, args: argparse.Namespace, metrics: Metrics,
                 snapshot: Callable[[], Snapshot], gpus: Sequence[GPU] = (), *,
                 mig: MigStatus | None = None, on_mig_change: Callable[[], None] | None = None,
                 node_poll_seconds: float = 5.0) -> None:
        from agent.kube.client import agent_namespace
        from agent.kube.events import EventRecorder
        from agent.kube.labels_sink import LabelPublisher
        from agent.kube.nrt import NRTPublisher

        self.node = node
        self.api = api
        self._node_ref: tuple[str, str] | None = None
        self.gpus = tuple(gpus)  # discovered once at start: the NRT's GPU capacity
        self.args = args
        self.metrics = metrics
        self.snapshot = snapshot
        # With MIG managed the Node is read again every `node_poll_seconds` (its layout label may
        # change); otherwise once, for the NRT's owner reference.
        self.mig = mig
        self.on_mig_change = on_mig_change
        self.node_poll_seconds = node_poll_seconds
        self._next_node_read = 0.0
        self._mig_changed = False  # the Node asks for another MIG layout: the enforcer is told
        self.labels = LabelPublisher(api, node, agent_namespace(), sink=args.label_sink,
                                     features_dir=args.features_dir)
        self.nrt = NRTPublisher(api, node)
        self.events = EventRecorder(api, node, component="topolet")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._warnings: queue.Queue[tuple[PodPlan, PodWarning]] = queue.Queue(maxsize=1000)
        self._published_nrt: str | None = None  # fingerprint of the last NRT written
        self._published_labels: dict[str, str] | None = None
        self.failing_since: float | None = None
        self.caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def notify(self) -> None:
        """Something may have changed: compare and publish soon."""
        self.caught_up.clear()
        self._wake.set()

    def warn(self, plan: PodPlan, w: PodWarning) -> None:
        try:
            self._warnings.put_nowait((plan, w))
        except queue.Full:
            log.warning("event queue full: dropping %s for %s/%s", w.reason, plan.namespace, plan.name)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = self.publish_once()
            if ok:
                self.failing_since = None
                self.caught_up.set()
                self._wake.wait(None if self.mig is None
                                else max(self._next_node_read - time.monotonic(), 0.0))
            else:
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self._wake.wait(RETRY_MAX_SECONDS)
            self._wake.clear()

    def publish_once(self) -> bool:
        """Publish whatever differs from what was last written; False if anything failed."""
        ok = True
        if self.mig is not None and time.monotonic() >= self._next_node_read:
            try:
                self._read_node()
                self._next_node_read = time.monotonic() + self.node_poll_seconds
            except Exception as exc:  # noqa: BLE001 - the API may fail in any way; retried
                ok = False
                log.warning("Node %s not read: %s", self.node, exc)
        topology, state, pinned, assigned = self.snapshot()
        try:
            labels = build_labels(topology, gfd_compat=self.args.gfd_compat)
            if self.mig is not None:
                labels.update(self.mig.labels())
            if labels != self._published_labels:
                if self.labels.publish(labels):
                    self.metrics.api_writes.labels(kind="labels").inc()
                self._published_labels = labels
            if self.mig is not None and self.mig.released != self.mig.desired:
                self.mig.released = self.mig.desired  # its state label is on the Node now
                self._mig_changed = True
        except Exception as exc:  # noqa: BLE001 - the API may fail in any way; retried
            ok = False
            log.warning("labels not published: %s", exc)
        try:
            obj = self._nrt_object(topology, state, pinned, assigned)
            digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
            if digest != self._published_nrt:
                if self.nrt.publish(obj):
                    self.metrics.api_writes.labels(kind="nrt").inc()
                    log.info("NodeResourceTopology %s written", self.node)
                self._published_nrt = digest
        except Exception as exc:  # noqa: BLE001
            ok = False
            log.warning("NodeResourceTopology not published: %s", exc)
        while True:
            try:
                plan, w = self._warnings.get_nowait()
            except queue.Empty:
                break
            try:
                # Best effort (the recorder logs and counts its own failures): a lost Event never
                # holds back the NRT behind it.
                if self.events.warn(_pod_ref(plan), w.reason, w.message):
                    self.metrics.api_writes.labels(kind="event").inc()
            except TopoletError as exc:
                log.warning("event not recorded: %s", exc)
        if self._mig_changed:
            self._mig_changed = False
            if self.on_mig_change is not None:
                # After the labels, so that "pending" is on its way before the change starts.
                self.on_mig_change()
        return ok

    def _read_node(self) -> None:
        """Read this node's Node: its uid (the NRT's owner) and, with MIG managed, its layout label."""
        from agent.kube.client import resource_path

        node = self.api.get(resource_path("", "v1", "nodes", self.node), what=f"get node {self.node}")
        found = node.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        self._node_ref = (self.node, str(meta.get("uid") or ""))
        labels = meta.get("labels")
        if self.mig is not None:  # a new layout reaches the enforcer once its state label is published
            self.mig.node_labels({str(k): str(v) for k, v in labels.items()}
                                 if isinstance(labels, dict) else {})

    def _nrt_object(self, topology: Topology, state: State, pinned: tuple[tuple[str, str], ...],
                    assigned: frozenset[str]) -> dict[str, Any]:
        if self._node_ref is None:  # the owner reference needs the Node's uid
            self._read_node()
        if self._node_ref is None:  # _read_node sets it or raises
            raise TopoletError(f"Node {self.node} not read")
        return build_nrt(self._node_ref, topology, state, pinned, self.gpus, assigned)


# What the publisher describes: topology, allocation state, (namespace, name) of pinned pods, and
# the GPUs (PCI addresses) the kubelet handed to containers.
Snapshot = tuple[Topology, State, tuple[tuple[str, str], ...], frozenset[str]]


def build_nrt(node_ref: tuple[str, str], topology: Topology, state: State,
              pinned: tuple[tuple[str, str], ...], gpus: Sequence[GPU] = (),
              assigned_gpus: Collection[str] = ()) -> dict[str, Any]:
    """The node's NRT: CPUs and GPUs less what `state` holds and GPUs less those the kubelet
    assigned (`assigned_gpus`: PCI addresses or UUIDs), and the fingerprint of the pinned pods."""
    from agent.kube.nrt import nrt_object, pod_set_fingerprint

    gpu_capacity = None
    if gpus:
        from agent.gpu.capacity import numa_gpu_capacity

        gpu_capacity = numa_gpu_capacity(gpus, None, state.held_gpus() | frozenset(assigned_gpus))
    obj: dict[str, Any] = nrt_object(
        node_ref, topology, state, gpu_capacity=gpu_capacity,
        pods_fingerprint=pod_set_fingerprint(pinned),
        pods_fingerprint_method="with-exclusive-resources")
    return obj


def is_mig_device_id(device_id: str) -> bool:
    """Whether a device plugin id names a MIG device ("MIG-…", or "<gpu>:<mig>" by index)."""
    ref = device_id.strip().split("::", 1)[0]
    return ref.startswith("MIG-") or ":" in ref


def kubelet_gpus(device_ids: Iterable[str], gpus: Sequence[GPU]) -> frozenset[str]:
    """PCI addresses of the whole GPUs that device plugin ids name (MIG devices and ids of GPUs not
    in `gpus` left out)."""
    from agent.kube.podresources.locality import gpu_of

    out: set[str] = set()
    for device_id in device_ids:
        if is_mig_device_id(device_id):
            continue
        g = gpu_of(device_id, gpus)
        if g is not None:
            out.add(g.pci_address)
    return frozenset(out)


def _pod_ref(plan: PodPlan) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": plan.name, "namespace": plan.namespace, "uid": plan.uid}}


class KubeAgent:
    """The enforcer loop: pod changes and reconcile ticks in, engine calls out."""

    def __init__(self, args: argparse.Namespace, metrics: Metrics, nvml: Any = None,
                 gpus: Sequence[GPU] | None = None) -> None:
        """`nvml`: pynvml or a stand-in, initialised (else NVML loads when a MIG layout is asked);
        `gpus`: the node's GPU inventory (else discovered once here)."""
        from agent.kube.client import KubeClient, load_api_client, node_name

        self.args = args
        self.metrics = metrics
        self.node = node_name(args.node_name)
        # Every API request goes through this one raw-JSON client (see agent.kube.client).
        self.api = KubeClient(load_api_client(args.kubeconfig))
        self.topology: Topology = discover(args.fsroot)
        self.nvml = nvml
        self.gpus = tuple(gpus) if gpus is not None else node_gpus(self.topology, args.fsroot, nvml)
        reserved = CPUSet.parse(args.reserved_cpus) if args.reserved_cpus else CPUSet()
        layout = detect_layout(args.cgroup_root)
        if not os.access(layout.root, os.W_OK):
            raise EnforcementError("cpuset hierarchy is not writable (run as root)", layout.root)
        self.state_file = StateFile(args.state_dir, on_write=metrics.state_writes.inc)
        self.engine = PinningEngine(self.topology, layout, self.state_file, reserved)
        self.changes: queue.Queue[PodChange | MigConfigChanged] = queue.Queue()
        self._podres: list[Any] = []  # [] not opened yet; [None] off; [client]
        self.kubelet_gpu_ids: tuple[str, ...] = ()  # GPU device ids the kubelet handed out
        # Whether those ids are the kubelet's word: None without its socket (NVML's processes are all
        # MIG can go by), False while it fails to answer (no MIG change is safe then), True.
        self.kubelet_answered: bool | None = None
        self._kubelet_quiet_until = 0.0
        self.assigned_gpus: frozenset[str] = frozenset()  # whole GPUs among them (PCI addresses)
        # MIG is looked after where it can matter: an NVML given, a layout asked, a MIG-capable GPU.
        mig_config = str(getattr(args, "mig_config", "") or "")
        self.mig_status: MigStatus | None = None
        if nvml is not None or mig_config or any(g.mig_capable for g in self.gpus):
            self.mig_status = MigStatus(mig_config)
        self._mig: MigReconciler | None = None
        self._mig_layout = ""  # the layout of the pass under way (for the pending callback)
        self._nvml_problem = ""
        self.publisher = Publisher(self.api, self.node, args, metrics, self.snapshot, self.gpus,
                                   mig=self.mig_status,
                                   on_mig_change=lambda: self.changes.put(MigConfigChanged()),
                                   node_poll_seconds=args.reconcile_seconds)
        self.pinner = PodPinner(self.engine, metrics, self.publisher.warn,
                                gpu_numa=self._gpu_numa_source(args))
        self.watcher = PodWatcher(self.api, self.node, self.changes.put, retry_max_seconds=RETRY_MAX_SECONDS,
                                  on_list=metrics.pod_lists.inc)
        self.generation = -1
        self.pinned_pods: tuple[tuple[str, str], ...] = ()  # replaced whole: the publisher reads it
        metrics.info.info({"version": metrics.info._value.get("version", ""),  # noqa: SLF001
                           "node": self.node, "enforcement": "on", "mode": "kubernetes"})

    def _gpu_numa_source(self, args: argparse.Namespace
                         ) -> Callable[[PodPlan, ContainerPlan], frozenset[int] | None] | None:
        """Where containers' GPUs sit, from the kubelet's pod-resources socket (off when not given).

        grpc is loaded on the first container that asks for GPUs, not at start: it costs ~13 MiB of
        resident memory, which a node without GPU workloads should not pay.
        """
        if not getattr(args, "pod_resources_socket", None):
            return None
        found: list[Any] = []

        def numa_nodes(plan: PodPlan, c: ContainerPlan) -> frozenset[int] | None:
            if not c.wants_devices:
                return None
            if not found:
                client = self._pod_resources()
                if client is None:
                    found.append(None)
                else:
                    from agent.kube.podresources.locality import GPULocator

                    found.append(GPULocator(client, lambda: self.gpus))
            locator = found[0]
            return None if locator is None else locator.numa_nodes(plan.namespace, plan.name, c.name,
                                                                   self.topology)

        return numa_nodes

    def _pod_resources(self) -> Any:
        """The kubelet's pod-resources client, opened on first use (grpc loads then); None when off."""
        if not self._podres:
            socket = getattr(self.args, "pod_resources_socket", None)
            client = None
            if socket:
                try:
                    from agent.kube.podresources.client import PodResourcesClient
                except ImportError as exc:  # grpcio/protobuf missing: no device information
                    log.warning("pod-resources API unavailable (%s): CPUs are not aligned with GPUs and "
                                "the NRT counts only GPUs held in our state", exc)
                else:
                    client = PodResourcesClient(socket)
            self._podres.append(client)
        return self._podres[0]

    def refresh_devices(self) -> None:
        """Read which GPUs the kubelet handed to containers; the publisher hears of a change.

        Only on a node with GPUs: elsewhere grpc is never loaded for this.
        """
        if not self.gpus:
            return
        client = self._pod_resources()
        if client is None:
            return
        from agent.kube.podresources.locality import is_gpu_resource

        failures = client.failures
        listed = client.list()  # {} when the kubelet gives no answer: only our own holds count then
        if not client.available:
            self.kubelet_answered = None
        else:
            if client.failures != failures:  # the client leaves the socket alone for a while now
                self._kubelet_quiet_until = time.monotonic() + client.backoff
            self.kubelet_answered = time.monotonic() >= self._kubelet_quiet_until
        ids = tuple(sorted({i for devices in listed.values() for d in devices
                            if is_gpu_resource(d.resource) for i in d.ids}))
        self.kubelet_gpu_ids = ids
        assigned = kubelet_gpus(ids, self.gpus)
        if assigned != self.assigned_gpus:
            self.assigned_gpus = assigned
            self.publisher.notify()

    def snapshot(self) -> Snapshot:
        """What the publisher describes: topology, allocation state, (namespace, name) of pinned pods,
        and the whole GPUs the kubelet handed out."""
        return self.topology, self.state_file.load(missing_ok=True), self.pinned_pods, self.assigned_gpus

    # -- MIG (enforcer thread) -------------------------------------------------------------------

    def _mig_reconciler(self) -> MigReconciler | None:
        """The MIG reconciler, over NVML loaded now if none was given; None (logged) without NVML.

        Loading is tried again each pass: a GPU driver container may come up after the agent.
        """
        if self._mig is None:
            nvml = self.nvml
            if nvml is None:
                from agent.gpu.discover import load_nvml

                nvml, why = load_nvml()
                if nvml is None:
                    if why != self._nvml_problem:
                        self._nvml_problem = why
                        log.info("MIG layout not applied: %s", why)
                    return None
                self.nvml = nvml
            from agent.gpu.reconcile import MigReconciler

            ops = self.metrics.mig_operations
            self._mig = MigReconciler(nvml, self.args.state_dir,
                                      allow_mig_mode_change=bool(getattr(self.args, "allow_mig_mode_change",
                                                                         False)),
                                      on_state=self._on_mig_state,
                                      on_operation=lambda op, result: ops.labels(op=op, result=result).inc())
        return self._mig

    def _on_mig_state(self, state: str) -> None:
        """The applier's state as it goes ("pending" as a change starts): the publisher hears at once."""
        self.metrics.set_mig_config_state(state)
        if self.mig_status is not None and self.mig_status.report(self._mig_layout, state):
            self.publisher.notify()

    def _mig_holds(self, mig: MigReconciler
                   ) -> tuple[Mapping[int, Collection[int]] | None, frozenset[str]] | None:
        """(GPU instances pods hold, GPUs held whole) for the reconciler; None when unknown, and then
        no MIG change is safe.  Instances with processes are in use to the applier anyway."""
        try:
            held = self.state_file.load(missing_ok=True).held_gpus()
        except TopoletError as exc:
            log.warning("MIG reconcile skipped: %s", exc)
            return None
        if self.kubelet_answered is False:
            mig.hold_back("the kubelet's pod-resources socket does not answer")
            return None
        if not self.kubelet_gpu_ids:
            mig.hold_back("")
            return None, held
        found = mig.holds_of(self.kubelet_gpu_ids)
        if found is None:
            return None
        in_use, whole = found
        return in_use, held | whole

    def reconcile_mig(self) -> None:
        """Keep the layout the Node asks for applied (with the API down, the last one read)."""
        status = self.mig_status
        if status is None or status.released is None:  # the Node not read (or its state not published)
            return
        layout = status.released
        state: str | None = None
        mig = self._mig_reconciler() if layout else None
        if mig is not None:
            holds = self._mig_holds(mig)
            if holds is None:  # what pods hold is unknown: no change this pass, the last state stands
                return
            self._mig_layout = layout
            state = mig.reconcile(layout, *holds)
        elif self._mig is not None:
            self._mig.reconcile("")  # no layout asked any more: the reconciler forgets the last one
        self.metrics.set_mig_config_state(state)
        if status.report(layout, state):
            self.publisher.notify()

    def _after_changes(self) -> None:
        """Tell the publisher when the allocation state moved; refresh the CPU gauges."""
        state = self.state_file.load(missing_ok=True)
        if state.generation != self.generation:
            self.generation = state.generation
            uids = {a.owner.pod_uid for a in state.allocations if a.owner.pod_uid}
            self.pinned_pods = tuple(sorted((p.namespace, p.name) for uid, p in self.pinner.pods.items()
                                            if uid in uids))
            self.publisher.notify()
            usage = self.engine.usage(state)
            self.metrics.set_cpu_states(
                row for u in usage for row in (
                    (u.numa, "exclusive", len(u.exclusive)),
                    (u.numa, "reserved", len(u.reserved)),
                    (u.numa, "shared", len(u.shared - u.reserved)),
                ))

    def handle(self, change: PodChange | MigConfigChanged) -> None:
        if isinstance(change, MigConfigChanged):
            self.refresh_devices()  # what pods hold now, not a reconcile ago
            self.reconcile_mig()
            return
        try:
            self.pinner.handle(change)
        except TopoletError as exc:
            self.metrics.reconcile_errors.inc()
            log.error("pod change not applied: %s", exc)

    def reconcile(self) -> None:
        """Drift repair, retries, topology refresh; works without the API."""
        started = time.perf_counter()
        try:
            topo = discover(self.args.fsroot)
            if topo != self.topology:
                self.topology = self.engine.topology = topo
                self.publisher.notify()
            self.refresh_devices()
            result = self.engine.reconcile()
            if result.drift_repaired:
                self.metrics.drift.inc(result.drift_repaired)
            self.pinner.retry()
            self.reconcile_mig()  # after the pins: a MIG change may take seconds
            self.metrics.last_reconcile.set(time.time())
        except TopoletError as exc:
            self.metrics.reconcile_errors.inc()
            log.error("reconcile failed: %s", exc)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        self._after_changes()

    def run(self, stop: threading.Event) -> None:
        """Run until `stop` is set."""
        self.publisher.start()
        self.watcher.start()
        self.reconcile()
        next_reconcile = time.monotonic() + self.args.reconcile_seconds
        next_retry = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                wait = next_reconcile - now
                if self.pinner.pending:
                    wait = min(wait, max(next_retry - now, 0.0))
                try:
                    change: PodChange | MigConfigChanged | None = self.changes.get(timeout=max(wait, 0.0))
                except queue.Empty:
                    change = None
                pods_changed = False
                while change is not None:
                    self.handle(change)
                    pods_changed |= not isinstance(change, MigConfigChanged)
                    try:
                        change = self.changes.get_nowait()
                    except queue.Empty:
                        change = None
                if pods_changed:  # a started or stopped pod may have taken or returned GPUs
                    self.refresh_devices()
                if self.pinner.pending and time.monotonic() >= next_retry:
                    self._retry_pending()
                    next_retry = time.monotonic() + PENDING_RETRY_SECONDS
                if time.monotonic() >= next_reconcile:
                    self.reconcile()
                    next_reconcile = time.monotonic() + self.args.reconcile_seconds
                self._after_changes()
        finally:
            self.watcher.stop()
            self.publisher.stop()

    def _retry_pending(self) -> None:
        try:
            self.pinner.retry(refused=False)
        except TopoletError as exc:
            log.error("retry failed: %s", exc)

    def run_once(self, timeout: float = 30.0) -> bool:
        """List once, pin, publish once; True if everything was published."""
        self.watcher.relist()
        while True:
            try:
                self.handle(self.changes.get_nowait())
            except queue.Empty:
                break
        self.reconcile()
        ok = self.publisher.publish_once()
        kicked = False
        while True:  # the Node's MIG layout, read by that publish: apply it and say how it went
            try:
                self.handle(self.changes.get_nowait())
                kicked = True
            except queue.Empty:
                break
        if kicked:
            ok = self.publisher.publish_once() and ok
        return ok


def node_gpus(topology: Topology, fsroot: str, nvml: Any = None) -> tuple[GPU, ...]:
    """This node's GPUs, discovered once at start (through `nvml` when given); none (logged) when
    discovery fails."""
    from agent.gpu.discover import discover_gpus

    try:
        inventory = discover_gpus(topology, fsroot, nvml=nvml)
    except TopoletError as exc:
        # GPU capacity is a report: without it the NRT still carries CPUs and memory, and pinning goes on.
        log.warning("GPU discovery failed; the NRT reports no GPUs: %s", exc)
        return ()
    if inventory.gpus:
        log.info("%d GPUs (%s)", len(inventory.gpus), inventory.source)
    return inventory.gpus


def run_kube_agent(args: argparse.Namespace) -> int:
    """Entry point of `topolet agent` in Kubernetes mode."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = Metrics()
    agent = KubeAgent(args, metrics)
    if args.once:
        return 0 if agent.run_once() else 1
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    def on_hangup(_signum: int, _frame: FrameType | None) -> None:
        log.info("SIGHUP: relisting pods")
        agent.watcher.request_relist()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    server = MetricsServer(metrics, args.listen,
                           staleness_health(metrics, max(3 * args.reconcile_seconds, 15.0)))
    server.start()
    log.info("node %s: serving /metrics and /healthz on %s:%d", agent.node,
             args.listen.rpartition(":")[0], server.port)
    try:
        agent.run(stop)
    finally:
        server.stop()
    return 0

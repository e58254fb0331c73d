"""`topolet agent` in Kubernetes mode: the enforcer loop over this node's pods, and what it starts.

`KubeAgent(config, topology, ...)` (`.run(stop)`, `.run_once()`; its constructor reads nothing) owns
the pod cache and the `PodPinner` on the enforcer thread and never calls the API; the pod watch, the
publisher and the NRI route run on threads of their own, so losing the API server stops publishing,
never enforcing.  `node_gpus` reads the GPU inventory, `choose_enforcement` the engine (on, off, or
standing down under the kubelet's static CPU manager); `run_kube_agent` is the entry point, wired by
`agent.cli.compose.kube_agent`.  The threads, MIG and the kubelet's CPU manager: README.md here.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from agent.config import AgentConfig
from agent.enforce import detect_layout
from agent.enforce.cgroup import hierarchy_path
from agent.enforce.state_file import StateFile
from agent.errors import ConfigError, EnforcementError, TopoletError
from agent.kube.kubelet.resources import Kubelet, static_message
from agent.kube.mig.enforcer import MigEnforcer
from agent.kube.mig.status import MigConfigChanged, MigStatus
from agent.kube.pods.node_cgroups import NodeCgroups
from agent.kube.pods.pinner import PodPinner, alloc_id
from agent.kube.pods.podcgroup_route import PodCgroupRoute
from agent.kube.pods.route import DEFAULT_NRI_SOCKET, NRI, POD_CGROUP, PinningRoute
from agent.kube.pods.watch import PodChange, PodWatcher, Synced
from agent.kube.publish.nrt import KubeletCPUs
from agent.kube.publish.nrt_build import MemoryRequests, Snapshot
from agent.kube.publish.publisher import Publisher
from agent.metrics.registry import GPUZones, Metrics
from agent.metrics.server import MetricsServer, staleness_health
from agent.pinning.engine import PinningEngine
from agent.pinning.recording import RecordingEngine
from agent.pinning.usage import cpu_rows
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology

if TYPE_CHECKING:
    from agent.gpu.model import GPU
    from agent.kubeapi.client import KubeClient
    from agent.nri.plugin import Handler

log = logging.getLogger("topolet.kube")
PENDING_RETRY_SECONDS = 0.2  # a running container whose cgroup is not there yet is looked for again
KUBELET_STATIC = "kubelet-static"  # topolet_info{enforcement}: standing down beside the static CPU manager


@dataclass(frozen=True)
class Enforcement:
    """How this agent enforces, chosen once at start (`choose_enforcement`)."""

    engine: PinningEngine  # a RecordingEngine unless it pins
    mode: str  # topolet_info{enforcement}: "on", "off" or KUBELET_STATIC
    cgroups: NodeCgroups  # the node's cgroups as the pinner needs them, read under the engine's root
    cgroup_root: str = ""  # how the runtime spells the cpuset root (NRI); "" unless it pins


def choose_enforcement(config: AgentConfig, topology: Topology, state_file: StateFile, kubelet: Kubelet,
                       reserved: CPUSet) -> Enforcement:
    """Pin, record only (`--enforcement off`), or stand down beside the kubelet's static CPU manager
    (`kubelet.check_cpu_manager()` asked first); reads the cpuset hierarchy only when pinning."""
    if config.enforce and kubelet.static_cpus is not None:
        log.warning("%s", static_message(kubelet.static_cpus))
        engine: PinningEngine = RecordingEngine(topology, state_file, reserved)
        return Enforcement(engine, KUBELET_STATIC, NodeCgroups.read(engine.layout))
    if not config.enforce:
        engine = RecordingEngine(topology, state_file, reserved)
        return Enforcement(engine, "off", NodeCgroups.read(engine.layout))
    layout = detect_layout(config.cgroup_root)
    if not os.access(layout.root, os.W_OK):
        raise EnforcementError("cpuset hierarchy is not writable (run as root)", layout.root)
    engine = PinningEngine(topology, layout, state_file, reserved)
    return Enforcement(engine, "on", NodeCgroups.read(layout), hierarchy_path(layout))


class KubeAgent:
    """The enforcer loop: pod changes and reconcile ticks in, engine calls out."""

    def __init__(self, config: AgentConfig, topology: Topology, metrics: Metrics, *, api: KubeClient,
                 node: str, namespace: str, gpus: Sequence[GPU], kubelet: Kubelet,
                 enforcement: Enforcement, nvml: Any = None) -> None:
        """Wires what the composition root (`agent.cli.compose.kube_agent`) found at start: reads
        nothing, asks the API nothing.  `api`: every API request goes through this one raw-JSON client
        (see agent.kubeapi.client); `node`: this node's checked name; `namespace`: the agent's own;
        `gpus`: the node's GPU inventory; `kubelet`: its CPU-manager policy already asked; `nvml`:
        pynvml or a stand-in, initialised (else NVML loads when a MIG layout is asked)."""
        self.config = config
        self.metrics = metrics
        self.node = node
        self.api = api
        self.topology = topology
        self.gpus = tuple(gpus)
        self.kubelet = kubelet
        self.engine = enforcement.engine
        self.state_file = self.engine.state_file
        self.enforcement = enforcement.mode  # topolet_info{enforcement}
        self.enforce = enforcement.mode == "on"
        self.engine.on_release = metrics.released
        engine = self.engine
        metrics.watch_cpus(lambda: cpu_rows(engine.usage()))
        self.changes: queue.Queue[PodChange | MigConfigChanged] = queue.Queue()
        # MIG is looked after where it can matter: an NVML given, a layout asked, a MIG-capable GPU.
        mig_status: MigStatus | None = None
        if nvml is not None or config.mig_config or any(g.mig_capable for g in self.gpus):
            mig_status = MigStatus(config.mig_config)
        self.publisher = Publisher(self.api, self.node, config.publisher, metrics, self.snapshot, self.gpus,
                                   namespace=namespace, mig=mig_status,
                                   on_mig_change=lambda: self.changes.put(MigConfigChanged()))
        static = kubelet.static_cpus
        if self.enforcement == KUBELET_STATIC and static is not None:  # choose_enforcement logged it
            self.publisher.node_event("Normal", "KubeletCPUManagerStatic", static_message(static))
        self.mig: MigEnforcer | None = None
        if mig_status is not None:
            self.mig = MigEnforcer(mig_status, nvml=nvml, state_dir=config.state_dir,
                                   allow_mig_mode_change=config.allow_mig_mode_change,
                                   metrics=metrics, state_file=self.state_file, kubelet=self.kubelet,
                                   gpus=self.gpus, notify=self.publisher.notify)
        self.pinner = PodPinner(self.engine, metrics, self.publisher.warn,
                                gpu_numa=self.kubelet.gpu_numa_source(lambda: self.topology),
                                enforce=self.enforce, numa_scope=config.numa_scope,
                                cgroups=enforcement.cgroups)
        self.watcher = PodWatcher(self.api, self.node, self.changes.put,
                                  on_list=metrics.pod_lists.inc,
                                  on_invalid=metrics.invalid_objects.labels(kind="pod").inc)
        # Chosen and connected in run(): NRI pins as the runtime creates containers
        # (agent.kube.pods.route).
        self.route = PinningRoute(config.route, config.nri_socket or DEFAULT_NRI_SOCKET,
                                  lambda: nri_handler(self.pinner, self.node, enforcement.cgroup_root),
                                  enforce=self.enforce)
        self.route_name: str | None = None
        self.pod_cgroups: PodCgroupRoute | None = None  # the pod-cgroup route with enforcement on
        self.generation = -1
        self.pinned_pods: tuple[tuple[str, str], ...] = ()  # replaced whole: the publisher reads it
        self.memory_requests: MemoryRequests = {}  # likewise: allocation id → memory it asked for
        metrics.set_node(self.node, self.enforcement, mode="kubernetes")
        metrics.watch_gpus(self._gpu_zones if self.gpus else None)

    def _gpu_zones(self) -> GPUZones:
        """What the NRT would say of the GPUs now: the state file read at scrape time, the kubelet's
        assignments and the MIG instances as last read (after every pod change and reconcile)."""
        from agent.gpu.capacity import zone_gpus

        snap = self.snapshot()
        return zone_gpus(self.gpus, snap.state.held_gpus() | snap.assigned_gpus, snap.mig)

    def refresh_devices(self) -> None:
        """Read which GPUs and other devices (and, under its static CPU manager, which CPUs) the
        kubelet handed to containers; the publisher hears of a change."""
        gpus = self.kubelet.refresh_devices()
        if self.kubelet.refresh_cpus() or gpus:
            self.publisher.notify()

    def cpu_manager_changed(self) -> str:
        """Why this agent must stop: a restarted kubelet runs the other CPU manager policy ("": it
        does not)."""
        static = self.kubelet.static_cpus
        if self.enforce and static is not None:
            return (f"{static_message(static)}. The kubelet restarted with it under a pinning agent: "
                    "topolet stops and its restarted pod stands down")
        if self.enforcement == KUBELET_STATIC and static is None:
            return ("the kubelet restarted with cpuManagerPolicy: none: topolet stops and its restarted "
                    "pod pins")
        return ""

    def snapshot(self) -> Snapshot:
        """What the publisher describes: topology, allocation state, (namespace, name) of pinned pods,
        the whole GPUs the kubelet handed out, the memory requests of pinned containers, the MIG
        instances and the device plugin devices the kubelet offers and containers hold."""
        return Snapshot(self.topology, self.state_file.load(missing_ok=True), self.pinned_pods,
                        self.kubelet.assigned_gpus, self.memory_requests,
                        self.mig.inventory if self.mig is not None else None, self.route_name,
                        None if self.kubelet.static_cpus is None
                        else KubeletCPUs(self.kubelet.static_cpus, self.kubelet.pinned_cpus),
                        self.kubelet.offered_devices, self.kubelet.held_devices, self.engine.reserved)

    def _after_changes(self) -> None:
        """Bring the pod cgroups to the pins; tell the publisher when the allocation state moved."""
        if self.pod_cgroups is not None:
            self.pod_cgroups.sync()
        state = self.state_file.load(missing_ok=True)
        if state.generation != self.generation:
            self.generation = state.generation
            uids = {a.owner.pod_uid for a in state.allocations if a.owner.pod_uid}
            with self.pinner.lock:  # the NRI route's thread may be pinning
                pods = list(self.pinner.pods.items())
            self.pinned_pods = tuple(sorted((p.namespace, p.name) for uid, p in pods if uid in uids))
            self.memory_requests = {alloc_id(uid, c.name): c.memory for uid, p in pods
                                    if uid in uids for c in p.containers if c.memory}
            self.publisher.notify()

    def handle(self, change: PodChange | MigConfigChanged) -> None:
        if isinstance(change, MigConfigChanged):
            self.refresh_devices()  # what pods hold now, not a reconcile ago
            if self.mig is not None:
                self.mig.reconcile()
                self.mig.refresh_inventory()
            return
        try:
            self.pinner.handle(change)
        except TopoletError as exc:
            self.metrics.reconcile_errors.inc()
            log.error("pod change not applied: %s", exc)
        except Exception:  # noqa: BLE001 - one pod's change never stops the enforcer
            self.metrics.invalid_objects.labels(kind="pod").inc()
            log.exception("pod change not applied")
        # Only once the pinner has the first list: a pod pinned in the state file is then known.
        if isinstance(change, Synced) and self.pod_cgroups is not None and self.pod_cgroups.watcher is None:
            self.pod_cgroups.start()

    def reconcile(self) -> None:
        """Drift repair, retries, topology refresh; works without the API."""
        started = time.perf_counter()
        try:
            topo = discover(self.config.fsroot)
            if topo != self.topology:
                self.topology = self.engine.topology = topo
                self.publisher.notify()
            self.kubelet.check_cpu_manager()
            if self.cpu_manager_changed():
                return  # run() stops with it before writing another cpuset
            self.refresh_devices()
            with self.pinner.lock:  # one thread at a time in the engine (the NRI route's too)
                result = self.engine.reconcile()
            if result.drift_repaired:
                self.metrics.drift.inc(result.drift_repaired)
            self.pinner.retry()
            self.pinner.offer_held_warnings()  # a pod's current problem is told once the limit allows
            if self.mig is not None:
                self.mig.reconcile()  # after the pins: a MIG change may take seconds
                self.mig.refresh_inventory()
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
        self.route_name = self.route.start()
        self.metrics.set_node(self.node, self.enforcement, mode="kubernetes", route=self.route_name)
        if self.route_name == POD_CGROUP and self.enforce:
            self.pod_cgroups = PodCgroupRoute(self.pinner, bundles=self.config.runtime_bundles)
        elif self.route_name == NRI and self.enforce:
            # A bound pod's exclusive containers are allocated (and committed) as the watch lists it,
            # so CreateContainer answers from the state as it stands, with no write of its own.
            self.pinner.ahead = True
        self.watcher.start()
        self.reconcile()
        next_reconcile = time.monotonic() + self.config.reconcile_seconds
        next_retry = 0.0
        try:
            while not stop.is_set():
                if reason := self.cpu_manager_changed():
                    raise ConfigError(reason)
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
                    if self.mig is not None:
                        self.mig.refresh_inventory()
                if self.pinner.pending and time.monotonic() >= next_retry:
                    self._retry_pending()
                    next_retry = time.monotonic() + PENDING_RETRY_SECONDS
                if time.monotonic() >= next_reconcile:
                    self.reconcile()
                    next_reconcile = time.monotonic() + self.config.reconcile_seconds
                self._after_changes()
        finally:
            self.route.stop()
            if self.pod_cgroups is not None:
                self.pod_cgroups.stop()
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
        if reason := self.cpu_manager_changed():
            raise ConfigError(reason)
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
        for problem in self.publisher.problems:
            log.warning("%s", problem)
        return ok


def nri_handler(pinner: PodPinner, node: str, cgroup_root: str) -> Handler:
    """The agent's NRI plugin, made (and NRI's messages imported) only where the route tries NRI."""
    from agent.kube.pods.nri_pinning import NRIPinning

    return NRIPinning(pinner, node, cgroup_root=cgroup_root)


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


def run_kube_agent(agent: KubeAgent) -> int:
    """Entry point of `topolet agent` in Kubernetes mode, given the agent `agent.cli.compose` built."""
    config, metrics = agent.config, agent.metrics
    if config.once:
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
    server = MetricsServer(metrics, config.listen,
                           staleness_health(metrics, max(3 * config.reconcile_seconds, 15.0)))
    server.start()
    log.info("node %s: serving /metrics and /healthz on %s:%d", agent.node,
             config.listen.rpartition(":")[0], server.port)
    try:
        agent.run(stop)
    finally:
        server.stop()
    return 0

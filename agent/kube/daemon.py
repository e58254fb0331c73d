"""`topolet agent` in Kubernetes mode: pin this node's pods, publish labels and NodeResourceTopology.

Three threads, so that losing the API server stops publishing, never enforcing:

- the pod watch (`agent.kube.watch.PodWatcher`) reads the API and queues pod changes;
- the enforcer (this module's main loop) owns the pod cache and the `PodPinner`: it turns each
  change into engine calls (state first, then cgroups), repairs drift every reconcile, and never
  calls the API;
- the publisher writes what the enforcer changed — the NodeResourceTopology after every
  allocation change, labels when the topology changes, Events for bad annotations (which ones, and
  how often per pod, the pinner's `WarningLimiter` decides) — retrying every second at most while
  the API is down, so it catches up within seconds of its return.

MIG follows NVIDIA MIG manager's protocol on the Node: the user's label `topolet.io/mig.config`
names the layout (else `--mig-config`), and the agent answers in `topolet.io/mig.config.state`
(pending, success, failed).  The publisher re-reads the Node every reconcile period and hands the
layout to the enforcer, which applies it through NVML on its own thread — with the API down, the
last layout read stays applied.  Until this run has read the Node once, no MIG change is made: its
label may name another layout than the flag.

GPUs the kubelet handed to containers (its pod-resources socket, read on the enforcer thread only
when the node has GPUs) count as taken in the NRT, and their MIG instances as in use.  Where MIG is
looked after, the enforcer reads each GPU's MIG mode and instances through NVML after every pod
change and reconcile; the NRT lists them by profile (`nvidia.com/mig-<profile>`) in the GPU's zone,
available unless the kubelet handed them out or a process runs on them.

The container's cgroup is the kubelet's (`agent.enforce.kubepods`); the cgroup driver is found by
looking for `kubepods.slice` (systemd) or `kubepods` (cgroupfs) under the cpuset hierarchy, and per
pod when neither exists yet at startup.

The kubelet's CPU manager: topolet pins only where the kubelet runs `cpuManagerPolicy: none`.  With
`static` the kubelet pins Guaranteed pods itself and reconciles every container's cpuset, and two
writers on one cpuset fight forever, so with enforcement on the agent refuses to run there
(ConfigError, exit 2, the message says what to change).  It asks the kubelet's pod-resources API:
`GetAllocatableResources` offers CPUs for exclusive use under `static` and none under `none`.  It asks
at start and again whenever the socket is a new one (the kubelet makes it afresh at every start, so a
kubelet restarted with `static` under a running agent stops it); with no socket or no answer it goes
on (asking again a minute later), as it would without the kubelet's word on devices.

With `--enforcement off` the agent discovers, decides, records allocations in its state file and
publishes labels and the NRT exactly as with enforcement on, but reads and writes no cgroup
(`agent.kube.recording.RecordingEngine`) and needs no writable cpuset hierarchy.  A container then
counts as started — and a Guaranteed one as pinned — as soon as the pod status lists it running
with a container ID; its state entry names the cgroupfs path the kubelet would give it.  Metrics say
`topolet_info{enforcement="off"}`.  This is for dry runs and for test clusters that run real agents
on hardware dumps (`--fsroot`).

This module holds the enforcer loop (`KubeAgent`) and the entry point; the pieces it drives live
beside it: `agent.kube.pinner` (pods to engine calls), `agent.kube.publisher` (the API writer),
`agent.kube.nrt_build` (what the NRT says), `agent.kube.mig_status` (the Node's MIG layout).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from agent.enforce import detect_layout
from agent.enforce.state import StateFile
from agent.errors import ConfigError, EnforcementError, TopoletError
from agent.kube.mig_status import MigConfigChanged, MigStatus
from agent.kube.nrt_build import MemoryRequests, Snapshot, kubelet_gpus, zone_gpus
from agent.kube.pinner import PodPinner, alloc_id
from agent.kube.pods import ContainerPlan, PodPlan
from agent.kube.publisher import RETRY_MAX_SECONDS, Publisher
from agent.kube.recording import RecordingEngine
from agent.kube.watch import PodChange, PodWatcher
from agent.metrics.registry import GPUZones, Metrics
from agent.metrics.server import MetricsServer, staleness_health
from agent.standalone.engine import PinningEngine, cpu_rows
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology

if TYPE_CHECKING:
    from agent.gpu.capacity import MigInventory
    from agent.gpu.model import GPU
    from agent.gpu.reconcile import MigReconciler

log = logging.getLogger("topolet.kube")
CPU_MANAGER_RETRY_SECONDS = 60.0  # a kubelet socket that gave no answer on its CPU manager is asked again
PENDING_RETRY_SECONDS = 0.2  # a running container whose cgroup is not there yet is looked for again


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
        self.enforce = getattr(args, "enforcement", "on") != "off"
        self.state_file = StateFile(args.state_dir, on_write=metrics.state_writes.inc)
        self.cpu_manager_refusal = ""  # set when the kubelet turns out to pin CPUs itself
        self._cpu_manager_asked: tuple[int, int] | None = None  # the socket last answered
        self._cpu_manager_retry_at = 0.0
        if self.enforce:  # before any cgroup is touched: never one cpuset written where the kubelet pins
            self.check_cpu_manager()
            if self.cpu_manager_refusal:
                raise ConfigError(self.cpu_manager_refusal)
        if self.enforce:
            layout = detect_layout(args.cgroup_root)
            if not os.access(layout.root, os.W_OK):
                raise EnforcementError("cpuset hierarchy is not writable (run as root)", layout.root)
            self.engine: PinningEngine = PinningEngine(self.topology, layout, self.state_file, reserved)
        else:
            self.engine = RecordingEngine(self.topology, self.state_file, reserved)
        self.engine.on_release = metrics.released
        engine = self.engine
        metrics.watch_cpus(lambda: cpu_rows(engine.usage()))
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
                                gpu_numa=self._gpu_numa_source(args), enforce=self.enforce)
        self.watcher = PodWatcher(self.api, self.node, self.changes.put, retry_max_seconds=RETRY_MAX_SECONDS,
                                  on_list=metrics.pod_lists.inc)
        self.generation = -1
        self.pinned_pods: tuple[tuple[str, str], ...] = ()  # replaced whole: the publisher reads it
        self.memory_requests: MemoryRequests = {}  # likewise: allocation id → memory it asked for
        self.mig_inventory: MigInventory | None = None  # likewise: NVML's MIG instances, once read
        metrics.set_node(self.node, self.enforce, mode="kubernetes")
        metrics.watch_gpus(self._gpu_zones if self.gpus else None)

    def _gpu_zones(self) -> GPUZones:
        """What the NRT would say of the GPUs now: the state file read at scrape time, the kubelet's
        assignments and the MIG instances as last read (after every pod change and reconcile)."""
        snap = self.snapshot()
        return zone_gpus(snap.state, self.gpus, snap.assigned_gpus, snap.mig)

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

    def check_cpu_manager(self) -> None:
        """Ask the kubelet whether its CPU manager hands out exclusive CPUs (`static`); if so, set
        `cpu_manager_refusal` to the reason topolet must not pin here.

        Asked again only when the kubelet's socket is a new one: the kubelet makes it afresh at every
        start, and its policy changes only with a restart."""
        socket = str(getattr(self.args, "pod_resources_socket", "") or "")
        try:
            st = os.stat(socket) if socket else None
        except OSError:
            st = None
        if st is None:
            return
        identity = (st.st_ino, st.st_mtime_ns)
        if identity == self._cpu_manager_asked or time.monotonic() < self._cpu_manager_retry_at:
            return
        from agent.kube.podresources.exclusive import kubelet_exclusive_cpus

        cpus = kubelet_exclusive_cpus(socket)
        if cpus is None:
            self._cpu_manager_retry_at = time.monotonic() + CPU_MANAGER_RETRY_SECONDS
            log.warning("the kubelet's pod-resources socket %s gave no answer on its CPU manager; "
                        "asking again in %.0f s", socket, CPU_MANAGER_RETRY_SECONDS)
            return
        self._cpu_manager_asked = identity
        if cpus:
            self.cpu_manager_refusal = (
                f"the kubelet runs cpuManagerPolicy: static (its pod-resources API offers CPUs "
                f"{cpus.cpulist()} for exclusive use): it pins Guaranteed pods itself and topolet would "
                "fight it over their cpusets. Set cpuManagerPolicy: none in this node's kubelet "
                "configuration (drain the node and remove its cpu_manager_state file), or run topolet "
                "with --enforcement off")
        else:
            log.info("kubelet's CPU manager: policy none (no exclusive CPUs offered): topolet pins")

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
        the whole GPUs the kubelet handed out, the memory requests of pinned containers and the MIG
        instances."""
        return Snapshot(self.topology, self.state_file.load(missing_ok=True), self.pinned_pods,
                        self.assigned_gpus, self.memory_requests, self.mig_inventory)

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
            allow = bool(getattr(self.args, "allow_mig_mode_change", False))
            mig = MigReconciler(nvml, self.args.state_dir, allow_mig_mode_change=allow,
                                on_state=self._on_mig_state,
                                on_operation=lambda op, result: ops.labels(op=op, result=result).inc())
            self.metrics.watch_mig(lambda: mig.counters)
            self._mig = mig
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

    def refresh_mig_inventory(self) -> None:
        """Read the GPUs' MIG instances for the NRT, those the kubelet handed out in use; the
        publisher hears of a change.  Only where MIG is looked after and a GPU is MIG-capable."""
        if self.mig_status is None or not any(g.mig_capable for g in self.gpus):
            return
        mig = self._mig_reconciler()
        if mig is None:
            return
        in_use: Mapping[int, Collection[int]] = {}
        if self.kubelet_gpu_ids:
            found = mig.holds_of(self.kubelet_gpu_ids)
            if found is None:  # a device NVML cannot place: the last inventory stands
                return
            in_use = found[0]
        from agent.gpu.capacity import read_mig_inventory

        try:
            inventory = read_mig_inventory(mig.applier, in_use)
        except Exception as exc:  # noqa: BLE001 - NVML may fail in any way; the last inventory stands
            log.warning("MIG instances not read: %s", exc)
            return
        if inventory != self.mig_inventory:
            self.mig_inventory = inventory
            self.publisher.notify()

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
        """Tell the publisher when the allocation state moved."""
        state = self.state_file.load(missing_ok=True)
        if state.generation != self.generation:
            self.generation = state.generation
            uids = {a.owner.pod_uid for a in state.allocations if a.owner.pod_uid}
            self.pinned_pods = tuple(sorted((p.namespace, p.name) for uid, p in self.pinner.pods.items()
                                            if uid in uids))
            self.memory_requests = {alloc_id(uid, c.name): c.memory for uid, p in self.pinner.pods.items()
                                    if uid in uids for c in p.containers if c.memory}
            self.publisher.notify()

    def handle(self, change: PodChange | MigConfigChanged) -> None:
        if isinstance(change, MigConfigChanged):
            self.refresh_devices()  # what pods hold now, not a reconcile ago
            self.reconcile_mig()
            self.refresh_mig_inventory()
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
            if self.enforce:
                self.check_cpu_manager()
                if self.cpu_manager_refusal:
                    return  # run() stops with it before writing another cpuset
            result = self.engine.reconcile()
            if result.drift_repaired:
                self.metrics.drift.inc(result.drift_repaired)
            self.pinner.retry()
            self.pinner.offer_held_warnings()  # a pod's current problem is told once the limit allows
            self.reconcile_mig()  # after the pins: a MIG change may take seconds
            self.refresh_mig_inventory()
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
                if self.cpu_manager_refusal:
                    raise ConfigError(self.cpu_manager_refusal)
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
                    self.refresh_mig_inventory()
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
        if self.cpu_manager_refusal:
            raise ConfigError(self.cpu_manager_refusal)
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

"""`topolet agent` in standalone mode: keep labels current, reconcile local allocations, serve metrics."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from agent.config import StandaloneConfig
from agent.enforce import detect_layout
from agent.enforce.state_file import StateFile
from agent.errors import EnforcementError, TopoletError
from agent.gpu.capacity import MigInventory, read_mig_inventory, zone_gpus
from agent.gpu.discover import discover_gpus, load_nvml, nvidia_functions
from agent.gpu.model import GPU
from agent.gpu.reconcile import MigReconciler
from agent.labels import build_labels
from agent.labels.features_file import write_features_file
from agent.metrics.registry import ALLOCATION_RESULTS, INVALID, REFUSAL_REASONS, REFUSED, GPUZones, Metrics
from agent.metrics.server import MetricsServer, staleness_health
from agent.pinning.engine import DEFAULT_RESERVED, PinningEngine
from agent.pinning.usage import cpu_rows
from agent.standalone.journal import Event, drain_events
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology

log = logging.getLogger("topolet.agent")


class StandaloneAgent:
    """One node's agent without a cluster: labels, reconcile, metrics."""

    def __init__(self, config: StandaloneConfig, metrics: Metrics, nvml: Any = None) -> None:
        self.config = config
        self.metrics = metrics
        self.state_file = StateFile(config.state_dir, on_write=metrics.state_writes.inc)
        self.state_file.check_folder()  # a --state-dir that cannot be one stops the agent at start
        given = config.reserved_cpus
        self.reserved = DEFAULT_RESERVED if given is None else CPUSet.parse(given)
        self.topology: Topology = discover(config.fsroot)
        self.engine: PinningEngine | None = None
        try:
            layout = detect_layout(config.cgroup_root)
            if not os.access(layout.root, os.W_OK):
                raise EnforcementError("cpuset hierarchy is not writable (run as root)", layout.root)
            self.engine = PinningEngine(self.topology, layout, self.state_file, self.reserved,
                                        on_release=metrics.released)
        except EnforcementError as exc:
            log.warning("CPU pinning disabled: %s", exc)
        engine = self.engine
        metrics.watch_cpus(None if engine is None else lambda: cpu_rows(engine.usage()))
        # GPUs as `topolet exec --gpus` finds them (once, at start), for topolet_gpus and
        # topolet_mig_devices: their holds are read from the state file at each scrape.
        self.gpus = _node_gpus(self.topology, config.fsroot, nvml)
        self.mig_inventory: MigInventory | None = None  # MIG instances, read after each MIG pass
        metrics.watch_gpus(self._gpu_zones if self.gpus else None)
        # MIG only when a config is asked; `nvml` (pynvml or a stand-in, initialised) else loads here.
        self.mig: MigReconciler | None = None
        if config.mig_config:
            self.mig = self._mig_reconciler(nvml)
        metrics.set_node(os.uname().nodename, self.engine is not None, mode="standalone")

    def _mig_reconciler(self, nvml: Any) -> MigReconciler | None:
        """The MIG reconciler over `nvml`, or over NVML loaded now; None (logged once) without it."""
        if nvml is None:
            nvml, why = load_nvml()
            if nvml is None:  # normal on a node without NVIDIA's driver
                log.info("MIG config %s not applied: %s", self.config.mig_config, why)
                return None
        ops = self.metrics.mig_operations
        mig = MigReconciler(nvml, self.config.state_dir,
                            allow_mig_mode_change=self.config.allow_mig_mode_change,
                            on_state=self._on_mig_state,
                            on_operation=lambda op, result: ops.labels(op=op, result=result).inc())
        self.metrics.watch_mig(lambda: mig.counters)
        return mig

    def _gpu_zones(self) -> GPUZones:
        """Whole GPUs less those allocations hold (the state file now), MIG instances as last read."""
        return zone_gpus(self.gpus, self.state_file.load(missing_ok=True).held_gpus(), self.mig_inventory)

    def _read_mig_inventory(self, mig: MigReconciler) -> None:
        """The GPUs' MIG instances for the metrics (in use: a process runs on them); the last read
        stands when NVML fails."""
        if not any(g.mig_capable for g in self.gpus):
            return
        try:
            self.mig_inventory = read_mig_inventory(mig.nvml, {})
        except Exception as exc:  # noqa: BLE001 - NVML may fail in any way; the last inventory stands
            log.warning("MIG instances not read: %s", exc)

    def _on_mig_state(self, state: str) -> None:
        """Track the MIG state; publish "pending" at once, as a change starts, not a pass later."""
        self.metrics.set_mig_config_state(state)
        if state != "pending":
            return
        try:
            if write_features_file(self.config.features_dir, self._labels(self.topology)):
                self.metrics.label_writes.inc()
        except TopoletError as exc:
            log.warning("pending MIG state not published: %s", exc)

    def _reconcile_mig(self, mig: MigReconciler) -> None:
        """Apply the MIG config; a GPU an allocation holds whole never has its MIG mode changed."""
        try:
            held = self.state_file.load(missing_ok=True).held_gpus()
        except TopoletError as exc:  # holds unknown: no MIG change this pass, the last state stands
            log.warning("MIG reconcile skipped: %s", exc)
            return
        self.metrics.set_mig_config_state(mig.reconcile(self.config.mig_config, held_gpus=held))
        self._read_mig_inventory(mig)

    def _labels(self, topo: Topology) -> dict[str, str]:
        """Every registered source's labels, plus the MIG config and its state when one is managed."""
        labels = build_labels(topo)
        if self.mig is not None:
            labels.update(self.mig.labels())
        return labels

    def _count(self, ev: Event) -> None:
        """Count what a `topolet exec` did, as told by its journal event."""
        self.metrics.state_writes.inc(ev.state_writes)
        if ev.result == REFUSED:
            self.metrics.refused(ev.reason if ev.reason in REFUSAL_REASONS else INVALID)
        elif ev.result in ALLOCATION_RESULTS:
            self.metrics.allocations.labels(result=ev.result).inc()
        if ev.latency_seconds is not None:
            self.metrics.pin_latency.observe(ev.latency_seconds)

    def refresh_labels(self) -> None:
        """Rediscover (cheap) and rewrite the features.d file only if the labels changed."""
        topo = discover(self.config.fsroot)
        if topo != self.topology and self.engine is not None:
            self.engine.topology = topo
        self.topology = topo
        if write_features_file(self.config.features_dir, self._labels(topo)):
            self.metrics.label_writes.inc()
            log.info("labels written to %s", self.config.features_dir)

    def close(self) -> None:
        """Leave no empty `topolet/` cgroups this run created behind (a machine it found no work on)."""
        if self.engine is None:
            return
        try:
            removed = self.engine.remove_unused_parents()
        except TopoletError as exc:
            log.warning("topolet cgroups left in place: %s", exc)
            return
        if removed:
            log.info("removed the unused cgroups it created: %s", ", ".join(removed))

    def reconcile(self) -> None:
        """One pass: labels, released and drifted allocations, journal events."""
        started = time.perf_counter()
        try:
            if self.mig is not None:  # before the labels, so they carry this pass's state
                self._reconcile_mig(self.mig)
            try:
                self.refresh_labels()
            except TopoletError as exc:  # publishing may fail; enforcing must go on regardless
                self.metrics.reconcile_errors.inc()
                log.error("labels not refreshed: %s", exc)
            if self.engine is not None:
                result = self.engine.reconcile()
                if result.drift_repaired:
                    self.metrics.drift.inc(result.drift_repaired)
                for alloc_id in result.released:
                    log.info("released %s: its processes are gone", alloc_id)
                for ev in drain_events(self.config.state_dir):
                    self._count(ev)
            self.metrics.last_reconcile.set(time.time())
        except TopoletError as exc:
            self.metrics.reconcile_errors.inc()
            log.error("reconcile failed: %s", exc)
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)


def _node_gpus(topology: Topology, fsroot: str, nvml: Any) -> tuple[GPU, ...]:
    """This node's GPUs, through `nvml` when given; none (logged) when discovery fails."""
    if nvml is None and not nvidia_functions(topology, fsroot)[0]:
        return ()  # no NVIDIA GPU on the PCI bus: NVML is not loaded for nothing
    try:
        return discover_gpus(topology, fsroot, nvml=nvml).gpus
    except TopoletError as exc:  # GPU figures are a report: pinning goes on without them
        log.warning("GPU discovery failed; no GPU metrics: %s", exc)
        return ()


def run_agent(config: StandaloneConfig) -> int:
    """Entry point of `topolet agent` (standalone; the Kubernetes mode builds on the same loop)."""
    os.makedirs(config.features_dir, exist_ok=True)
    metrics = Metrics()
    agent = StandaloneAgent(config, metrics)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    if not config.once:  # bound before any cgroup is touched: a port in use stops the agent first
        server = MetricsServer(metrics, config.listen,
                               staleness_health(metrics, max(3 * config.reconcile_seconds, 15.0)))
    try:
        agent.reconcile()
        if server is None:
            return 0
        server.start()
        log.info("serving /metrics and /healthz on %s:%d", config.listen.rpartition(":")[0], server.port)
        while not stop.wait(config.reconcile_seconds):
            agent.reconcile()
    finally:
        if server is not None:
            server.stop()
        agent.close()
    return 0

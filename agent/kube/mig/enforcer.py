"""MIG on the enforcer thread: the layout the Node asks for kept applied, the instances read for the NRT.

`MigEnforcer(status, ...)`: `.reconcile()` applies the layout the publisher read into `MigStatus`,
never before this run has read the Node once nor while what pods hold is unknown (state file
unreadable, kubelet silent, a device NVML cannot place); `.refresh_inventory()` re-reads MIG
instances after every pod change, and `.inventory` (replaced whole) is what the NRT lists by
profile in the GPU's zone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.errors import TopoletError

if TYPE_CHECKING:
    from agent.enforce.state_file import StateFile
    from agent.gpu.capacity import MigInventory
    from agent.gpu.model import GPU
    from agent.gpu.reconcile import MigReconciler
    from agent.kube.kubelet.resources import Kubelet
    from agent.kube.mig.status import MigStatus
    from agent.metrics.registry import Metrics

log = logging.getLogger("topolet.kube")


class MigEnforcer:
    """Applies the Node's MIG layout and reads the GPUs' instances; enforcer thread only."""

    def __init__(self, status: MigStatus, *, nvml: Any, state_dir: str, allow_mig_mode_change: bool,
                 metrics: Metrics, state_file: StateFile, kubelet: Kubelet, gpus: Sequence[GPU],
                 notify: Callable[[], None]) -> None:
        """`nvml`: pynvml or a stand-in, initialised (else NVML loads when a layout is asked);
        `notify` tells the publisher that the state or the instances changed."""
        self.status = status
        self.nvml = nvml
        self.state_dir = state_dir
        self.allow_mig_mode_change = allow_mig_mode_change
        self.metrics = metrics
        self.state_file = state_file
        self.kubelet = kubelet
        self.gpus = gpus
        self.notify = notify
        self.inventory: MigInventory | None = None
        self._mig: MigReconciler | None = None
        self._layout = ""  # the layout of the pass under way (for the pending callback)
        self._nvml_problem = ""

    def _reconciler(self) -> MigReconciler | None:
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
            mig = MigReconciler(nvml, self.state_dir, allow_mig_mode_change=self.allow_mig_mode_change,
                                on_state=self._on_state,
                                on_operation=lambda op, result: ops.labels(op=op, result=result).inc())
            self.metrics.watch_mig(lambda: mig.counters)
            self._mig = mig
        return self._mig

    def _on_state(self, state: str) -> None:
        """The applier's state as it goes ("pending" as a change starts): the publisher hears at once."""
        self.metrics.set_mig_config_state(state)
        if self.status.report(self._layout, state):
            self.notify()

    def _holds(self, mig: MigReconciler
               ) -> tuple[Mapping[int, Collection[int]] | None, frozenset[str]] | None:
        """(GPU instances pods hold, GPUs held whole) for the reconciler; None when unknown, and then
        no MIG change is safe.  Instances with processes are in use to the applier anyway."""
        try:
            held = self.state_file.load(missing_ok=True).held_gpus()
        except TopoletError as exc:
            log.warning("MIG reconcile skipped: %s", exc)
            return None
        if self.kubelet.answered is False:
            mig.hold_back("the kubelet's pod-resources socket does not answer")
            return None
        if not self.kubelet.gpu_ids:
            mig.hold_back("")
            return None, held
        found = mig.holds_of(self.kubelet.gpu_ids)
        if found is None:
            return None
        in_use, whole = found
        return in_use, held | whole

    def refresh_inventory(self) -> None:
        """Read the GPUs' MIG instances for the NRT, those the kubelet handed out in use; the
        publisher hears of a change.  Only where a GPU is MIG-capable."""
        if not any(g.mig_capable for g in self.gpus):
            return
        mig = self._reconciler()
        if mig is None:
            return
        in_use: Mapping[int, Collection[int]] = {}
        if self.kubelet.gpu_ids:
            found = mig.holds_of(self.kubelet.gpu_ids)
            if found is None:  # a device NVML cannot place: the last inventory stands
                return
            in_use = found[0]
        from agent.gpu.capacity import read_mig_inventory

        try:
            inventory = read_mig_inventory(mig.nvml, in_use)
        except Exception as exc:  # noqa: BLE001 - NVML may fail in any way; the last inventory stands
            log.warning("MIG instances not read: %s", exc)
            return
        if inventory != self.inventory:
            self.inventory = inventory
            self.notify()

    def reconcile(self) -> None:
        """Keep the layout the Node asks for applied (with the API down, the last one read)."""
        status = self.status
        if status.released is None:  # the Node not read (or its state not published)
            return
        layout = status.released
        state: str | None = None
        mig = self._reconciler() if layout else None
        if mig is not None:
            holds = self._holds(mig)
            if holds is None:  # what pods hold is unknown: no change this pass, the last state stands
                return
            self._layout = layout
            state = mig.reconcile(layout, *holds)
        elif self._mig is not None:
            self._mig.reconcile("")  # no layout asked any more: the reconciler forgets the last one
        self.metrics.set_mig_config_state(state)
        if status.report(layout, state):
            self.notify()

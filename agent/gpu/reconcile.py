"""Keep a named MIG layout applied on every pass of the agent, and say how that went.

Each `reconcile(name)` first resumes a plan an earlier run left in progress (finishing it or rolling
it back), then applies the named layout; an applied layout costs only reads.  The outcome is the
value of `topolet.io/mig.config.state`, with the values and meaning of NVIDIA MIG manager's
`nvidia.com/mig.config.state` (its reconfigure script): "pending" while a change is under way,
"success" once the layout holds, "failed" when it cannot be applied (unknown layout, MIG mode off
and not ours to change, an instance in use where the layout needs another).  A MIG mode change
that waits for a GPU reset stays "pending"; topolet never resets a GPU or reboots the node itself,
so it never reports the manager's "rebooting".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

from agent.gpu.applier import (
    FAILED,
    STATE_LABEL,
    ApplyResult,
    Desired,
    MigApplier,
    OperationHook,
)
from agent.labels.builder import make_labels
from agent.labels.registry import TOPOLET_NAMESPACE, RawFeature

log = logging.getLogger("topolet.gpu.mig")

CONFIG_LABEL = f"{TOPOLET_NAMESPACE}/mig.config"
STATES = ("pending", "success", "failed")


def mig_labels(config: str, state: str | None) -> dict[str, str]:
    """`topolet.io/mig.config` and `.state` through the label builder (its validation included);
    empty when no config is asked or nothing is managed."""
    if not config or state is None:
        return {}
    name = STATE_LABEL.partition("/")[2]
    features = [RawFeature(TOPOLET_NAMESPACE, "mig.config", config),
                RawFeature(TOPOLET_NAMESPACE, name, state)]
    result = make_labels(features)
    for dropped in result.dropped:
        log.warning("MIG label dropped (%s): %s=%r", dropped.reason, dropped.feature.name,
                    dropped.feature.value)
    return result.labels


class MigReconciler:
    """Applies one named MIG layout through NVML each pass; never raises out of `reconcile`."""

    def __init__(self, nvml: Any, state_dir: str | os.PathLike[str], *, allow_mig_mode_change: bool,
                 on_state: Callable[[str], None] | None = None,
                 on_operation: OperationHook | None = None) -> None:
        self.nvml = nvml
        self.on_state = on_state
        self.applier = MigApplier(nvml, state_dir, allow_mig_mode_change=allow_mig_mode_change,
                                  on_state=self._on_state, on_operation=on_operation)
        self.config = ""
        self.state: str | None = None
        self.reason = ""
        self._last_logged: tuple[str, str | None, str] | None = None

    def _on_state(self, state: str) -> None:
        # `labels()` must say "pending" while a change runs, before `reconcile` returns.
        self.state = state
        if self.on_state is not None:
            self.on_state(state)

    @property
    def counters(self) -> dict[str, int]:
        """Totals since start, named as the applier's metrics."""
        return self.applier.counters.as_metrics()

    def labels(self) -> dict[str, str]:
        """The MIG labels for the last pass (empty when it managed nothing)."""
        return mig_labels(self.config, self.state)

    def _mig_capable(self) -> bool:
        nv = self.nvml
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                nv.nvmlDeviceGetMigMode(nv.nvmlDeviceGetHandleByIndex(index))
            except nv.NVMLError_NotSupported:
                continue
            return True
        return False

    def reconcile(self, desired_layout_name: str, in_use: Mapping[int, Collection[int]] | None = None,
                  held_gpus: Collection[str] = ()) -> str | None:
        """Resume, then apply `desired_layout_name`; the state label value, or None when no config
        is asked or the node has no MIG-capable GPU.  `in_use` adds GPU-instance ids pods hold;
        `held_gpus` (UUIDs or PCI addresses) are GPUs held whole, whose MIG mode never changes."""
        self.config = desired_layout_name
        if not desired_layout_name:
            self.state, self.reason = None, ""
            return None
        try:
            if not self._mig_capable():
                self._settle(None, "no MIG-capable GPU")
                return None
            resumed = self.applier.resume(in_use)
            if resumed is not None:
                log.log(logging.INFO if resumed.state != FAILED else logging.WARNING,
                        "MIG: interrupted plan: %s", resumed.message)
            result = self.applier.apply(Desired(layout=desired_layout_name), in_use, held_gpus)
        except Exception as exc:  # the agent's loop must go on: anything unexpected is "failed"
            log.exception("MIG reconcile of %s failed", desired_layout_name)
            result = ApplyResult(FAILED, f"unexpected error: {exc!r}")
            self.applier.counters.errors += 1
        self._settle(result.state, result.message)
        return result.state

    def _settle(self, state: str | None, reason: str) -> None:
        self.state, self.reason = state, reason
        # Every pass reconciles; log only when the outcome changes, so a steady node stays quiet.
        key = (self.config, state, reason)
        if key == self._last_logged:
            return
        self._last_logged = key
        level = logging.WARNING if state == FAILED else logging.INFO
        log.log(level, "MIG config %s: %s (%s)", self.config, state or "not managed", reason)

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
import re
from collections.abc import Callable, Collection, Iterable, Mapping
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
_INDEX_MIG_ID = re.compile(r"(\d{1,5}):(\d{1,5})")  # the device plugin's index strategy: "<gpu>:<mig>"

# What pods hold, in the reconciler's terms: GPU-instance ids per GPU index, and whole GPUs by UUID.
Holds = tuple[dict[int, set[int]], frozenset[str]]


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
        self._holds_problem = ""

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

    def holds_of(self, device_ids: Iterable[str]) -> Holds | None:
        """What the device plugin's ids (the kubelet's pod-resources answer) hold; None when one
        names a device NVML cannot place, since then no instance is known to be free.

        Understood: GPU UUIDs and indices (whole GPUs), "MIG-GPU-<uuid>/<gi>/<ci>", "MIG-<uuid>" and
        "<gpu index>:<mig index>", each with a time-slicing replica suffix ("::<n>") or without.
        """
        nv = self.nvml
        in_use: dict[int, set[int]] = {}
        whole: set[str] = set()
        mig_uuids: dict[str, tuple[int, int]] | None = None
        try:
            uuids = {self._uuid(nv.nvmlDeviceGetHandleByIndex(i)).lower(): i
                     for i in range(nv.nvmlDeviceGetCount())}
            for raw in device_ids:
                ref = raw.strip().split("::", 1)[0]
                place: tuple[int, int] | None = None
                by_index = _INDEX_MIG_ID.fullmatch(ref)
                if ref.startswith("MIG-GPU-"):
                    gpu_uuid, _, rest = ref[len("MIG-"):].partition("/")
                    index = uuids.get(gpu_uuid.lower())
                    gi = rest.partition("/")[0]
                    place = (index, int(gi)) if index is not None and gi.isdigit() else None
                elif ref.startswith("MIG-"):
                    if mig_uuids is None:
                        mig_uuids = self._mig_devices(len(uuids))
                    place = mig_uuids.get(ref.lower())
                elif by_index is not None:
                    gpu, mig = int(by_index.group(1)), int(by_index.group(2))
                    handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(nv.nvmlDeviceGetHandleByIndex(gpu), mig)
                    place = (gpu, int(nv.nvmlDeviceGetGpuInstanceId(handle)))
                elif ref.lower() in uuids or (ref.isdigit() and int(ref) < len(uuids)):
                    index = uuids[ref.lower()] if ref.lower() in uuids else int(ref)
                    whole.add(self._uuid(nv.nvmlDeviceGetHandleByIndex(index)))
                    continue
                if place is None:
                    self.hold_back(f"device {raw!r} assigned to a pod is not on this node's GPUs")
                    return None
                in_use.setdefault(place[0], set()).add(place[1])
        except (nv.NVMLError, AttributeError) as exc:  # AttributeError: an NVML without MIG device queries
            self.hold_back(f"MIG devices assigned to pods cannot be located: {exc!r}")
            return None
        self.hold_back("")
        return in_use, frozenset(whole)

    def _uuid(self, handle: Any) -> str:
        value = self.nvml.nvmlDeviceGetUUID(handle)
        return value.decode() if isinstance(value, bytes) else str(value)

    def _mig_devices(self, count: int) -> dict[str, tuple[int, int]]:
        """{MIG device UUID (lower case): (GPU index, GPU-instance id)} over every GPU in MIG mode."""
        nv = self.nvml
        out: dict[str, tuple[int, int]] = {}
        for index in range(count):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            try:
                if not nv.nvmlDeviceGetMigMode(handle)[0]:
                    continue
            except nv.NVMLError_NotSupported:
                continue
            for slot in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nv.NVMLError_NotFound:  # an empty slot
                    continue
                out[self._uuid(mig).lower()] = (index, int(nv.nvmlDeviceGetGpuInstanceId(mig)))
        return out

    def hold_back(self, reason: str) -> None:
        """Log (once per reason) that no MIG change is made as what pods hold is not known; ""
        when it is known again."""
        if reason and reason != self._holds_problem:
            log.warning("MIG reconcile held back: %s", reason)
        self._holds_problem = reason

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

"""The MIG applier: bring the node's GPU instances to a desired layout through NVML.

Reads the live instances (and which have processes), plans with the pure planner, records the plan
in `mig-plan.json` before acting, then destroys idle instances and creates the planned ones with
their compute instances.  It changes MIG mode only when allowed and only on GPUs with no processes,
never destroys an instance in use, and does nothing when the layout already holds.  After a crash
`resume()` finishes a recorded plan by re-planning for the same desired layout (re-planning from live
state, so a half-done plan is completed rather than repeated).

`nvml` is the pynvml module or a stand-in with the same functions; nothing here imports pynvml.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import ConfigError
from agent.gpu.layouts import named_layout, plan_layout
from agent.gpu.planfile import read_plan_file, write_plan_file
from agent.gpu.planner import ExistingInstance, GPUPlan, GPUState, MigPlan, PlanError, plan_mig
from agent.gpu.profiles import GPUModel, Profile, resolve_model

STATE_LABEL = "topolet.io/mig.config.state"
PENDING, SUCCESS, FAILED = "pending", "success", "failed"


@dataclass(frozen=True, slots=True)
class Desired:
    """What the node should hold: a named layout (per GPU) or a node-wide demand."""

    layout: str = ""
    demand: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout} if self.layout else {"demand": dict(self.demand)}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Desired:
        if doc.get("layout"):
            return Desired(layout=str(doc["layout"]))
        return Desired(demand=tuple((str(k), int(v)) for k, v in dict(doc.get("demand", {})).items()))


@dataclass
class ApplyCounters:
    """Totals the caller exports as Prometheus counters (names are the metric names)."""

    created: int = 0
    destroyed: int = 0
    mig_mode_changes: int = 0
    errors: int = 0

    def as_metrics(self) -> dict[str, int]:
        return {
            "topolet_mig_instances_created_total": self.created,
            "topolet_mig_instances_destroyed_total": self.destroyed,
            "topolet_mig_mode_changes_total": self.mig_mode_changes,
            "topolet_mig_apply_errors_total": self.errors,
        }


@dataclass(frozen=True, slots=True)
class ApplyResult:
    state: str  # PENDING | SUCCESS | FAILED: the value of topolet.io/mig.config.state
    message: str
    plan: MigPlan | None = None

    def labels(self) -> dict[str, str]:
        return {STATE_LABEL: self.state}


@dataclass
class _LiveGPU:
    index: int
    handle: Any
    uuid: str
    model: GPUModel
    mig_current: bool
    mig_pending: bool
    processes: list[Any]
    gis: dict[tuple[str, int], tuple[Any, ExistingInstance]] = field(default_factory=dict)


class MigApplier:
    """Applies desired MIG layouts through one NVML module, recording plans under `state_dir`."""

    def __init__(self, nvml: Any, state_dir: str | os.PathLike[str], *, allow_mig_mode_change: bool = False,
                 on_state: Callable[[str], None] | None = None) -> None:
        self.nvml = nvml
        self.state_dir = state_dir
        self.allow_mig_mode_change = allow_mig_mode_change
        self.on_state = on_state
        self.counters = ApplyCounters()

    # --- reading ---
    def _text(self, value: str | bytes) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _live(self, in_use: Mapping[int, Collection[int]]) -> list[_LiveGPU]:
        nv = self.nvml
        out: list[_LiveGPU] = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            model = resolve_model(self._text(nv.nvmlDeviceGetName(handle)))
            if model is None:
                continue
            try:
                current, pending = nv.nvmlDeviceGetMigMode(handle)
            except nv.NVMLError_NotSupported:
                continue
            processes = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
            live = _LiveGPU(index, handle, self._text(nv.nvmlDeviceGetUUID(handle)), model,
                            bool(current), bool(pending), processes)
            if live.mig_current:
                self._read_instances(live, set(in_use.get(index, ())))
            out.append(live)
        return out

    def _profile_info(self, handle: Any, p: Profile) -> Any:
        return self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, p.nvml_id)

    def _read_instances(self, live: _LiveGPU, in_use_ids: set[int]) -> None:
        nv = self.nvml
        busy = {int(p.gpuInstanceId) for p in live.processes} | in_use_ids
        for p in live.model.profiles:
            try:
                info = self._profile_info(live.handle, p)
            except nv.NVMLError_NotSupported:
                continue
            array = (nv.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            nv.nvmlDeviceGetGpuInstances(live.handle, info.id, array, ctypes.byref(count))
            for i in range(count.value):
                gi = array[i]
                gi_info = nv.nvmlGpuInstanceGetInfo(gi)
                inst = ExistingInstance(p.name, int(gi_info.placement.start), int(gi_info.placement.size),
                                        int(gi_info.id) in busy, int(gi_info.id))
                live.gis[(p.name, inst.start)] = (gi, inst)

    # --- acting ---
    def _destroy(self, live: _LiveGPU, inst: ExistingInstance) -> None:
        nv = self.nvml
        gi, _ = live.gis[(inst.profile, inst.start)]
        for ci_profile in range(int(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except nv.NVMLError_NotSupported:
                continue
            array = (nv.c_nvmlComputeInstance_t * max(int(ci_info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            nv.nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, array, ctypes.byref(count))
            for i in range(count.value):
                nv.nvmlComputeInstanceDestroy(array[i])
        nv.nvmlGpuInstanceDestroy(gi)
        self.counters.destroyed += 1

    def _create(self, live: _LiveGPU, profile: Profile, start: int, size: int) -> None:
        nv = self.nvml
        info = self._profile_info(live.handle, profile)
        placement = nv.c_nvmlGpuInstancePlacement_t(start, size)
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(live.handle, info.id, ctypes.byref(placement))
        try:
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile.ci_profile_id, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except nv.NVMLError:
            nv.nvmlGpuInstanceDestroy(gi)  # no half-made instance left behind
            raise
        self.counters.created += 1

    def _report(self, result: ApplyResult) -> ApplyResult:
        if result.state == FAILED:
            self.counters.errors += 1
        if self.on_state is not None:
            self.on_state(result.state)
        return result

    def _mig_mode(self, gpus: list[_LiveGPU], enable: bool) -> ApplyResult | None:
        """Bring MIG mode to `enable` where allowed; a result when it cannot (yet) be done."""
        nv = self.nvml
        for g in gpus:
            if g.mig_current == enable and g.mig_pending == enable:
                continue
            if g.mig_current != enable and g.mig_pending == enable:
                return ApplyResult(PENDING, f"GPU {g.index}: MIG mode change waits for a GPU reset")
            if not self.allow_mig_mode_change:
                mode = "enabled" if g.mig_current else "disabled"
                return ApplyResult(FAILED, f"GPU {g.index}: MIG mode is {mode}; changing it is not allowed")
            if g.processes:
                return ApplyResult(FAILED, f"GPU {g.index}: {len(g.processes)} processes running; "
                                   "MIG mode not changed")
            if g.gis:
                return ApplyResult(FAILED, f"GPU {g.index}: GPU instances exist; MIG mode not changed")
            target = nv.NVML_DEVICE_MIG_ENABLE if enable else nv.NVML_DEVICE_MIG_DISABLE
            nv.nvmlDeviceSetMigMode(g.handle, target)
            self.counters.mig_mode_changes += 1
            current, pending = nv.nvmlDeviceGetMigMode(g.handle)
            g.mig_current, g.mig_pending = bool(current), bool(pending)
            if g.mig_current != enable:
                return ApplyResult(PENDING, f"GPU {g.index}: MIG mode change waits for a GPU reset")
        return None

    def _plan(self, gpus: list[_LiveGPU], desired: Desired) -> MigPlan:
        states = [GPUState(g.index, tuple(inst for _, inst in g.gis.values())) for g in gpus]
        if desired.layout:
            plans: list[GPUPlan] = []
            for g, s in zip(gpus, states, strict=True):
                plans.extend(plan_layout(g.model, [s], named_layout(g.model, desired.layout)).gpus)
            return MigPlan(",".join(sorted({g.model.name for g in gpus})), (), tuple(plans))
        models = {g.model.name for g in gpus}
        if len(models) != 1:
            raise PlanError(f"a node-wide demand needs one GPU model; found {', '.join(sorted(models))}")
        return plan_mig(gpus[0].model, states, dict(desired.demand))

    def apply(self, desired: Desired, in_use: Mapping[int, Collection[int]] | None = None) -> ApplyResult:
        """Converge to `desired`; `in_use` adds GPU-instance ids per GPU index that pods hold."""
        nv = self.nvml
        try:
            gpus = self._live(in_use or {})
            if not gpus:
                return self._report(ApplyResult(FAILED, "no MIG-capable GPU of a known model"))
            enable = True
            if desired.layout:
                enable = named_layout(gpus[0].model, desired.layout).mig_enabled
            if not enable:
                # Turning MIG off: first the idle instances go, then the mode changes.
                result = self._converge(gpus, Desired(demand=()), desired)
                if result.state != SUCCESS:
                    return result
                gpus = self._live(in_use or {})
            blocked = self._mig_mode(gpus, enable)
            if blocked is not None:
                return self._report(blocked)
            if not enable:
                return self._report(ApplyResult(SUCCESS, "MIG disabled"))
            gpus = self._live(in_use or {})
            return self._converge(gpus, desired, desired)
        except (PlanError, ConfigError, nv.NVMLError) as exc:
            message = str(exc) if isinstance(exc, (PlanError, ConfigError)) else f"NVML: {exc}"
            self._record(desired, None, "failed", message)
            return self._report(ApplyResult(FAILED, message))

    def _converge(self, gpus: list[_LiveGPU], target: Desired, desired: Desired) -> ApplyResult:
        plan = self._plan(gpus, target)
        if plan.operations == 0:
            recorded = read_plan_file(self.state_dir)
            if recorded is not None and recorded.get("status") != "done":
                self._record(desired, plan, "done", "")
            return self._report(ApplyResult(SUCCESS, "layout already in place", plan))
        if self.on_state is not None:
            self.on_state(PENDING)
        self._record(desired, plan, "in-progress", "")
        by_index = {g.index: g for g in gpus}
        for gp in plan.gpus:
            for inst in gp.destroy:
                self._destroy(by_index[gp.index], inst)
        for gp in plan.gpus:
            live = by_index[gp.index]
            for new in gp.create:
                self._create(live, live.model.profile(new.profile), new.start, new.size)
        after = {g.index: sorted((p, s) for p, s in g.gis) for g in self._live({})}
        for gp in plan.gpus:
            want = sorted((i.profile, i.start) for i in gp.layout)
            if after.get(gp.index) != want:
                message = f"GPU {gp.index}: layout after apply is {after.get(gp.index)}, planned {want}"
                self._record(desired, plan, "failed", message)
                return self._report(ApplyResult(FAILED, message, plan))
        self._record(desired, plan, "done", "")
        return self._report(ApplyResult(SUCCESS, f"{plan.operations} operations", plan))

    def _record(self, desired: Desired, plan: MigPlan | None, status: str, error: str) -> None:
        body: dict[str, Any] = {"status": status, "desired": desired.to_json()}
        if plan is not None:
            body["gpus"] = [{"index": g.index,
                             "create": [i.to_json() for i in g.create],
                             "destroy": [{"profile": i.profile, "start": i.start, "size": i.size,
                                          "gi_id": i.gi_id} for i in g.destroy],
                             "layout": [i.to_json() for i in g.layout]} for g in plan.gpus]
        if error:
            body["error"] = error
        write_plan_file(self.state_dir, body)

    def resume(self, in_use: Mapping[int, Collection[int]] | None = None) -> ApplyResult | None:
        """Finish a plan a previous run recorded but did not complete; None when there is none."""
        body = read_plan_file(self.state_dir)
        if body is None or body.get("status") != "in-progress":
            return None
        return self.apply(Desired.from_json(body.get("desired", {})), in_use)


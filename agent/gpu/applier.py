"""The MIG applier: bring the node's GPU instances to a desired layout through NVML.

`MigApplier(nvml, state_dir, ...)`: `.apply(desired, in_use, held_gpus)`, `.resume(in_use)`,
`.counters`; `Desired`, `ApplyResult`, `ApplyCounters`, `STATE_LABEL` states, `OPERATIONS`.
The plan is recorded in `mig-plan.json` before any step; it never destroys an instance in use and
changes MIG mode only when allowed on idle GPUs.  After a crash `resume()` finishes the plan or
rolls it back.  `nvml` is pynvml or a stand-in; nothing here imports pynvml.
Crash and rollback rules: agent/gpu/README.md, "The MIG applier".
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import ConfigError
from agent.gpu.layouts import named_layout, plan_layout
from agent.gpu.mig_live import LiveGPU, compute_instances, profile_info, read_live
from agent.gpu.planfile import (
    RecordedGPU,
    plan_body,
    read_plan_file,
    recorded_gpus,
    with_status,
    write_plan_file,
)
from agent.gpu.planner import (
    ExistingInstance,
    GPUPlan,
    GPUState,
    Instance,
    MigPlan,
    PlanError,
    plan_mig,
)
from agent.gpu.profiles import Profile

STATE_LABEL = "topolet.io/mig.config.state"
PENDING, SUCCESS, FAILED = "pending", "success", "failed"

# Operation names reported through `on_operation(op, result)`; result is "success" or "error".
OP_CREATE_GI = "gpu_instance_create"
OP_DESTROY_GI = "gpu_instance_destroy"
OP_CREATE_CI = "compute_instance_create"
OP_MIG_MODE = "mig_mode_change"
OPERATIONS = (OP_CREATE_GI, OP_DESTROY_GI, OP_CREATE_CI, OP_MIG_MODE)

OperationHook = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class Desired:
    """What the node should hold: a named layout (per GPU) or a node-wide demand."""

    layout: str = ""
    demand: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout} if self.layout else {"demand": dict(self.demand)}


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


class MigApplier:
    """Applies desired MIG layouts through one NVML module, recording plans under `state_dir`."""

    def __init__(self, nvml: Any, state_dir: str | os.PathLike[str], *, allow_mig_mode_change: bool = False,
                 on_state: Callable[[str], None] | None = None,
                 on_operation: OperationHook | None = None) -> None:
        self.nvml = nvml
        self.state_dir = state_dir
        self.allow_mig_mode_change = allow_mig_mode_change
        self.on_state = on_state
        self.on_operation = on_operation
        self.counters = ApplyCounters()

    def _count(self, op: str, ok: bool) -> None:
        if ok and op == OP_CREATE_GI:
            self.counters.created += 1
        elif ok and op == OP_DESTROY_GI:
            self.counters.destroyed += 1
        elif ok and op == OP_MIG_MODE:
            self.counters.mig_mode_changes += 1
        if self.on_operation is not None:
            self.on_operation(op, "success" if ok else "error")

    def _destroy(self, live: LiveGPU, inst: ExistingInstance) -> None:
        nv = self.nvml
        key = (inst.profile, inst.start)
        gi, _ = live.gis[key]
        try:
            for ci in compute_instances(nv, gi):
                nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError:
            self._count(OP_DESTROY_GI, False)
            raise
        del live.gis[key]
        live.no_ci.discard(key)
        self._count(OP_DESTROY_GI, True)

    def _create_ci(self, gi: Any, profile: Profile) -> None:
        nv = self.nvml
        try:
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile.ci_profile_id, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except nv.NVMLError:
            self._count(OP_CREATE_CI, False)
            raise
        self._count(OP_CREATE_CI, True)

    def _create(self, live: LiveGPU, profile: Profile, start: int, size: int) -> None:
        nv = self.nvml
        try:
            info = profile_info(nv, live.handle, profile)
            placement = nv.c_nvmlGpuInstancePlacement_t(start, size)
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(live.handle, info.id, ctypes.byref(placement))
        except nv.NVMLError:
            self._count(OP_CREATE_GI, False)
            raise
        self._count(OP_CREATE_GI, True)
        try:
            self._create_ci(gi, profile)
        except nv.NVMLError:
            nv.nvmlGpuInstanceDestroy(gi)  # no half-made instance left behind
            raise
        live.gis[(profile.name, start)] = (gi, ExistingInstance(profile.name, start, size))

    def _fill_compute_instances(self, live: LiveGPU, layout: Collection[Instance]) -> int:
        """Give each GPU instance of `layout` that has none its compute instance (a crash between
        the two creates leaves such a GPU instance behind); returns how many were made."""
        made = 0
        for inst in sorted(layout):
            key = (inst.profile, inst.start)
            if key in live.no_ci and key in live.gis:
                self._create_ci(live.gis[key][0], live.model.profile(inst.profile))
                live.no_ci.discard(key)
                made += 1
        return made

    def _report(self, result: ApplyResult) -> ApplyResult:
        if result.state == FAILED:
            self.counters.errors += 1
        if self.on_state is not None:
            self.on_state(result.state)
        return result

    def _mig_mode(self, gpus: list[LiveGPU], enable: bool, held: Collection[str]) -> ApplyResult | None:
        """Bring MIG mode to `enable` where allowed; a result when it cannot (yet) be done."""
        nv = self.nvml
        waiting: list[int] = []  # GPUs whose change is staged and takes effect at their next reset
        for g in gpus:
            if g.mig_current == enable and g.mig_pending == enable:
                continue
            if g.mig_current != enable and g.mig_pending == enable:
                waiting.append(g.index)
                continue
            if not self.allow_mig_mode_change:
                mode = "enabled" if g.mig_current else "disabled"
                return ApplyResult(FAILED, f"GPU {g.index}: MIG mode is {mode}; changing it is not allowed")
            if g.processes:
                return ApplyResult(FAILED, f"GPU {g.index}: {len(g.processes)} processes running; "
                                   "MIG mode not changed")
            if g.uuid in held or g.pci_address in held:
                # Handed out whole, perhaps before its owner has started a CUDA process.
                return ApplyResult(FAILED, f"GPU {g.index}: held whole by an allocation; "
                                   "MIG mode not changed")
            if g.gis:
                return ApplyResult(FAILED, f"GPU {g.index}: GPU instances exist; MIG mode not changed")
            target = nv.NVML_DEVICE_MIG_ENABLE if enable else nv.NVML_DEVICE_MIG_DISABLE
            try:
                nv.nvmlDeviceSetMigMode(g.handle, target)
            except nv.NVMLError:
                self._count(OP_MIG_MODE, False)
                raise
            self._count(OP_MIG_MODE, True)
            current, pending = nv.nvmlDeviceGetMigMode(g.handle)
            g.mig_current, g.mig_pending = bool(current), bool(pending)
            if g.mig_current != enable:
                waiting.append(g.index)
        if waiting:
            which = ", ".join(map(str, waiting))
            return ApplyResult(PENDING, f"GPU {which}: MIG mode change waits for a GPU reset")
        return None

    def _plan(self, gpus: list[LiveGPU], desired: Desired) -> MigPlan:
        states = [GPUState(g.index, tuple(inst for _, inst in g.gis.values())) for g in gpus]
        if desired.layout:
            plans: list[GPUPlan] = []
            for g, s in zip(gpus, states, strict=True):
                layout = named_layout(g.model, desired.layout)
                try:
                    plans.extend(plan_layout(g.model, [s], layout).gpus)
                except PlanError as exc:
                    # Planned one GPU at a time: say which, and what in use held it back.
                    busy = [f"{i.profile}@{i.start}" for i in s.instances if i.in_use]
                    held = f" (in-use instances stay: {', '.join(busy)})" if busy else ""
                    raise PlanError(f"GPU {g.index}: {desired.layout}: {exc}{held}") from None
            return MigPlan(",".join(sorted({g.model.name for g in gpus})), (), tuple(plans))
        models = {g.model.name for g in gpus}
        if len(models) != 1:
            raise PlanError(f"a node-wide demand needs one GPU model; found {', '.join(sorted(models))}")
        return plan_mig(gpus[0].model, states, dict(desired.demand))

    def apply(self, desired: Desired, in_use: Mapping[int, Collection[int]] | None = None,
              held_gpus: Collection[str] = ()) -> ApplyResult:
        """Converge to `desired`; `in_use` adds GPU-instance ids per GPU index that pods hold,
        `held_gpus` the GPUs (UUID or PCI address) allocations hold whole: their MIG mode stays."""
        nv = self.nvml
        try:
            gpus = read_live(self.nvml, in_use or {})
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
                gpus = read_live(self.nvml, in_use or {})
            blocked = self._mig_mode(gpus, enable, held_gpus)
            if blocked is not None:
                return self._report(blocked)
            if not enable:
                return self._report(ApplyResult(SUCCESS, "MIG disabled"))
            gpus = read_live(self.nvml, in_use or {})
            return self._converge(gpus, desired, desired)
        except (PlanError, ConfigError, nv.NVMLError) as exc:
            message = str(exc) if isinstance(exc, (PlanError, ConfigError)) else f"NVML: {exc}"
            self._record(desired, None, "failed", message)
            return self._report(ApplyResult(FAILED, message))

    def _converge(self, gpus: list[LiveGPU], target: Desired, desired: Desired) -> ApplyResult:
        plan = self._plan(gpus, target)
        by_index = {g.index: g for g in gpus}
        unfilled = sum(len(by_index[gp.index].no_ci & {(i.profile, i.start) for i in gp.layout})
                       for gp in plan.gpus)
        if plan.operations == 0 and not unfilled:
            recorded = read_plan_file(self.state_dir)
            if recorded is not None and recorded.get("status") != "done":
                self._record(desired, plan, "done", "")
            return self._report(ApplyResult(SUCCESS, "layout already in place", plan))
        if self.on_state is not None:
            self.on_state(PENDING)
        self._record(desired, plan, "in-progress", "")
        self._execute(plan.gpus, by_index)
        problem = self._verify(plan.gpus)
        if problem:
            self._record(desired, plan, "failed", problem)
            return self._report(ApplyResult(FAILED, problem, plan))
        self._record(desired, plan, "done", "")
        return self._report(ApplyResult(SUCCESS, f"{plan.operations + unfilled} operations", plan))

    def _execute(self, steps: Collection[GPUPlan], by_index: Mapping[int, LiveGPU]) -> None:
        """Destroys first (they free the slots), then creates, then missing compute instances."""
        for gp in steps:
            for inst in gp.destroy:
                self._destroy(by_index[gp.index], inst)
        for gp in steps:
            live = by_index[gp.index]
            for new in gp.create:
                self._create(live, live.model.profile(new.profile), new.start, new.size)
            self._fill_compute_instances(live, gp.layout)

    def _verify(self, steps: Collection[GPUPlan]) -> str:
        """"" when every GPU holds its planned layout, each instance with a compute instance."""
        after = {g.index: g for g in read_live(self.nvml, {})}
        for gp in steps:
            live = after.get(gp.index)
            have = sorted(live.gis) if live is not None else None
            want = sorted((i.profile, i.start) for i in gp.layout)
            if have != want:
                return f"GPU {gp.index}: layout after apply is {have}, planned {want}"
            if live is not None and live.no_ci:
                return f"GPU {gp.index}: GPU instances without a compute instance: {sorted(live.no_ci)}"
        return ""

    def _record(self, desired: Desired, plan: MigPlan | None, status: str, error: str) -> None:
        write_plan_file(self.state_dir, plan_body(desired.to_json(), plan, status, error))

    def resume(self, in_use: Mapping[int, Collection[int]] | None = None) -> ApplyResult | None:
        """Finish the plan a previous run recorded but did not complete, or roll it back when it
        can no longer be finished; None when no plan is pending."""
        body = read_plan_file(self.state_dir)
        if body is None or body.get("status") not in ("in-progress", "rolling-back"):
            return None
        nv = self.nvml
        try:
            steps = recorded_gpus(body)
            if body["status"] == "rolling-back":  # a crash interrupted the rollback: carry on with it
                return self._rollback(body, steps, str(body.get("error", "")), in_use or {})
            by_index = {g.index: g for g in read_live(self.nvml, in_use or {})}
            problem = self._unfinishable(steps, by_index)
            if not problem:
                try:
                    return self._finish(body, steps, by_index)
                except nv.NVMLError as exc:
                    problem = f"NVML: {exc}"
            return self._rollback(body, steps, problem, in_use or {})
        except (ConfigError, nv.NVMLError) as exc:
            message = str(exc) if isinstance(exc, ConfigError) else f"NVML: {exc}"
            self._write_status(body, "failed", message)
            return self._report(ApplyResult(FAILED, message))

    def _unfinishable(self, steps: list[RecordedGPU], by_index: Mapping[int, LiveGPU]) -> str:
        """Why the recorded plan cannot be finished from the live state; "" when it can."""
        for step in steps:
            live = by_index.get(step.index)
            if live is None or not live.mig_current:
                return f"GPU {step.index} is gone or no longer in MIG mode"
            for key, (_, inst) in sorted(live.gis.items()):
                if key in step.layout:
                    continue
                if key not in step.destroy:
                    return (f"GPU {step.index}: instance {inst.profile}@{inst.start} is not part of the "
                            "recorded plan")
                if inst.in_use:
                    return (f"GPU {step.index}: instance {inst.profile}@{inst.start}, which the plan "
                            "destroys, is in use")
        return ""

    def _finish(self, body: dict[str, Any], steps: list[RecordedGPU],
                by_index: Mapping[int, LiveGPU]) -> ApplyResult:
        remaining: list[GPUPlan] = []
        for step in steps:
            live = by_index[step.index]
            destroy = tuple(inst for key, (_, inst) in sorted(live.gis.items()) if key in step.destroy)
            create = tuple(sorted(i for key, i in step.layout.items() if key not in live.gis))
            remaining.append(GPUPlan(step.index, tuple(sorted(step.layout.values())), create, destroy))
        self._execute(remaining, by_index)
        problem = self._verify(remaining)
        if problem:
            self._write_status(body, "failed", problem)
            return self._report(ApplyResult(FAILED, problem))
        self._write_status(body, "done", "")
        done = sum(g.operations for g in remaining)
        return self._report(ApplyResult(SUCCESS, f"finished the recorded plan ({done} operations left)"))

    def _rollback(self, body: dict[str, Any], steps: list[RecordedGPU], problem: str,
                  in_use: Mapping[int, Collection[int]]) -> ApplyResult:
        """Undo the recorded plan as far as it is safe: destroy the idle instances it created,
        recreate the ones it destroyed where their slots are free.  Always a FAILED result."""
        self._write_status(body, "rolling-back", problem)
        nv = self.nvml
        by_index = {g.index: g for g in read_live(self.nvml, in_use)}
        destroyed = restored = 0
        notes: list[str] = []
        for step in steps:
            live = by_index.get(step.index)
            if live is None or not live.mig_current:
                notes.append(f"GPU {step.index} not in MIG mode")
                continue
            for key in sorted(step.create):
                if key not in live.gis:
                    continue
                made = live.gis[key][1]
                if made.in_use:
                    notes.append(f"GPU {step.index}: {made.profile}@{made.start} kept (in use)")
                    continue
                self._destroy(live, made)
                destroyed += 1
            for key, gone in sorted(step.destroy.items()):
                if key in live.gis:
                    continue
                try:
                    self._create(live, live.model.profile(gone.profile), gone.start, gone.size)
                    restored += 1
                except nv.NVMLError as exc:
                    notes.append(f"GPU {step.index}: {gone.profile}@{gone.start} not restored ({exc})")
        message = (f"recorded plan not finished: {problem}; rolled back: {destroyed} created "
                   f"instance(s) destroyed, {restored} destroyed instance(s) restored")
        if notes:
            message += f" ({'; '.join(notes)})"
        self._write_status(body, "rolled-back", message)
        return self._report(ApplyResult(FAILED, message))

    def _write_status(self, body: dict[str, Any], status: str, error: str) -> None:
        write_plan_file(self.state_dir, with_status(body, status, error))

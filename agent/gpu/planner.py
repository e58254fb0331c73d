"""The MIG planner: a pure, deterministic function from (model, instances per GPU, demand) to a plan.

Every valid layout of a model is enumerated once and cached; a memoized search across GPUs picks one
layout per GPU so the node holds exactly the demand, ranked by GPUs used, then operations, then the
contiguous free slices left.  In-use instances count towards the demand and are never touched
(README.md, "The planner").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from agent.errors import AllocationError
from agent.gpu.profiles import GPUModel, Placement

Layout = tuple[tuple[int, int], ...]  # sorted (profile index, start) pairs

# GPUs one node can hold: the NVIDIA driver supports at most 32 per system (NV_MAX_DEVICES in
# open-gpu-kernel-modules' nvlimits.h).  Planning for more describes no machine, and the search
# grows with the GPU count.
MAX_GPUS = 32
Counts = tuple[int, ...]  # instances per profile index


class PlanError(AllocationError):
    """No layout satisfies the demand; the message says exactly why."""


@dataclass(frozen=True, slots=True, order=True)
class Instance:
    """A GPU instance in a layout: its profile and memory-slice placement."""

    start: int
    size: int
    profile: str

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start, "size": self.size}


@dataclass(frozen=True, slots=True)
class ExistingInstance:
    """A GPU instance that exists now; `in_use` ones (processes, or handed to a pod) stay as they are."""

    profile: str
    start: int
    size: int
    in_use: bool = False
    gi_id: int = -1  # NVML GPU-instance id, -1 when not known

    @property
    def instance(self) -> Instance:
        return Instance(self.start, self.size, self.profile)


@dataclass(frozen=True, slots=True)
class GPUState:
    """One MIG-enabled GPU as it is now."""

    index: int
    instances: tuple[ExistingInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class GPUPlan:
    """What one GPU ends up holding and the operations that get it there."""

    index: int
    layout: tuple[Instance, ...]  # the final instances, ascending start
    create: tuple[Instance, ...]
    destroy: tuple[ExistingInstance, ...]

    @property
    def operations(self) -> int:
        return len(self.create) + len(self.destroy)


@dataclass(frozen=True, slots=True)
class MigPlan:
    model: str
    demand: tuple[tuple[str, int], ...]  # (profile, count), model order, counts > 0
    gpus: tuple[GPUPlan, ...]

    @property
    def operations(self) -> int:
        return sum(g.operations for g in self.gpus)

    @property
    def gpus_used(self) -> int:
        return sum(1 for g in self.gpus if g.layout)

    def to_json(self) -> dict[str, Any]:
        return {"gpus": [{"index": g.index, "instances": [i.to_json() for i in g.layout]}
                         for g in self.gpus]}


def parse_demand(text: str) -> dict[str, int]:
    """Parse "3g.40gb=1,2g.20gb=2" into {profile: count}; raises PlanError on bad text."""
    out: dict[str, int] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise PlanError(f"bad demand item {part!r}: want profile=count")
        try:
            n = int(count.strip())
        except ValueError:
            raise PlanError(f"bad count in demand item {part!r}") from None
        if n < 0:
            raise PlanError(f"negative count in demand item {part!r}")
        if name in out:
            raise PlanError(f"profile {name} named twice in demand")
        out[name] = n
    return out


def format_demand(demand: Iterable[tuple[str, int]]) -> str:
    return ",".join(f"{p}={n}" for p, n in demand)


def _free_run(mask: int, slices: int) -> int:
    """Length of the longest run of free memory slices in `mask`."""
    best = run = 0
    for s in range(slices):
        if mask >> s & 1:
            run = 0
        else:
            run += 1
            best = max(best, run)
    return best


@cache
def all_layouts(model: GPUModel) -> tuple[tuple[Layout, Counts, int], ...]:
    """Every valid layout of one GPU of `model`: (layout, counts per profile, occupied slice mask)."""
    profiles = model.profiles
    starts: dict[int, list[tuple[int, Placement]]] = {}
    for pi, p in enumerate(profiles):
        for pl in p.placements:
            starts.setdefault(pl.start, []).append((pi, pl))
    out: list[tuple[Layout, Counts, int]] = []
    counts = [0] * len(profiles)
    chosen: list[tuple[int, int]] = []

    def walk(slot: int, mask: int, compute: int) -> None:
        if slot >= model.memory_slices:
            out.append((tuple(chosen), tuple(counts), mask))
            return
        walk(slot + 1, mask, compute)
        if mask >> slot & 1:
            return
        for pi, pl in starts.get(slot, ()):
            p = profiles[pi]
            if (pl.mask & mask or pl.start + pl.size > model.memory_slices
                    or compute + p.compute_slices > model.compute_slices or counts[pi] >= p.max_count):
                continue
            counts[pi] += 1
            chosen.append((pi, pl.start))
            walk(slot + 1, mask | pl.mask, compute + p.compute_slices)
            chosen.pop()
            counts[pi] -= 1

    walk(0, 0, 0)
    # A layout is reached once per set of empty slots it skips; keep one copy of each.
    unique = {lay: (lay, c, m) for lay, c, m in out}
    return tuple(sorted(unique.values()))


@dataclass(frozen=True, slots=True)
class _Choice:
    counts: Counts
    layout: Layout
    used: int
    ops: int
    free_run: int


@cache
def _gpu_choices(model: GPUModel, gpu: GPUState) -> tuple[_Choice, ...]:
    """For one GPU: the best layout for each multiset it can hold while keeping its in-use instances.

    Larger multisets come first so that, among equal plans, lower-indexed GPUs are filled first.
    """
    index = {p.name: i for i, p in enumerate(model.profiles)}
    required: set[tuple[int, int]] = set()
    idle: set[tuple[int, int]] = set()
    for inst in gpu.instances:
        if inst.profile not in index:
            raise PlanError(f"GPU {gpu.index}: instance of unknown profile {inst.profile} on {model.name}")
        pi = index[inst.profile]
        if Placement(inst.start, inst.size) not in model.profiles[pi].placements:
            raise PlanError(f"GPU {gpu.index}: instance {inst.profile} at {inst.start}:{inst.size} "
                            f"is not a valid placement on {model.name}")
        (required if inst.in_use else idle).add((pi, inst.start))
    best: dict[Counts, _Choice] = {}
    for layout, counts, mask in all_layouts(model):
        pairs = set(layout)
        if not required <= pairs:
            continue
        kept_idle = len(idle & pairs)
        ops = (len(pairs) - len(required) - kept_idle) + (len(idle) - kept_idle)
        c = _Choice(counts, layout, 1 if layout else 0, ops,
                    _free_run(mask, model.memory_slices))
        cur = best.get(counts)
        if cur is None or (c.ops, -c.free_run, c.layout) < (cur.ops, -cur.free_run, cur.layout):
            best[counts] = c
    return tuple(sorted(best.values(), key=lambda c: c.counts, reverse=True))


def _precheck(model: GPUModel, gpus: Sequence[GPUState], need: Counts, in_use: Counts) -> None:
    """Raise PlanError with the first simple reason the demand cannot fit."""
    n = len(gpus)
    for p, want in zip(model.profiles, need, strict=True):
        if want > p.max_count * n:
            raise PlanError(f"{p.name}={want} exceeds max {p.max_count} per GPU on {model.name} × {n}")
    new = [w - u for w, u in zip(need, in_use, strict=True)]
    compute_need = sum(k * p.compute_slices for k, p in zip(new, model.profiles, strict=True))
    compute_free = n * model.compute_slices - sum(
        k * p.compute_slices for k, p in zip(in_use, model.profiles, strict=True))
    if compute_need > compute_free:
        raise PlanError(f"needs {compute_need} compute slices; {compute_free} free")
    mem_need = sum(k * p.memory_slices for k, p in zip(new, model.profiles, strict=True))
    mem_free = n * model.memory_slices - sum(
        k * p.memory_slices for k, p in zip(in_use, model.profiles, strict=True))
    if mem_need > mem_free:
        raise PlanError(f"needs {mem_need} memory slices; {mem_free} free")


def plan_mig(model: GPUModel, gpus: Sequence[GPUState], demand: Mapping[str, int]) -> MigPlan:
    """Plan GPU instances so the GPUs hold exactly `demand` (in-use surplus kept); PlanError if none."""
    if not gpus:
        raise PlanError("no GPUs to plan for")
    if len(gpus) > MAX_GPUS:
        raise PlanError(f"{len(gpus)} GPUs: one node holds at most {MAX_GPUS} (the NVIDIA driver's limit)")
    if len({g.index for g in gpus}) != len(gpus):
        raise PlanError("GPU indices repeat")
    unknown = sorted(p for p in demand if not model.has_profile(p))
    if unknown:
        raise PlanError(f"unknown profile {', '.join(unknown)} on {model.name} "
                        f"(known: {', '.join(model.profile_names)})")
    if any(n < 0 for n in demand.values()):
        raise PlanError("negative count in demand")
    index = {p.name: i for i, p in enumerate(model.profiles)}
    in_use = [0] * len(model.profiles)
    for g in gpus:
        for inst in g.instances:
            if inst.in_use and inst.profile in index:
                in_use[index[inst.profile]] += 1
    # In-use instances are never destroyed, so the node ends with at least that many of each.
    need = tuple(max(demand.get(p.name, 0), in_use[i]) for i, p in enumerate(model.profiles))
    _precheck(model, gpus, need, tuple(in_use))

    ordered = sorted(gpus, key=lambda g: g.index)
    choices = [_gpu_choices(model, g) for g in ordered]
    # Fresh GPUs are interchangeable, so the best plan fills the lowest ones and leaves the rest
    # empty; it never needs more GPUs than there are instances: search only those.
    span = min(len(ordered), sum(need)) if all(not g.instances for g in ordered) else len(ordered)
    picked = _search(model, choices[:span], need)
    if picked is not None:
        picked += [cs[-1] for cs in choices[span:]]  # each fresh GPU's last choice: empty
    if picked is None:
        kept = [f"GPU {g.index} {i.profile}@{i.start}" for g in ordered for i in g.instances if i.in_use]
        detail = f" keeping in-use {', '.join(kept)}" if kept else ""
        raise PlanError(f"no placement: no layout of {format_demand(_pairs(model, need))} fits "
                        f"{len(gpus)} × {model.name}{detail}")
    plans = tuple(_gpu_plan(model, g, c) for g, c in zip(ordered, picked, strict=True))
    return MigPlan(model.name, _pairs(model, need), plans)


def _search(model: GPUModel, choices: Sequence[tuple[_Choice, ...]], need: Counts) -> list[_Choice] | None:
    """One choice per GPU whose counts sum to `need` at the least cost; None when none does.

    Dynamic programming over GPUs, iterative (a node's worth of GPUs never nests the stack): the
    states of GPU i are the demands still open after GPUs 0..i-1, found walking forward; the best
    completion of each is then settled walking back.  Cost is (GPUs used, operations, -free run);
    ties go to the earlier choice (larger multisets first), so lower-indexed GPUs fill first.

    A demand is packed into one integer, a field per profile with a guard bit on top: subtracting a
    choice's counts borrows from a guard exactly when the choice holds more than is open.
    """
    width = max(need, default=0).bit_length() + 1
    guards = sum(1 << (p * width + width - 1) for p in range(len(need)))

    def pack(counts: Counts) -> int:
        return sum(k << (p * width) for p, k in enumerate(counts))

    n = len(choices)
    # Only choices within the demand can ever be picked; dropping the rest up front is most of the speed.
    usable = [[(pack(c.counts), c) for c in cs if all(a <= b for a, b in zip(c.counts, need, strict=True))]
              for cs in choices]
    # Capacity left after GPU i bounds what can still be open there: a state past it is dead.
    mem = [p.memory_slices for p in model.profiles]
    compute = [p.compute_slices for p in model.profiles]
    mem_cap = [max((sum(k * m for k, m in zip(c.counts, mem, strict=True)) for _, c in cs), default=0)
               for cs in usable]
    compute_cap = [max((sum(k * m for k, m in zip(c.counts, compute, strict=True)) for _, c in cs), default=0)
                   for cs in usable]
    mem_after = [sum(mem_cap[i:]) for i in range(n + 1)]
    compute_after = [sum(compute_cap[i:]) for i in range(n + 1)]

    def unpack(key: int) -> list[int]:
        mask = (1 << width) - 1
        return [key >> (p * width) & mask for p in range(len(need))]

    def alive(key: int, i: int) -> bool:
        open_ = unpack(key)
        return (sum(k * m for k, m in zip(open_, mem, strict=True)) <= mem_after[i]
                and sum(k * m for k, m in zip(open_, compute, strict=True)) <= compute_after[i])

    start = pack(need)
    if not alive(start, 0):
        return None
    levels: list[set[int]] = [{start}]
    for i in range(n):
        nxt: set[int] = set()
        for key in levels[i]:
            lifted = key | guards
            for ck, _ in usable[i]:
                rest = lifted - ck
                if rest & guards == guards:
                    rest ^= guards
                    if rest not in nxt and alive(rest, i + 1):
                        nxt.add(rest)
        levels.append(nxt)
    Cost = tuple[int, int, int]
    settled: list[dict[int, tuple[Cost, int]]] = [{} for _ in range(n + 1)]
    if 0 not in levels[n]:
        return None
    settled[n][0] = ((0, 0, 0), -1)
    for i in range(n - 1, -1, -1):
        after = settled[i + 1]
        here = settled[i]
        for key in levels[i]:
            lifted = key | guards
            found: tuple[Cost, int] | None = None
            for j, (ck, c) in enumerate(usable[i]):
                rest = lifted - ck
                if rest & guards != guards:
                    continue
                tail = after.get(rest ^ guards)
                if tail is None:
                    continue
                cost = (tail[0][0] + c.used, tail[0][1] + c.ops, tail[0][2] - c.free_run)
                if found is None or cost < found[0]:
                    found = (cost, j)
            if found is not None:
                here[key] = found
    if start not in settled[0]:
        return None
    picked: list[_Choice] = []
    key = start
    for i in range(n):
        ck, c = usable[i][settled[i][key][1]]
        picked.append(c)
        key -= ck
    return picked


def _pairs(model: GPUModel, counts: Counts) -> tuple[tuple[str, int], ...]:
    return tuple((p.name, k) for p, k in zip(model.profiles, counts, strict=True) if k)


def _gpu_plan(model: GPUModel, gpu: GPUState, choice: _Choice) -> GPUPlan:
    layout = tuple(sorted(Instance(start, model.profiles[pi].memory_slices, model.profiles[pi].name)
                          for pi, start in choice.layout))
    final = set(layout)
    existing = {i.instance for i in gpu.instances}
    create = tuple(i for i in layout if i not in existing)
    destroy = tuple(sorted((i for i in gpu.instances if i.instance not in final),
                           key=lambda i: (i.start, i.profile)))
    return GPUPlan(gpu.index, layout, create, destroy)


def fresh_gpus(count: int) -> tuple[GPUState, ...]:
    """`count` MIG-enabled GPUs with no instances (what `topolet mig plan` plans for)."""
    return tuple(GPUState(i) for i in range(count))

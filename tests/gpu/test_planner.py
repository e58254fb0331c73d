"""The MIG planner: every multiset that fits one GPU is planned validly, every other one refused."""

from __future__ import annotations

import inspect
import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from functools import cache

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.gpu.planner import (
    MAX_GPUS,
    ExistingInstance,
    GPUState,
    MigPlan,
    PlanError,
    fresh_gpus,
    parse_demand,
    plan_mig,
)
from agent.gpu.profiles import H100_80GB, H200_141GB, MODELS, GPUModel, Placement, resolve_model


def check_plan(model: GPUModel, gpus: Sequence[GPUState], demand: dict[str, int], plan: MigPlan) -> None:
    """Verify a plan from first principles: valid placements, no overlap, limits, exact demand."""
    total: Counter[str] = Counter()
    assert [g.index for g in plan.gpus] == sorted(g.index for g in gpus)
    for gp, state in zip(plan.gpus, sorted(gpus, key=lambda g: g.index), strict=True):
        used = 0
        compute = 0
        per: Counter[str] = Counter()
        for inst in gp.layout:
            p = model.profile(inst.profile)
            pl = Placement(inst.start, inst.size)
            assert pl in p.placements, inst
            assert not used & pl.mask, f"overlap at {inst}"
            used |= pl.mask
            compute += p.compute_slices
            per[inst.profile] += 1
        assert compute <= 7
        assert all(n <= model.profile(name).max_count for name, n in per.items())
        total.update(per)
        layout = set(gp.layout)
        for e in state.instances:
            if e.in_use:
                assert e.instance in layout and e not in gp.destroy
        existing = {e.instance for e in state.instances}
        assert set(gp.create) == layout - existing
        assert {e.instance for e in gp.destroy} == existing - layout
    in_use = Counter(e.profile for g in gpus for e in g.instances if e.in_use)
    want = {p: max(demand.get(p, 0), in_use.get(p, 0)) for p in set(demand) | set(in_use)}
    assert {p: n for p, n in total.items() if n} == {p: n for p, n in want.items() if n}


@cache
def fits_one_gpu(model: GPUModel, counts: tuple[int, ...]) -> bool:
    """Independent oracle: place instances profile by profile (largest first) with backtracking."""
    items = sorted((p for p, n in zip(model.profiles, counts, strict=True) for _ in range(n)),
                   key=lambda p: -p.memory_slices)
    if sum(p.compute_slices for p in items) > 7:
        return False

    def place(i: int, used: int, min_start: int) -> bool:
        if i == len(items):
            return True
        p = items[i]
        same = i > 0 and items[i - 1] is p
        for pl in p.placements:
            # identical instances are interchangeable: place them in ascending start to prune
            if same and pl.start < min_start:
                continue
            if not used & pl.mask and place(i + 1, used | pl.mask, pl.start + 1):
                return True
        return False

    return place(0, 0, 0)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_every_single_gpu_multiset(model: GPUModel) -> None:
    feasible = 0
    for counts in itertools.product(*(range(p.max_count + 1) for p in model.profiles)):
        demand = {p.name: n for p, n in zip(model.profiles, counts, strict=True) if n}
        gpus = fresh_gpus(1)
        if fits_one_gpu(model, counts):
            feasible += 1
            check_plan(model, gpus, demand, plan_mig(model, gpus, demand))
        else:
            with pytest.raises(PlanError) as err:
                plan_mig(model, gpus, demand)
            msg = str(err.value)
            # on a fresh GPU the slice counts alone decide: no multiset passes them and fails placement
            assert msg.startswith("needs "), msg
            compute = sum(n * p.compute_slices for p, n in zip(model.profiles, counts, strict=True))
            if compute > 7:
                assert msg == f"needs {compute} compute slices; 7 free"
    assert feasible > 100  # the oracle is not vacuous


@pytest.mark.parametrize(("demand", "gpus", "reason"), [
    ("3g.40gb=3", 1, "3g.40gb=3 exceeds max 2 per GPU on H100-80GB × 1"),
    ("1g.10gb+me=3", 2, "1g.10gb+me=3 exceeds max 1 per GPU on H100-80GB × 2"),
    ("4g.40gb=1,3g.40gb=1,1g.10gb=1", 1, "needs 8 compute slices; 7 free"),
    ("1g.20gb=4,1g.10gb=1", 1, "needs 9 memory slices; 8 free"),
    ("3g.40gb=1,1g.10gb=4,1g.20gb=0", 1, None),  # fits: 3g at 4..7, four 1g at 0..3
    ("4g.40gb=1,1g.10gb=3", 1, None),
    ("2g.20gb=3,1g.20gb=1", 1, None),  # 2g at 0, 2, 4 and the double-memory 1g at 6..7
    ("bogus=1", 1, "unknown profile bogus on H100-80GB"),
])
def test_reasons(demand: str, gpus: int, reason: str | None) -> None:
    if reason is None:
        check_plan(H100_80GB, fresh_gpus(gpus), parse_demand(demand),
                   plan_mig(H100_80GB, fresh_gpus(gpus), parse_demand(demand)))
        return
    with pytest.raises(PlanError) as err:
        plan_mig(H100_80GB, fresh_gpus(gpus), parse_demand(demand))
    assert str(err.value).startswith(reason)


def test_fewest_gpus_and_lowest_indices_first() -> None:
    plan = plan_mig(H100_80GB, fresh_gpus(4), {"3g.40gb": 1, "1g.10gb": 4})
    assert plan.gpus_used == 1
    assert plan.gpus[0].layout and not any(g.layout for g in plan.gpus[1:])
    plan = plan_mig(H100_80GB, fresh_gpus(4), {"7g.80gb": 2, "2g.20gb": 1})
    assert plan.gpus_used == 3


def test_leaves_largest_contiguous_free_space() -> None:
    # One 3g instance: either half works; the planner must not split the free slices.
    plan = plan_mig(H100_80GB, fresh_gpus(1), {"1g.10gb": 2})
    starts = sorted(i.start for i in plan.gpus[0].layout)
    assert starts in ([0, 1], [4, 5]) or starts == [6, 5]  # 1g pair packed at an edge of a half
    assert starts == [0, 1]  # and deterministic: the lowest
    plan = plan_mig(H100_80GB, fresh_gpus(1), {"2g.20gb": 1, "1g.10gb": 1})
    used = {s for i in plan.gpus[0].layout for s in range(i.start, i.start + i.size)}
    assert used == {0, 1, 2}  # 5 free slices in a row remain


def test_in_use_instances_are_kept_and_idle_ones_reused_or_destroyed() -> None:
    gpu = GPUState(0, (
        ExistingInstance("1g.10gb", 5, 1, in_use=True, gi_id=3),
        ExistingInstance("2g.20gb", 0, 2, in_use=False, gi_id=1),
        ExistingInstance("1g.10gb", 2, 1, in_use=False, gi_id=2),
    ))
    plan = plan_mig(H100_80GB, [gpu], {"2g.20gb": 1, "1g.10gb": 1})
    check_plan(H100_80GB, [gpu], {"2g.20gb": 1, "1g.10gb": 1}, plan)
    gp = plan.gpus[0]
    assert gp.create == ()  # the idle 2g is reused
    assert [d.gi_id for d in gp.destroy] == [2]
    # Slices and compute suffice, but the in-use 1g at slice 5 leaves 3g only at 0 and 2g nowhere.
    with pytest.raises(PlanError) as err:
        plan_mig(H100_80GB, [gpu], {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1})
    assert str(err.value) == ("no placement: no layout of 1g.10gb=1,2g.20gb=1,3g.40gb=1 fits "
                              "1 × H100-80GB keeping in-use GPU 0 1g.10gb@5")


def test_in_use_surplus_stays_even_when_demand_is_smaller() -> None:
    gpu = GPUState(0, (ExistingInstance("3g.40gb", 0, 4, in_use=True),))
    plan = plan_mig(H100_80GB, [gpu], {})
    assert [i.profile for i in plan.gpus[0].layout] == ["3g.40gb"] and plan.operations == 0


def test_satisfied_layout_needs_no_operations() -> None:
    first = plan_mig(H200_141GB, fresh_gpus(2), {"3g.71gb": 2, "1g.18gb": 3})
    states = [GPUState(g.index, tuple(ExistingInstance(i.profile, i.start, i.size) for i in g.layout))
              for g in first.gpus]
    again = plan_mig(H200_141GB, states, {"3g.71gb": 2, "1g.18gb": 3})
    assert again.operations == 0
    assert [g.layout for g in again.gpus] == [g.layout for g in first.gpus]


def test_invalid_existing_placement_is_refused() -> None:
    gpu = GPUState(0, (ExistingInstance("3g.40gb", 2, 4, in_use=True),))
    with pytest.raises(PlanError, match="not a valid placement"):
        plan_mig(H100_80GB, [gpu], {})


def test_profile_ids_are_pynvmls() -> None:
    p = {q.name: q for q in H100_80GB.profiles}
    assert p["1g.10gb"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert p["1g.10gb+me"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    assert p["1g.20gb"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert p["2g.20gb"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
    assert p["3g.40gb"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    assert p["4g.40gb"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
    assert p["7g.80gb"].nvml_id == pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    assert p["3g.40gb"].ci_profile_id == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    assert p["7g.80gb"].ci_profile_id == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_tables_are_consistent(model: GPUModel) -> None:
    for p in model.profiles:
        assert p.placements and all(pl.size == p.memory_slices for pl in p.placements)
        assert all(0 <= pl.start and pl.start + pl.size <= 8 for pl in p.placements)
        assert p.max_count <= len(p.placements)
    assert model.checked_on_hardware is False or model is not H200_141GB


@pytest.mark.parametrize(("name", "want"), [
    ("H100-80GB", "H100-80GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("NVIDIA H200", "H200-141GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100 80GB PCIe", "A100-80GB"),
    ("NVIDIA H100 NVL", None), ("NVIDIA L4", None),
])
def test_resolve_model(name: str, want: str | None) -> None:
    m = resolve_model(name)
    assert (m.name if m else None) == want


@pytest.mark.parametrize("text", ["3g.40gb", "3g.40gb=x", "3g.40gb=-1", "a=1,a=2", "=1"])
def test_bad_demand_text(text: str) -> None:
    with pytest.raises(PlanError):
        parse_demand(text)


_profiles = [p.name for p in H100_80GB.profiles]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.dictionaries(st.sampled_from(_profiles), st.integers(0, 6), max_size=4))
def test_multi_gpu_plans_are_valid_and_deterministic(gpus: int, demand: dict[str, int]) -> None:
    try:
        plan = plan_mig(H100_80GB, fresh_gpus(gpus), demand)
    except PlanError as exc:
        assert str(exc)
        return
    check_plan(H100_80GB, fresh_gpus(gpus), demand, plan)
    assert plan_mig(H100_80GB, fresh_gpus(gpus), demand) == plan
    # never more GPUs than the number of non-empty single-GPU chunks could need
    assert plan.gpus_used <= gpus


def test_more_gpus_than_a_node_holds_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="at most 32"):
        plan_mig(H100_80GB, fresh_gpus(MAX_GPUS + 1), {"1g.10gb": 1})


def test_the_planner_does_not_recurse_per_gpu() -> None:
    # With stack room for only a few frames beyond this test's own, a 32-GPU plan still completes.
    depth = len(inspect.stack(0))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 25)
    try:
        plan = plan_mig(H100_80GB, fresh_gpus(MAX_GPUS), {"2g.20gb": 40, "1g.10gb": 20})
    finally:
        sys.setrecursionlimit(limit)
    check_plan(H100_80GB, fresh_gpus(MAX_GPUS), {"2g.20gb": 40, "1g.10gb": 20}, plan)
    assert plan.gpus_used == 15  # 40 × 2 + 20 × 1 compute slices, 7 per GPU: at least 15 GPUs


def test_fresh_gpus_left_over_stay_empty_and_last() -> None:
    plan = plan_mig(H100_80GB, fresh_gpus(MAX_GPUS), {"7g.80gb": 2, "1g.10gb": 3})
    assert [len(g.layout) for g in plan.gpus] == [3, 1, 1] + [0] * (MAX_GPUS - 3)
    assert plan.operations == 5

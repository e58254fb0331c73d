"""Named MIG layouts (the vocabulary of the node label `topolet.io/mig.config`) turned into demands.

The names follow NVIDIA MIG manager's default configuration (`all-disabled`, `all-enabled`,
`all-<profile>`, `all-balanced`) so clusters that already label nodes that way keep their meaning:
`all-<profile>` fills every GPU with the most instances of that profile it holds; `all-balanced`
gives each GPU 2 × 1g, 1 × 2g and 1 × 3g of the model's smallest memory sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.errors import ConfigError
from agent.gpu.planner import GPUState, MigPlan, plan_mig
from agent.gpu.profiles import (
    GI_1_SLICE,
    GI_2_SLICE,
    GI_3_SLICE,
    GPUModel,
)


@dataclass(frozen=True, slots=True)
class NamedLayout:
    """What a named layout asks of every GPU: MIG mode, and the instances per GPU."""

    name: str
    mig_enabled: bool
    per_gpu: tuple[tuple[str, int], ...]

    def demand(self, gpus: int) -> dict[str, int]:
        """The node-wide demand for `gpus` GPUs (the planner's input)."""
        return {p: n * gpus for p, n in self.per_gpu}


def layout_names(model: GPUModel) -> tuple[str, ...]:
    """Every named layout `model` understands, spelled as valid label values."""
    return ("all-disabled", "all-enabled", "all-balanced",
            *(f"all-{p.name.replace('+me', '.me')}" for p in model.profiles))


def named_layout(model: GPUModel, name: str) -> NamedLayout:
    """Resolve a named layout for `model`; ConfigError names the valid ones when `name` is unknown."""
    if name == "all-disabled":
        return NamedLayout(name, False, ())
    if name == "all-enabled":
        return NamedLayout(name, True, ())
    if name == "all-balanced":
        one = model.profile_by_nvml_id(GI_1_SLICE).name
        two = model.profile_by_nvml_id(GI_2_SLICE).name
        three = model.profile_by_nvml_id(GI_3_SLICE).name
        return NamedLayout(name, True, ((one, 2), (two, 1), (three, 1)))
    if name.startswith("all-"):
        # MIG manager spells "+me" as ".me" because "+" is not valid in a label value.
        profile = name[4:].replace(".me", "+me")
        if model.has_profile(profile):
            return NamedLayout(name, True, ((profile, model.profile(profile).max_count),))
    raise ConfigError(f"unknown MIG layout {name!r} for {model.name} "
                      f"(known: {', '.join(layout_names(model))})")


def plan_layout(model: GPUModel, gpus: Sequence[GPUState], layout: NamedLayout) -> MigPlan:
    """Plan a named layout: each GPU on its own gets the layout's per-GPU instances."""
    per_gpu = dict(layout.per_gpu)
    plans = [plan_mig(model, (g,), per_gpu).gpus[0] for g in sorted(gpus, key=lambda g: g.index)]
    return MigPlan(model.name, tuple((p, n * len(plans)) for p, n in layout.per_gpu), tuple(plans))

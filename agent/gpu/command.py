"""`topolet mig plan`: plan GPU instances for a demand on N fresh GPUs of one model."""

from __future__ import annotations

import argparse
import json
import sys

from agent.errors import ConfigError
from agent.gpu.layouts import named_layout, plan_layout
from agent.gpu.planner import MAX_GPUS, PlanError, fresh_gpus, parse_demand, plan_mig
from agent.gpu.profiles import MODELS, resolve_model


def _error(message: str) -> int:
    print(json.dumps({"error": message}, ensure_ascii=False))
    return 1


def run_mig(args: argparse.Namespace) -> int:
    """Print the plan as JSON (or a table); exit 1 with {"error": ...} when it cannot be planned."""
    model = resolve_model(args.gpu_model)
    if model is None:
        return _error(f"unknown GPU model {args.gpu_model!r} "
                      f"(known: {', '.join(m.name for m in MODELS)}, or an NVML product name)")
    gpus = int(args.gpus)
    if not 1 <= gpus <= MAX_GPUS:
        return _error(f"--gpus must be 1 to {MAX_GPUS} (the most one node holds), got {gpus}")
    text = str(args.demand).strip()
    try:
        if "=" in text or not text:
            plan = plan_mig(model, fresh_gpus(gpus), parse_demand(text))
        else:
            plan = plan_layout(model, fresh_gpus(gpus), named_layout(model, text))
    except (PlanError, ConfigError) as exc:
        return _error(str(exc))
    if getattr(args, "format", "json") == "table":
        for g in plan.gpus:
            cells = " ".join(f"{i.profile}@{i.start}:{i.size}" for i in g.layout) or "-"
            print(f"GPU {g.index}: {cells}")
    else:
        json.dump(plan.to_json(), sys.stdout)
        print()
    return 0

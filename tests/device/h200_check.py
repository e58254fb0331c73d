"""Read-only check of our H200 MIG table against a real H200 through real pynvml.

Run on a machine with an H200:  PYTHONPATH=. python tests/device/h200_check.py [--gpu N] [--model M]
It prints, per profile, NVML's GpuInstanceProfileInfo and possible placements next to our table and
exits 1 on any difference (2 when NVML or the GPU is unavailable, 3 when MIG mode is disabled so the
driver answers NOT_SUPPORTED).  It NEVER changes MIG mode and never creates or destroys instances:
the only NVML calls are nvmlInit/Shutdown, device lookups, GetName, GetMigMode, GetGpuInstanceProfileInfo
and GetGpuInstancePossiblePlacements.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from agent.gpu.profiles import H200_141GB, GPUModel, Placement, resolve_model


@dataclass(frozen=True)
class Row:
    profile: str
    field: str
    ours: object
    nvml: object

    @property
    def same(self) -> bool:
        return self.ours == self.nvml


def compare_profiles(nvml: Any, handle: Any, model: GPUModel) -> tuple[list[Row], list[str]]:
    """Rows (ours vs NVML) for every profile of `model`, and notes for what could not be read."""
    rows: list[Row] = []
    notes: list[str] = []
    for p in model.profiles:
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, p.nvml_id)
        except nvml.NVMLError_NotSupported:
            notes.append(f"{p.name}: NVML says NOT_SUPPORTED for profile {p.nvml_id} "
                         "(MIG mode disabled, or the board lacks this profile)")
            rows.append(Row(p.name, "supported", True, False))
            continue
        rows += [
            Row(p.name, "gi_profile_id", p.gi_profile_id, int(info.id)),
            Row(p.name, "compute_slices", p.compute_slices, int(info.sliceCount)),
            Row(p.name, "max_count", p.max_count, int(info.instanceCount)),
            Row(p.name, "memory_mib", p.memory_mib, int(info.memorySizeMB)),
            Row(p.name, "multiprocessors", p.multiprocessors, int(info.multiprocessorCount)),
        ]
        name = info.name.decode() if isinstance(getattr(info, "name", b""), bytes) else str(info.name)
        if name:
            rows.append(Row(p.name, "name", f"MIG {p.name}", name))
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
        array = (nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, array, ctypes.byref(count))
        got = tuple(sorted(Placement(int(array[i].start), int(array[i].size)) for i in range(count.value)))
        rows.append(Row(p.name, "placements", tuple(sorted(p.placements)), got))
    return rows, notes


def _fmt(value: object) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], Placement):
        return " ".join(f"{pl.start}:{pl.size}" for pl in value)
    return str(value)


def run(nvml: Any, gpu: int, model_name: str, out: Any = sys.stdout) -> int:
    """The check itself, on an already-imported NVML module; returns the exit code."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        print(f"NVML unavailable: {exc}", file=out)
        return 2
    try:
        if gpu >= nvml.nvmlDeviceGetCount():
            print(f"no GPU {gpu}", file=out)
            return 2
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        model = resolve_model(model_name) if model_name else resolve_model(name)
        if model is None:
            print(f"GPU {gpu} is {name!r}: no table of ours matches it", file=out)
            return 2
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        print(f"GPU {gpu}: {name}; table {model.name} (checked_on_hardware={model.checked_on_hardware}); "
              f"MIG mode current={current} pending={pending}", file=out)
        rows, notes = compare_profiles(nvml, handle, model)
        for r in rows:
            mark = "ok  " if r.same else "DIFF"
            line = f"{mark} {r.profile:<12} {r.field:<16} ours={_fmt(r.ours):<24} nvml={_fmt(r.nvml)}"
            print(line, file=out)
        for n in notes:
            print(f"note: {n}", file=out)
        if not current and notes:
            print("MIG mode is disabled: the driver does not answer profile queries; enable MIG mode "
                  "(this script will not) and run again", file=out)
            return 3
        diffs = sum(1 for r in rows if not r.same)
        print(f"{diffs} differences", file=out)
        return 1 if diffs else 0
    finally:
        nvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--model", default="", help=f"our table to compare (default: from the name; "
                    f"e.g. {H200_141GB.name})")
    args = ap.parse_args(argv)
    import pynvml

    return run(pynvml, args.gpu, args.model)


if __name__ == "__main__":
    sys.exit(main())

"""`render_frame(data, clock)`: one frame of `topolet status --watch`, the node at a glance as text.

Per NUMA node its CPUs exclusive, shared and reserved, a strip with one character per CPU (the
letter of the allocation holding it, `.` shared, `#` reserved) and who holds them.  Pure: the
`status_data` result (the `--format json` shape) and a clock reading in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.render.holders import owner_name
from agent.topology.cpuset import CPUSet

SHARED = "."
RESERVED = "#"
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
STRIP_CPUS = 64  # CPUs per strip line, in groups of 8


def letter(index: int) -> str:
    """The strip character of the allocation at `index` (`*` past the 62 letters and digits)."""
    return _LETTERS[index] if index < len(_LETTERS) else "*"


def _strip(cpus: list[int], mark: dict[int, str]) -> list[str]:
    lines = []
    for start in range(0, len(cpus), STRIP_CPUS):
        part = cpus[start:start + STRIP_CPUS]
        chars = "".join(mark.get(c, SHARED) for c in part)
        groups = " ".join(chars[i:i + 8] for i in range(0, len(chars), 8))
        lines.append(f"  {part[0]:>5}  {groups}")
    return lines


def render_frame(data: Mapping[str, Any], clock: str, interval: float) -> str:
    """The frame for one `status_data` result, headed by `clock` and the redraw interval."""
    allocs = list(data["allocations"])
    reserved = CPUSet.parse(data["reserved"])
    held = [CPUSet.parse(a["cpus"]) for a in allocs]
    mark = {cpu: RESERVED for cpu in reserved}
    for i, cpus in enumerate(held):
        mark.update((cpu, letter(i)) for cpu in cpus)
    out = [f"topolet status  {clock}  generation {data['generation']}  "
           f"(every {interval:g}s; Ctrl-C stops)",
           f"one character per CPU: a letter names its allocation, {SHARED} shared, {RESERVED} reserved", ""]
    for row in data["numa"]:
        cpus = CPUSet.parse(row["cpus"])
        exclusive = CPUSet.parse(row["exclusive"])
        mine = [(letter(i), len(c & cpus)) for i, c in enumerate(held) if c & cpus]
        who = f" ({', '.join(f'{ch} {n}' for ch, n in mine)})" if mine else ""
        out.append(f"NUMA {row['numa']}: {len(cpus)} CPUs: {len(exclusive)} exclusive{who}, "
                   f"{row['free_count']} shared, {len(CPUSet.parse(row['reserved']))} reserved")
        out.extend(_strip(cpus.sorted(), mark))
    out.append("")
    if data.get("state_found") is False:  # a frame without the key (an older shape) reads as found
        out.append(f"no state file at {data.get('state_file')} yet")
    out.append(f"{len(allocs)} allocation(s)")
    for i, (a, cpus) in enumerate(zip(allocs, held, strict=True)):
        out.append(f"  {letter(i)}  {owner_name(a)}  CPUs {cpus.cpulist()}"
                   f"{'  mems ' + a['mems'] if a['mems'] else ''}"
                   f"{'  GPUs ' + ','.join(a['gpus']) if a['gpus'] else ''}")
    return "\n".join(out) + "\n"

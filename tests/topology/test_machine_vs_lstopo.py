"""On this machine, `topolet discover` agrees with `lstopo-no-graphics` (Debian's hwloc-nox) about the
same machine: online CPUs, packages, cores, L3 groups and NUMA nodes with their CPUs."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET

from agent.topology.cpuset import CPUSet
from tests.conftest import require, topolet_bin


def _hwloc_set(text: str) -> CPUSet:
    # hwloc writes bitmaps as 0x-prefixed 32-bit words, high first: the kernel mask with 0x added
    return CPUSet.parse_mask(text.replace("0x", ""))


def _lstopo_view() -> dict[str, set[CPUSet]]:
    xml = subprocess.run(["lstopo-no-graphics", "--of", "xml", "-"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    view: dict[str, set[CPUSet]] = {"PU": set(), "Package": set(), "Core": set(), "L3Cache": set(),
                                    "NUMANode": set()}
    for obj in ET.fromstring(xml).iter("object"):
        kind = obj.get("type", "")
        if kind in view:
            view[kind].add(_hwloc_set(obj.get("cpuset", "0x0")))
    return view


def test_discover_agrees_with_lstopo_on_this_machine():
    require(shutil.which("lstopo-no-graphics") is not None, "lstopo-no-graphics (hwloc-nox) not installed")
    want = _lstopo_view()
    got = json.loads(subprocess.run([topolet_bin(), "discover", "--format", "conformance"],
                                    capture_output=True, text=True, check=True, timeout=60).stdout)
    pus = CPUSet().union(*want["PU"])
    assert CPUSet(got["cpus"]) == pus
    assert {CPUSet.parse(p["cpus"]) for p in got["packages"]} == want["Package"]
    assert {CPUSet.parse(c["cpus"]) for c in got["cores"]} == want["Core"]
    l3 = {CPUSet.parse(c["cpus"]) for c in got["caches"] if c["level"] == 3}
    assert l3 == want["L3Cache"]
    numa = {CPUSet.parse(n["cpus"]) for n in got["numa_nodes"] if n["cpus"]}
    assert numa == {s for s in want["NUMANode"] if s}

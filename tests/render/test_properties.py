"""Whatever CPU sets a topology holds, nested or crossing, its picture nests and nothing overlaps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.render.layout import layout
from agent.render.svg import render_svg
from agent.topology.cpuset import CPUSet
from agent.topology.model import Cache, Core, CPUInfo, NumaNode, Package, PCIDevice, Topology
from tests.conftest import examples
from tests.render.test_pictures import read_svg

_cpus = st.builds(CPUSet, st.lists(st.integers(0, 23), max_size=12))
_ids = st.lists(st.integers(0, 300), max_size=5, unique=True)
_cache_type = st.sampled_from(["Data", "Instruction", "Unified"])
_info = CPUInfo("vendor", 6, 85, "", frozenset(), False, "x86")


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    online = draw(_cpus)
    numa = tuple(NumaNode(i, draw(_cpus), draw(st.integers(0, 2**40)), 0, (), (), draw(st.booleans()),
                          draw(_cpus), draw(st.sampled_from(["", "GPU", "CXL", "HBM"])))
                 for i in sorted(draw(_ids)))
    classes = st.sampled_from([0x030000, 0x020000, 0x060400, 0x0C0600])  # GPU, NIC, bridge, InfiniBand
    devices = tuple(PCIDevice(f"0000:{i:02x}:00.0", draw(classes),
                              draw(st.integers(-1, 0xFFFF)), draw(st.integers(-1, 0xFFFF)),
                              draw(st.sampled_from([-1, *(n.id for n in numa)])), draw(_cpus))
                    for i in range(draw(st.integers(0, 4))))
    return Topology(
        cpus=online, offline=draw(_cpus) - online,
        packages=tuple(Package(i, draw(_cpus)) for i in sorted(draw(_ids))),
        cores=tuple(Core(0, i, c) for i, c in enumerate(draw(st.lists(_cpus, max_size=12)))),
        caches=tuple(Cache(draw(st.integers(1, 4)), draw(_cache_type), draw(st.integers(0, 2**26)), 64,
                           draw(_cpus)) for _ in range(draw(st.integers(0, 6)))),
        numa_nodes=numa, kinds=(), pci_devices=devices, cpu_info=_info)


@settings(max_examples=examples(300), deadline=None)
@given(topologies())
def test_any_topology_draws_nested_boxes_that_never_overlap(topo: Topology) -> None:
    text = render_svg(layout(topo))
    assert text == render_svg(layout(topo))
    boxes = read_svg(text)
    assert sorted(b.cpus.min() for b in boxes.values() if b.kind == "pu") == topo.cpus.sorted()
    numa = {key for key, b in boxes.items() if b.kind in ("numa", "memory")}
    assert numa == {f"numa-{n.id}" for n in topo.numa_nodes}
    children: dict[str, list[str]] = {}
    for key, box in boxes.items():
        if box.ancestors:
            parent = boxes[box.ancestors[-1]]
            assert box.inside(parent), (key, parent.key)
            assert box.cpus <= parent.cpus, (key, parent.key)
            children.setdefault(parent.key, []).append(key)
    for keys in children.values():
        for i, a in enumerate(keys):
            assert not any(boxes[a].overlaps(boxes[b]) for b in keys[i + 1:]), a

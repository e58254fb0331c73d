"""`agent.render`: every hwloc dump drawn as SVG and PNG, boxes nested as the topology nests."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from agent.render.layout import HOLDER_FILLS, RESERVED_FILL, Holder, Usage, layout
from agent.render.png import render_png
from agent.render.svg import render_svg
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology
from agent.topology.record import replace
from tests.conftest import HWLOC_DATA

DUMPS = sorted(p.name[: -len(".tar.bz2")] for p in (HWLOC_DATA / "dumps").glob("*.tar.bz2"))
# Most tests here draw every real machine (`topologies`): slow, out of `make unit` (CONTRIBUTING.md).
pytestmark = pytest.mark.slow
SVG = "{http://www.w3.org/2000/svg}"
# PCI classes a picture shows (class >> 16: network, display, accelerator; class >> 8: InfiniBand,
# NVMe, co-processor), as the PCI specification numbers them.
SHOWN_CLASSES = {0x02, 0x03, 0x12}
SHOWN_SUBCLASSES = {0x0C06, 0x0108, 0x0B40}


class Drawn:
    """One drawn box read back from the SVG: its rectangle, CPUs, text and enclosing boxes."""

    def __init__(self, g: ET.Element, ancestors: list[str]) -> None:
        rect = g.find(f"{SVG}rect")
        assert rect is not None
        self.key = g.get("id", "")
        self.kind = g.get("class", "")
        self.cpus = CPUSet.parse(g.get("data-cpus", ""))
        self.x, self.y = int(rect.get("x", "")), int(rect.get("y", ""))
        self.w, self.h = int(rect.get("width", "")), int(rect.get("height", ""))
        self.fill = rect.get("fill", "")
        self.text = [t.text or "" for t in g.findall(f"{SVG}text")]
        self.ancestors = ancestors

    def inside(self, other: Drawn) -> bool:
        return (other.x <= self.x and self.x + self.w <= other.x + other.w
                and other.y <= self.y and self.y + self.h <= other.y + other.h)

    def overlaps(self, other: Drawn) -> bool:
        return (self.x < other.x + other.w and other.x < self.x + self.w
                and self.y < other.y + other.h and other.y < self.y + self.h)


def read_svg(text: str) -> dict[str, Drawn]:
    """Every box of an SVG picture by key (the parse fails on anything that is not well-formed XML)."""
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg"
    boxes: dict[str, Drawn] = {}

    def walk(el: ET.Element, ancestors: list[str]) -> None:
        for g in el.findall(f"{SVG}g"):
            box = Drawn(g, ancestors)
            assert box.key not in boxes, box.key
            boxes[box.key] = box
            walk(g, [*ancestors, box.key])

    walk(root, [])
    return boxes


@pytest.fixture(scope="module")
def topologies(dump_root) -> dict[str, Topology]:  # type: ignore[no-untyped-def]
    return {name: discover(str(dump_root(name))) for name in DUMPS}


def _shown(topo: Topology) -> int:
    return sum(1 for d in topo.pci_devices
               if d.class_code >> 16 in SHOWN_CLASSES or d.class_code >> 8 in SHOWN_SUBCLASSES)


def _enclosing(boxes: dict[str, Drawn], inner: Drawn, outer_key: str) -> None:
    outer = boxes[outer_key]
    assert outer_key in inner.ancestors, (inner.key, outer_key)
    assert inner.inside(outer), (inner.key, outer_key)


@pytest.mark.parametrize("name", DUMPS)
def test_every_dump_draws_each_cpu_and_numa_node_once_nested_as_the_topology(
        name: str, topologies: dict[str, Topology]) -> None:
    topo = topologies[name]
    picture = layout(topo)
    boxes = read_svg(render_svg(picture))
    pus = [b for b in boxes.values() if b.kind == "pu"]
    assert sorted(b.cpus.min() for b in pus) == topo.cpus.sorted()
    assert all(b.text == [f"PU P#{b.cpus.min()}"] for b in pus)
    numa = {b.key for b in boxes.values() if b.kind in ("numa", "memory")}
    assert numa == {f"numa-{n.id}" for n in topo.numa_nodes}
    assert sum(b.kind == "device" for b in boxes.values()) == _shown(topo)

    for pu in pus:
        cpu = pu.cpus.min()
        core = f"core-{topo.core_index_of(cpu)}"
        _enclosing(boxes, pu, core)
        _enclosing(boxes, boxes[core], "machine")
        for p in topo.packages:
            if cpu in p.cpus:
                _enclosing(boxes, boxes[core], f"package-{p.id}")
        for n in topo.numa_nodes:
            if cpu in n.cpus and boxes[f"numa-{n.id}"].kind == "numa":
                _enclosing(boxes, pu, f"numa-{n.id}")
        for box in boxes.values():  # every cache drawn over this PU's CPUs holds its core
            if box.kind == "cache" and cpu in box.cpus:
                _enclosing(boxes, boxes[core], box.key)
    for n in topo.numa_nodes:  # a memory-only node sits in a box holding the CPUs it is near
        box = boxes[f"numa-{n.id}"]
        if n.memory_only:
            assert box.kind == "memory"
            parent = boxes[box.ancestors[-1]]
            assert n.local_cpus & topo.cpus <= parent.cpus
            assert box.inside(parent)
    by_parent: dict[str, list[Drawn]] = {}
    for box in boxes.values():
        by_parent.setdefault(box.ancestors[-1] if box.ancestors else "", []).append(box)
    for siblings in by_parent.values():
        for i, a in enumerate(siblings):
            assert not any(a.overlaps(b) for b in siblings[i + 1:]), a.key


@pytest.mark.parametrize("name", DUMPS)
def test_every_dump_draws_as_png_of_the_layouts_size(name: str, topologies: dict[str, Topology]) -> None:
    picture = layout(topologies[name])
    data = render_png(picture)
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG"
        assert image.size == (picture.width, picture.height)
        # The machine's outline is drawn in black at its top-left corner.
        machine = picture.boxes[0]
        assert image.convert("RGB").getpixel((machine.x, machine.y)) == (0, 0, 0)


def test_the_same_topology_gives_the_same_bytes(dump_root) -> None:  # type: ignore[no-untyped-def]
    root = str(dump_root("nvidiagpunumanodes"))
    first, again = discover(root), discover(root)
    assert render_svg(layout(first)) == render_svg(layout(again))
    assert render_png(layout(first)) == render_png(layout(again))


def test_gpus_and_their_memory_sit_beside_the_cpus_they_are_near(
        topologies: dict[str, Topology]) -> None:
    topo = topologies["nvidiagpunumanodes"]
    boxes = read_svg(render_svg(layout(topo)))
    for n in topo.numa_nodes:
        if n.tier == "GPU":
            (host,) = [m for m in topo.numa_nodes if not m.memory_only and n.local_cpus <= m.cpus]
            _enclosing(boxes, boxes[f"numa-{n.id}"], f"numa-{host.id}")
            assert any(n.gpu_pci in line for line in boxes[f"numa-{n.id}"].text)
    gpus = [b for b in boxes.values() if b.kind == "device"]
    assert len(gpus) == 6
    for dev in topo.pci_devices:
        (box,) = [b for b in gpus if b.text[0] == f"GPU {dev.address}"]
        (host,) = [m for m in topo.numa_nodes if not m.memory_only and dev.local_cpus <= m.cpus]
        _enclosing(boxes, box, f"numa-{host.id}")


def test_devices_with_a_numa_node_sit_in_that_nodes_box(topologies: dict[str, Topology]) -> None:
    checked = 0
    for name in ("32em64t-2n8c+dax+nvme+mic+dimms", "32intel64-2p8co2t+8ve", "40intel64-2g2n4c+pcilocality"):
        topo = topologies[name]
        boxes = read_svg(render_svg(layout(topo)))
        devices = {b.text[0].split()[-1]: b for b in boxes.values() if b.kind == "device"}
        for dev in topo.pci_devices:
            if dev.address in devices and dev.numa_node >= 0:
                _enclosing(boxes, devices[dev.address], f"numa-{dev.numa_node}")
                checked += 1
    assert checked


def test_holders_pus_take_their_colour_and_the_legend_names_them(topologies: dict[str, Topology]) -> None:
    topo = topologies["16em64t-4s2c2t"]
    a, b, reserved = CPUSet.parse("0-3"), CPUSet.parse("8,9"), CPUSet.parse("15")
    usage = Usage((Holder("pod 1234/main", a), Holder("pid 42", b)), reserved)
    boxes = read_svg(render_svg(layout(topo, usage)))
    fill = {cpu: boxes[f"pu-{cpu}"].fill for cpu in topo.cpus}
    assert {fill[c] for c in a} == {HOLDER_FILLS[0]}
    assert {fill[c] for c in b} == {HOLDER_FILLS[1]}
    assert fill[15] == RESERVED_FILL
    free = topo.cpus - a - b - reserved
    assert len({fill[c] for c in free}) == 1 and fill[min(free)] not in (HOLDER_FILLS[0], HOLDER_FILLS[1])
    legend = [box.text[0] for box in boxes.values() if box.kind == "legend"]
    assert legend == ["pod 1234/main: CPUs 0-3 (4)", "pid 42: CPUs 8-9 (2)", "reserved: CPUs 15 (1)",
                      f"shared pool: CPUs {free.cpulist()} ({len(free)})"]
    machine = boxes["machine"]
    assert all(box.y >= machine.y + machine.h for box in boxes.values() if box.kind == "legend")


def test_text_from_the_machine_cannot_break_the_svg(topologies: dict[str, Topology]) -> None:
    topo = topologies["2arm-2c"]
    evil = replace(topo.cpu_info, model_name='<x> & "y"\x1b[2J\x00')
    text = render_svg(layout(replace(topo, cpu_info=evil)))
    boxes = read_svg(text)
    assert '<x> & "y"?[2J?' in boxes["machine"].text
    assert "\x1b" not in text and "\x00" not in text


def test_readme_picture_is_the_current_rendering(dump_root) -> None:  # type: ignore[no-untyped-def]
    docs = Path(__file__).resolve().parents[2] / "docs"
    pictures = sorted(docs.glob("topology-*.svg"))
    assert pictures
    for svg in pictures:
        name = svg.name[len("topology-"): -len(".svg")]
        # On a layout change, redraw it: topolet discover --fsroot <the dump's root> --format svg
        # --output docs/topology-<dump>.svg (tests/conftest.py: extract_dump unpacks the dump).
        assert svg.read_text() == render_svg(layout(discover(str(dump_root(name))))), svg

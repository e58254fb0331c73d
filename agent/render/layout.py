"""A node's picture as nested boxes with their places: what `svg.py` and `png.py` both draw.

`layout(topo, usage=None) -> Picture` is pure: the same topology (and usage) gives the same boxes.
Boxes nest as lstopo draws a machine: Machine, Package, NUMA node, caches (L3, L2, L1d, L1i), Core,
PU, in whatever order the CPU sets nest on the machine at hand (a NUMA node wider than a package
holds its packages; one inside a package sits in it).  A memory-only NUMA node is a box in the row
at the top of the smallest Machine/Package/NUMA box that holds its local CPUs; GPUs, NICs and other
devices people place work by sit in columns beside the CPUs of their NUMA node.  With a `Usage`,
each holder's PUs take its colour and a legend under the machine names the holders.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import NumaNode, PCIDevice, Topology

FONT_PX = 11
CHAR_PX = 7  # a monospace character at FONT_PX, rounded up: labels are sized by character count
LINE_PX = 14
PAD = 5
GAP = 6
PU_MIN_W = 52
ROW_MAX = 8  # threads of a core, or cores, share one row up to this many
ASPECT = 1.6  # the width:height a grid of sibling boxes aims at
RAGGED_COST = 0.3  # against a grid's aspect score, per share of its last row left empty

# Fill colours per kind (box, header band).
FILLS = {
    "machine": ("#ffffff", "#f2f2f2"),
    "package": ("#e4e4e4", "#d0d0d0"),
    "numa": ("#eef6e0", "#c6e29c"),
    "cache": ("#ffffff", "#e9e9f5"),
    "core": ("#c8c8c8", "#b4b4b4"),
    "pu": ("#ffffff", ""),
    "memory": ("#b7d98b", ""),
    "device": ("#dcd9f2", ""),
    "legend": ("#ffffff", ""),
}
RESERVED_FILL = "#8f8f8f"
# Holder colours, light enough for black text (ColorBrewer's Set3 and Pastel1 qualitative schemes).
HOLDER_FILLS = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#bc80bd", "#ccebc5", "#ffed6f", "#fbb4ae", "#b3cde3", "#decbe4", "#fed9a6", "#e5d8bd",
)

# PCI class codes (class << 16 | subclass << 8 | prog-if) drawn, by their top 16 or 8 bits.
_DEVICE_KINDS = {0x0C06: "InfiniBand", 0x0108: "NVMe", 0x0B40: "Co-processor"}
_DEVICE_CLASSES = {0x02: "NIC", 0x03: "GPU", 0x12: "Accelerator"}
# PCI vendor ids of common GPU/NIC makers (from the PCI ID registry) shown by name.
_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x15B3: "Mellanox", 0x14E4: "Broadcom",
            0x1077: "QLogic", 0x1924: "Solarflare", 0x1DA3: "Habana", 0x1E52: "Tenstorrent",
            0x19E5: "Huawei", 0x1D0F: "Amazon", 0x144D: "Samsung", 0x1C5C: "SK hynix", 0x1BCF: "NEC"}


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds CPUs exclusively, as the legend names them."""

    name: str
    cpus: CPUSet


@dataclass(frozen=True, slots=True)
class Usage:
    """The allocation state a picture colours: holders (in legend order) and reserved CPUs."""

    holders: tuple[Holder, ...] = ()
    reserved: CPUSet = EMPTY


@dataclass(frozen=True, slots=True)
class Box:
    """One drawn box: a rectangle, an optional header band, and lines of text from its top left."""

    key: str  # unique in the picture: "machine", "package-0", "numa-1", "core-7", "pu-3", ...
    kind: str  # machine | package | numa | cache | core | pu | memory | device | legend
    parent: str  # the key of the box this one sits in; "" at the top
    x: int
    y: int
    w: int
    h: int
    fill: str
    band: str  # header band colour; "" for none
    band_h: int
    lines: tuple[str, ...]
    cpus: CPUSet  # the online CPUs the box stands for (empty for memory-only nodes and devices)


@dataclass(frozen=True, slots=True)
class Picture:
    """Boxes in paint order (every box after the one it sits in) on a width x height canvas."""

    width: int
    height: int
    title: str
    boxes: tuple[Box, ...]


def line_top(box: Box, index: int) -> int:
    """The y of the top of text line `index` of `box` (both renderers place text by it)."""
    return box.y + 3 + index * LINE_PX


def size_text(n: int) -> str:
    """A byte count the way lstopo writes one: 16GiB, 1.5MiB, 48KiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def safe_text(text: str) -> str:
    """`text` with control and other unprintable characters as `?` (labels come from sysfs files)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


class _Node:
    """A box being laid out: its content, then its size, then (top-down) its place."""

    __slots__ = ("key", "kind", "rank", "cpus", "lines", "fill", "band", "children", "memory",
                 "devices", "w", "h", "band_h", "columns", "dev_columns", "cores")

    def __init__(self, key: str, kind: str, rank: int, cpus: CPUSet, lines: Sequence[str]) -> None:
        self.key = key
        self.kind = kind
        self.rank = rank
        self.cpus = cpus
        self.lines = tuple(safe_text(s) for s in lines)
        self.fill, self.band = FILLS[kind]
        self.children: list[_Node] = []
        self.memory: list[_Node] = []
        self.devices: list[_Node] = []
        self.w = self.h = self.band_h = self.columns = self.dev_columns = 0
        self.cores = 1 if kind == "core" else 0  # cores drawn in this box, once measured


def _text_w(lines: Iterable[str]) -> int:
    return max((len(s) for s in lines), default=0) * CHAR_PX


def _cache_label(level: int, kind: str, size: int) -> str:
    suffix = {"Data": "d", "Instruction": "i"}.get(kind, "") if level <= 2 else ""
    return f"L{level}{suffix}" + (f" ({size_text(size)})" if size else "")


def _device_lines(dev: PCIDevice) -> tuple[str, ...] | None:
    """A drawn device's label, or None for a device not drawn (bridges, USB, SATA, ...)."""
    kind = _DEVICE_KINDS.get(dev.class_code >> 8) or _DEVICE_CLASSES.get(dev.class_code >> 16)
    if kind is None:
        return None
    if dev.vendor < 0 and dev.device < 0:  # ids the dump does not give
        return (f"{kind} {dev.address}",)
    vendor = f"{dev.vendor:04x}" if dev.vendor >= 0 else "????"
    device = f"{dev.device:04x}" if dev.device >= 0 else "????"
    name = _VENDORS.get(dev.vendor, "")
    return f"{kind} {dev.address}", f"{name + ' ' if name else ''}{vendor}:{device}"


def _memory_lines(node: NumaNode, online: CPUSet) -> tuple[str, ...]:
    mem = f" ({size_text(node.memory_bytes)})" if node.memory_bytes else ""
    if node.memory_only:
        what = f"{node.tier} memory" if node.tier else "memory only"
        if node.gpu_pci:
            what += f" of {node.gpu_pci}"
        return f"NUMANode P#{node.id}{mem}", what
    cpus = node.cpus & online
    return f"NUMANode P#{node.id}{mem}", f"CPUs {cpus.cpulist() or '-'}"


def _cpu_tree(topo: Topology) -> tuple[_Node, list[NumaNode]]:
    """The Machine box with every CPU box nested by CPU-set containment; NUMA nodes that are no box."""
    online = topo.cpus
    total = sum(n.memory_bytes for n in topo.numa_nodes)
    head = [f"Machine ({size_text(total)} total)" if total else "Machine"]
    if topo.cpu_info.model_name:
        head.append(topo.cpu_info.model_name)
    if topo.offline:
        head.append(f"{len(topo.offline)} CPU(s) offline: {topo.offline.cpulist()}")
    root = _Node("machine", "machine", 0, online, head)

    items: list[_Node] = []
    for p in topo.packages:
        if p.cpus & online:
            items.append(_Node(f"package-{p.id}", "package", 1, p.cpus & online, [f"Package P#{p.id}"]))
    boxed_numa: dict[str, NumaNode] = {}
    loose: list[NumaNode] = []
    for n in topo.numa_nodes:
        if n.memory_only or not n.cpus & online:
            loose.append(n)
            continue
        mem = f" ({size_text(n.memory_bytes)})" if n.memory_bytes else ""
        items.append(_Node(f"numa-{n.id}", "numa", 2, n.cpus & online, [f"NUMANode P#{n.id}{mem}"]))
        boxed_numa[items[-1].key] = n
    seen: set[tuple[int, str, CPUSet]] = set()
    for i, c in enumerate(topo.caches):
        cpus = c.cpus & online
        if not cpus or (c.level, c.type, cpus) in seen:
            continue
        seen.add((c.level, c.type, cpus))
        # Outer levels first; at one level a data or unified cache holds the instruction one.
        rank = 100 - 2 * c.level + (c.type == "Instruction")
        items.append(_Node(f"cache-{i}", "cache", rank, cpus, [_cache_label(c.level, c.type, c.size_bytes)]))
    for i, core in enumerate(topo.cores):
        if core.cpus & online:
            items.append(_Node(f"core-{i}", "core", 200, core.cpus & online, [f"Core P#{core.core_id}"]))
    for cpu in online:
        items.append(_Node(f"pu-{cpu}", "pu", 300, CPUSet([cpu]), [f"PU P#{cpu}"]))

    items.sort(key=lambda n: (-len(n.cpus), n.rank, n.cpus.min(), n.key))
    for item in items:
        parent = root
        while True:
            inner = next((c for c in parent.children if item.cpus <= c.cpus), None)
            if inner is None:
                break
            parent = inner
        crossed = any(c.cpus & item.cpus for c in parent.children)
        if crossed:
            # The sets do not nest (a cache or NUMA node astride two boxes): a box would draw a lie.
            if item.kind == "numa":
                loose.append(boxed_numa[item.key])
            continue
        parent.children.append(item)
    return root, loose


def _holder_of(usage: Usage) -> dict[int, int]:
    return {cpu: i for i, h in enumerate(usage.holders) for cpu in h.cpus}


def _near(root: _Node, cpus: CPUSet) -> _Node:
    """The deepest Machine/Package/NUMA box holding `cpus` (the machine when `cpus` is empty)."""
    node = root
    while cpus:
        inner = next((c for c in node.children if c.kind in ("package", "numa") and cpus <= c.cpus), None)
        if inner is None:
            break
        node = inner
    return node


def _tracks(nodes: Sequence[_Node], columns: int) -> tuple[list[int], list[int]]:
    """Column widths and row heights of `nodes` laid in rows of `columns`."""
    col_w = [0] * columns
    row_h = [0] * math.ceil(len(nodes) / columns)
    for i, n in enumerate(nodes):
        col_w[i % columns] = max(col_w[i % columns], n.w)
        row_h[i // columns] = max(row_h[i // columns], n.h)
    return col_w, row_h


def _grid(nodes: Sequence[_Node], columns: int) -> tuple[int, int]:
    """Width and height of `nodes` in rows of `columns`, columns aligned."""
    col_w, row_h = _tracks(nodes, columns)
    return sum(col_w) + GAP * (columns - 1), sum(row_h) + GAP * (len(row_h) - 1)


def _columns(node: _Node) -> int:
    n = len(node.children)
    if node.kind == "core" or all(c.cores <= 1 for c in node.children):
        # A core's threads, and cores (under their caches), side by side as lstopo shows them,
        # in even rows of at most ROW_MAX.
        return n if n <= ROW_MAX else math.ceil(n / math.ceil(n / ROW_MAX))
    best, best_score = n, math.inf
    for c in range(n, 0, -1):
        w, h = _grid(node.children, c)
        empty = -n % c  # cells left over in the last row: 2 x 2 reads better than 3 + 1
        score = abs(math.log(w / h / ASPECT)) + RAGGED_COST * empty / c
        if score < best_score - 1e-9:
            best, best_score = c, score
    return best


def _stacked(node: _Node) -> bool:
    """Whether `node` holds just one box for the same CPUs: drawn as lstopo does, a bar over it."""
    return (len(node.children) == 1 and not node.memory and not node.devices
            and node.children[0].cpus == node.cpus)


def _measure(node: _Node) -> None:
    """Size `node` at its smallest (its boxes first); `_place` stretches it to its cell."""
    for child in (*node.children, *node.memory, *node.devices):
        _measure(child)
    node.cores += sum(c.cores for c in node.children)
    text_w = _text_w(node.lines) + 2 * PAD
    if not (node.children or node.memory or node.devices):
        node.w = max(text_w, PU_MIN_W if node.kind == "pu" else 0)
        node.h = len(node.lines) * LINE_PX + 6
        return
    node.band_h = len(node.lines) * LINE_PX + 4
    if _stacked(node):
        (child,) = node.children
        node.w, node.h = max(text_w, child.w), node.band_h + child.h
        return
    node.children.sort(key=lambda c: (c.cpus.min(), c.rank, c.key))
    node.columns = _columns(node) if node.children else 0
    grid_w, grid_h = _grid(node.children, node.columns) if node.children else (0, 0)
    inner_w = max(text_w - 2 * PAD, sum(m.w + GAP for m in node.memory) - GAP)
    dev_w = dev_h = 0
    if node.devices:
        # Devices in as many columns as keep them no taller than the CPUs beside them.
        cell_w, cell_h = max(d.w for d in node.devices), max(d.h for d in node.devices)
        for d in node.devices:
            d.w, d.h = cell_w, cell_h
        rows = max(1, (grid_h + GAP) // (cell_h + GAP))
        node.dev_columns = math.ceil(len(node.devices) / rows)
        dev_w, dev_h = _grid(node.devices, node.dev_columns)
        dev_w += GAP if node.children else 0
    node.w = max(inner_w, grid_w + dev_w) + 2 * PAD
    node.h = node.band_h + PAD + _memory_h(node) + max(grid_h, dev_h) + PAD


def _memory_h(node: _Node) -> int:
    return max(m.h for m in node.memory) + GAP if node.memory else 0


def _spread(sizes: list[int], extra: int) -> list[int]:
    """`sizes` grown by `extra` in all, shared out evenly (the first ones take the remainder)."""
    share, rest = divmod(max(extra, 0), len(sizes))
    return [s + share + (i < rest) for i, s in enumerate(sizes)]


def _place(node: _Node, parent: str, x: int, y: int, w: int, h: int,
           fills: dict[str, str], out: list[Box]) -> None:
    """Emit `node` stretched to w x h at (x, y), then its content (children share the stretch)."""
    out.append(Box(node.key, node.kind, parent, x, y, w, h, fills.get(node.key, node.fill), node.band,
                   node.band_h, node.lines, node.cpus))
    if _stacked(node):
        _place(node.children[0], node.key, x, y + node.band_h, w, h - node.band_h, fills, out)
        return
    top = y + node.band_h + PAD
    mx = x + PAD
    for m in node.memory:
        _place(m, node.key, mx, top, m.w, m.h, fills, out)
        mx += m.w + GAP
    top += _memory_h(node)
    grid_w = 0
    if node.children:
        cols, rows = _tracks(node.children, node.columns)
        # Columns share out extra width; extra height stays empty at the bottom, as in lstopo
        # (boxes stretched down to a taller sibling's height would read as something else).
        cols = _spread(cols, w - node.w)
        grid_w = sum(cols) + GAP * (len(cols) - 1)
        for i, child in enumerate(node.children):
            c, r = i % node.columns, i // node.columns
            cx = x + PAD + sum(cols[:c]) + GAP * c
            cy = top + sum(rows[:r]) + GAP * r
            _place(child, node.key, cx, cy, cols[c], rows[r], fills, out)
    dx = x + PAD + grid_w + (GAP if node.children else 0)
    for i, d in enumerate(node.devices):
        c, r = i % node.dev_columns, i // node.dev_columns
        _place(d, node.key, dx + c * (d.w + GAP), top + r * (d.h + GAP), d.w, d.h, fills, out)


def layout(topo: Topology, usage: Usage | None = None) -> Picture:
    """The picture of `topo`; with `usage`, each holder's PUs coloured and a legend naming holders."""
    root, loose = _cpu_tree(topo)
    for n in sorted(loose, key=lambda n: n.id):
        # A memory-only node by the CPUs it is near; a CPU-bearing node that crosses other boxes in
        # the box that holds all of its CPUs.
        near = n.local_cpus if n.memory_only else n.cpus
        memory = _Node(f"numa-{n.id}", "memory", 2, EMPTY, _memory_lines(n, topo.cpus))
        _near(root, near & topo.cpus).memory.append(memory)
    for i, dev in enumerate(topo.pci_devices):
        lines = _device_lines(dev)
        if lines is None:
            continue
        box = _Node(f"device-{i}", "device", 400, EMPTY, lines)
        # Beside the CPUs of its NUMA node; by a memory-only node, in the box that node sits in.
        key = f"numa-{dev.numa_node}" if dev.numa_node >= 0 else ""
        host = next((h for h in _walk(root) if h.key == key or any(m.key == key for m in h.memory)),
                    _near(root, dev.local_cpus & topo.cpus))
        host.devices.append(box)
    _measure(root)

    fills: dict[str, str] = {}
    if usage is not None:
        holder = _holder_of(usage)
        for cpu in topo.cpus:
            if cpu in holder:
                fills[f"pu-{cpu}"] = HOLDER_FILLS[holder[cpu] % len(HOLDER_FILLS)]
            elif cpu in usage.reserved:
                fills[f"pu-{cpu}"] = RESERVED_FILL
    boxes: list[Box] = []
    _place(root, "", PAD, PAD, root.w, root.h, fills, boxes)
    width, height = root.w + 2 * PAD, root.h + 2 * PAD
    if usage is not None:
        height = _legend(topo, usage, height, boxes)
        width = max(width, max(b.x + b.w for b in boxes) + PAD)
    title = "topolet: " + (topo.cpu_info.model_name or "machine") + f", {len(topo.cpus)} CPUs"
    return Picture(width, height, safe_text(title), tuple(boxes))


def _walk(root: _Node) -> list[_Node]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children))
    return out


def _legend(topo: Topology, usage: Usage, top: int, boxes: list[Box]) -> int:
    """Add the legend rows under the machine (from y = top); return the picture's new height."""
    rows: list[tuple[str, str, CPUSet]] = []
    for i, holder in enumerate(usage.holders):
        rows.append((HOLDER_FILLS[i % len(HOLDER_FILLS)], holder.name, holder.cpus & topo.cpus))
    if usage.reserved:
        rows.append((RESERVED_FILL, "reserved", usage.reserved & topo.cpus))
    held = EMPTY.union(*(h.cpus for h in usage.holders)) | usage.reserved
    rows.append((FILLS["pu"][0], "shared pool", topo.cpus - held))
    y = top
    for i, (fill, name, cpus) in enumerate(rows):
        line = safe_text(f"{name}: CPUs {cpus.cpulist() or '-'} ({len(cpus)})")
        h = LINE_PX + 6
        boxes.append(Box(f"legend-{i}", "legend", "", PAD, y, len(line) * CHAR_PX + 2 * PAD, h, fill, "", 0,
                         (line,), cpus))
        y += h + GAP // 2
    return y + PAD

"""`topolet discover`: the topology as a person reads it (table), as data (json/yaml), or as graded views.

`run_discover` prints those formats; `discover_and_warn` is the scan each format starts from, the
labels' (`agent.labels.command`) and the pictures' (`agent.render.command`) included.
"""

from __future__ import annotations

import sys
from _json import encode_basestring_ascii as _quote

from agent.topology.cpuset import CPUSet
from agent.topology.model import Core, Topology
from agent.topology.record import fields_of, is_record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time, and `discover` is timed as a whole process
    import argparse
    from typing import Any


def to_data(value: Any) -> Any:
    """The model as plain JSON-able data: CPUSets become cpulist strings, records dicts."""
    if isinstance(value, CPUSet):
        return value.cpulist()
    if is_record(value):
        return {f: to_data(getattr(value, f)) for f in fields_of(value)}
    if isinstance(value, (tuple, list)):
        return [to_data(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(to_data(v) for v in value)
    return value


_INFINITY = float("inf")


def to_json(value: Any) -> str:
    """`json.dumps(to_data(value), indent=1)`: the model, or plain data, as `--format json` prints it.

    `discover --format json` is timed as a whole process: importing `json` (with the `re` and `enum`
    it pulls in) costs it about as much as the scan, and `to_data` first would build the tree twice.
    The string escaping is json's own C code.
    """
    out: list[str] = []
    _write_json(value, "\n", out, {})
    return "".join(out)


def _json_scalar(value: Any) -> str | None:
    """The JSON text of a scalar, None for a container (json.encoder's rules, allow_nan included)."""
    if isinstance(value, str):
        return _quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value == _INFINITY or value == -_INFINITY:
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    return None


def _json_key(key: Any) -> str:
    """A dict key as JSON text: json.dumps turns scalar keys into strings, and refuses the rest."""
    if isinstance(key, str):
        return _quote(key)
    text = _json_scalar(key)
    if text is None:
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
    return _quote(text)


def _write_json(value: Any, newline: str, out: list[str], cpulists: dict[int, str]) -> None:
    """Append the JSON text of `value` to `out`; `newline` is the line break and indent it starts at.

    `cpulists` keeps each CPU mask's text: the model shares sets (a core's threads list one cache).
    """
    if isinstance(value, CPUSet):
        text = cpulists.get(value.mask)
        if text is None:
            text = cpulists[value.mask] = _quote(value.cpulist())
        out.append(text)
        return
    text = _json_scalar(value)
    if text is not None:
        out.append(text)
        return
    inner = newline + " "
    if is_record(value):
        value = {f: getattr(value, f) for f in fields_of(value)}
    if isinstance(value, dict):
        items = value.items()
        if not items:
            out.append("{}")
            return
        sep = "{" + inner
        for key, item in items:
            out.append(sep + _json_key(key) + ": ")
            _write_json(item, inner, out, cpulists)
            sep = "," + inner
        out.append(newline + "}")
        return
    if isinstance(value, frozenset):
        value = sorted(to_data(v) for v in value)
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    if not value:
        out.append("[]")
        return
    sep = "[" + inner
    for item in value:
        out.append(sep)
        _write_json(item, inner, out, cpulists)
        sep = "," + inner
    out.append(newline + "]")


def conformance_view(topo: Topology) -> dict[str, Any]:
    """The graded view: online CPUs, packages, cores, caches and NUMA nodes as cpulists."""
    numa: list[dict[str, Any]] = []
    for n in topo.numa_nodes:
        entry: dict[str, Any] = {"id": n.id, "cpus": n.cpus.cpulist(), "memory_bytes": n.memory_bytes}
        if n.memory_only:
            entry["local_cpus"] = n.local_cpus.cpulist()
        numa.append(entry)
    return {
        "cpus": topo.cpus.sorted(),
        "packages": [{"id": p.id, "cpus": p.cpus.cpulist()} for p in topo.packages],
        "cores": [{"cpus": c.cpus.cpulist()} for c in topo.cores],
        "caches": [{"level": c.level, "cpus": c.cpus.cpulist()} for c in topo.caches],
        "numa_nodes": numa,
    }


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def render_table(topo: Topology) -> str:
    """A compact lstopo-like tree: NUMA node → package → L3 → cores with their threads."""
    info = topo.cpu_info
    lines = [
        f"Machine: {len(topo.packages)} package(s), {len(topo.cores)} cores, {len(topo.cpus)} CPUs online"
        + (f", {len(topo.offline)} offline ({topo.offline})" if topo.offline else ""),
    ]
    if info.model_name or info.vendor:
        lines.append(f"  CPU: {info.model_name or info.vendor}"
                     + (" (hypervisor)" if info.hypervisor else ""))
    # Each group's label and cores, and each package's groups, are found once on int masks: a big
    # machine has dozens of packages and L3 groups, and testing every pair per NUMA node is slow.
    caches = {c.cpus: c for c in reversed(topo.caches) if c.level >= 2 and c.type != "Instruction"}
    groups: list[tuple[int, str, list[Core]]] = []  # (mask, label, cores touching it)
    for group in topo.l3_groups:
        cache = caches.get(group)
        label = f"L{cache.level} {_size(cache.size_bytes)}" if cache else "CPUs"
        groups.append((group.mask, label, [c for c in topo.cores if c.cpus.mask & group.mask]))
    groups_of = {p.id: [g for g in groups if g[0] & p.cpus.mask] for p in topo.packages}
    for node in topo.numa_nodes:
        mem = _size(node.memory_bytes) if node.memory_bytes else "?"
        if node.memory_only:
            lines.append(f"  NUMANode {node.id} {mem} memory-only{' ' + node.tier if node.tier else ''}"
                         f" (near CPUs {node.local_cpus or '-'})")
            continue
        lines.append(f"  NUMANode {node.id} {mem}  CPUs {node.cpus}")
        for pkg in topo.packages:
            shared = pkg.cpus.mask & node.cpus.mask
            if not shared:
                continue
            lines.append(f"    Package {pkg.id}  CPUs {CPUSet.from_mask(shared)}")
            for mask, label, touching in groups_of[pkg.id] if groups else [(shared, "CPUs", topo.cores)]:
                if not mask & shared:
                    continue
                cores = [c for c in touching if c.cpus.mask & mask & shared]
                body = " ".join(f"[{c.cpus}]" if len(c.cpus) > 1 else str(c.cpus) for c in cores)
                lines.append(f"      {label} ({len(cores)} cores): {body}")
    for kind in topo.kinds:
        lines.append(f"  CPU kind {kind.name}: {kind.cpus}")
    if len(topo.numa_nodes) > 1 and all(n.distances for n in topo.numa_nodes):
        lines.append("  NUMA distances:")
        lines.append("    " + " ".join(f"{i:>4}" for i in topo.numa_ids))
        for n in topo.numa_nodes:
            lines.append(f"{n.id:>3} " + " ".join(f"{d:>4}" for d in n.distances))
    for dev in topo.pci_devices:
        if dev.class_code >> 16 in (0x03, 0x12) or dev.class_code >> 8 == 0x0B40:
            lines.append(f"  PCI {dev.address} class {dev.class_code:06x} {dev.vendor:04x}:{dev.device:04x}"
                         f" numa {dev.numa_node}")
    return "\n".join(lines) + "\n"


def printable(text: str) -> str:
    """`text` with control characters escaped, so a dump's file names cannot drive the terminal."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def discover_and_warn(fsroot: str) -> Topology:
    """`discover(fsroot)`, the scan's warnings written to stderr as `topolet discover` words them."""
    from agent.topology.discover import discover

    topo = discover(fsroot)
    # stderr in every format: a table reader sees them, and json/yaml/labels on stdout stay parseable
    for warning in topo.warnings:
        sys.stderr.write(f"topolet discover: warning: {printable(warning)}\n")
    return topo


def run_discover(args: argparse.Namespace) -> int:
    """Entry point of `topolet discover` in the model's formats (table, json, yaml, conformance): the
    topology on stdout, the scan's warnings on stderr."""
    topo = discover_and_warn(args.fsroot)
    fmt = args.format
    if fmt == "conformance":
        import json

        out = json.dumps(conformance_view(topo)) + "\n"
    elif fmt == "json":
        out = to_json(topo) + "\n"
    elif fmt == "yaml":
        import yaml

        out = yaml.safe_dump(to_data(topo), sort_keys=False)
    else:
        out = render_table(topo)
    sys.stdout.write(out)
    return 0

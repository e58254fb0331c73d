"""Topologies from files: `topolet discover --format json` output, or a kubelet CPU-manager table.

The kubelet-table form (`{"cpus": [{"cpu", "core", "socket", "numa", "uncore"}, ...]}`, one such
object or a `{name: object}` map of them) is the shape of `tests/data/kubelet-cpumanager`: Kubernetes
kubelet's CPU manager test fixtures written out as data.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import IO, Any

from agent.errors import TopologyError
from agent.topology.cpuset import CPUSet
from agent.topology.model import (
    Cache,
    Core,
    CPUInfo,
    CPUKind,
    Hugepages,
    NumaNode,
    Package,
    PCIDevice,
    Topology,
)

_NO_CPU_INFO = CPUInfo(vendor="", family=0, model=0, model_name="", flags=frozenset(), hypervisor=False,
                       arch="")

# The discover JSON of a 1,024-thread machine is under 1 MiB, the whole kubelet table set 72 KiB; a
# file past this is not a topology, and decoding it would take many times its size in memory.
MAX_TOPOLOGY_BYTES = 16 << 20


def clip(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters: an error names a bad value without echoing all of it."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def excerpt(value: object, limit: int = 40) -> str:
    """`repr(value)`, clipped to `limit` characters."""
    return clip(repr(value), limit)


def open_input(path: str) -> IO[bytes]:
    """Open a file to read in binary mode; refuse devices (a tty aside) that would never end.

    Regular files, pipes (`<(topolet discover --format json)`) and sockets stream; `/dev/zero` or a
    disk would be read until memory or patience runs out.  Raises OSError.
    """
    f = open(path, "rb")  # noqa: SIM115 - handed to the caller, who closes it
    try:
        mode = os.fstat(f.fileno()).st_mode
        if (stat.S_ISCHR(mode) and not f.isatty()) or stat.S_ISBLK(mode) or stat.S_ISDIR(mode):
            raise OSError(0, "not a regular file, pipe or terminal")
    except BaseException:
        f.close()
        raise
    return f


def load_topology(path: str, name: str | None = None) -> Topology:
    """Read a topology file of either form; `name` picks one topology from a multi-topology table."""
    try:
        with open_input(path) as f:
            raw = f.read(MAX_TOPOLOGY_BYTES + 1)
    except OSError as exc:
        raise TopologyError(f"cannot read topology file ({exc.strerror})", path) from exc
    if len(raw) > MAX_TOPOLOGY_BYTES:
        raise TopologyError(f"topology file is larger than {MAX_TOPOLOGY_BYTES >> 20} MiB", path)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TopologyError(f"topology file is not UTF-8 (byte {exc.start})", path) from exc
    except ValueError as exc:
        raise TopologyError(f"topology file is not JSON ({exc})", path) from exc
    except RecursionError as exc:
        raise TopologyError("topology file nests too deeply to be a topology", path) from exc
    try:
        return topology_from_data(data, name)
    except TopologyError as exc:
        raise TopologyError(clip(str(exc)), path) from exc


def topology_from_data(data: Any, name: str | None = None) -> Topology:
    """Build a Topology from already-decoded JSON of either form."""
    if not isinstance(data, dict):
        raise TopologyError("topology must be a JSON object")
    if _is_kubelet_table(data):
        return topology_from_kubelet_table(data)
    if "cpus" in data and "cores" in data:
        return topology_from_json(data)
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and _is_kubelet_table(v)}
    if not tables:
        raise TopologyError("neither `discover --format json` output nor a kubelet CPU-manager table")
    if name is None:
        if len(tables) != 1:
            raise TopologyError(f"the file holds {len(tables)} topologies; pick one with --name "
                                f"({', '.join(sorted(tables))})")
        name = next(iter(tables))
    if name not in tables:
        raise TopologyError(f"no topology named {excerpt(name)} (have: {', '.join(sorted(tables))})")
    return topology_from_kubelet_table(tables[name])


def _is_kubelet_table(data: Mapping[str, Any]) -> bool:
    cpus = data.get("cpus")
    return isinstance(cpus, list) and bool(cpus) and all(isinstance(c, dict) for c in cpus)


def _int(entry: Mapping[str, Any], key: str, where: str) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TopologyError(f"{where}: {key!r} must be a non-negative integer, got {excerpt(value)}")
    return value


def topology_from_kubelet_table(table: Mapping[str, Any]) -> Topology:
    """A Topology from kubelet's CPUDetails shape: one record per CPU with core, socket, NUMA, uncore.

    Cores are (socket, core) pairs, as kubelet counts them.  L3 groups follow the uncore ids only when
    the fixture set them (`explicit_cpuinfo_fields.UncoreCacheID`); otherwise the fixture's uncore ids
    are Go's zero default, and each socket is taken as one L3 group.
    """
    rows: list[tuple[int, int, int, int, int]] = []
    for i, entry in enumerate(table["cpus"]):
        where = f"cpus[{i}]"
        rows.append((_int(entry, "cpu", where), _int(entry, "core", where), _int(entry, "socket", where),
                     _int(entry, "numa", where), _int(entry, "uncore", where) if "uncore" in entry else 0))
    ids = [r[0] for r in rows]
    if len(set(ids)) != len(ids):
        raise TopologyError("a CPU id appears twice in the table")
    fields = table.get("explicit_cpuinfo_fields")
    explicit_uncore = isinstance(fields, dict) and fields.get("UncoreCacheID") is True

    def group(key: Any) -> dict[Any, CPUSet]:
        out: dict[Any, list[int]] = {}
        for r in rows:
            out.setdefault(key(r), []).append(r[0])
        return {k: CPUSet(v) for k, v in out.items()}

    def by_min(cpus: CPUSet) -> int:
        return cpus.min()

    packages = tuple(Package(id=k, cpus=v) for k, v in sorted(group(lambda r: r[2]).items()))
    cores = tuple(sorted((Core(package_id=k[0], core_id=k[1], cpus=v)
                          for k, v in group(lambda r: (r[2], r[1])).items()), key=lambda c: by_min(c.cpus)))
    l3_sets = group(lambda r: r[4]) if explicit_uncore else group(lambda r: r[2])
    caches = tuple(Cache(level=3, type="Unified", size_bytes=0, line_bytes=0, cpus=v)
                   for v in sorted(l3_sets.values(), key=by_min))
    numa_nodes = tuple(
        NumaNode(id=k, cpus=v, memory_bytes=0, memory_free_bytes=0, hugepages=(), distances=(),
                 memory_only=False, local_cpus=v, tier="")
        for k, v in sorted(group(lambda r: r[3]).items()))
    return Topology(cpus=CPUSet(ids), offline=CPUSet(), packages=packages, cores=cores, caches=caches,
                    numa_nodes=numa_nodes, kinds=(), pci_devices=(), cpu_info=_NO_CPU_INFO)


def _cpus(entry: Mapping[str, Any], key: str, where: str, default: str | None = None) -> CPUSet:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise TopologyError(f"{where}: {key!r} must be a cpulist string, got {excerpt(value)}")
    try:
        return CPUSet.parse(value)
    except ValueError as exc:
        raise TopologyError(f"{where}: {key!r}: {exc}") from exc


def _list(data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TopologyError(f"{key!r} must be a list of objects")
    return value


def topology_from_json(data: Mapping[str, Any]) -> Topology:
    """A Topology from `topolet discover --format json` output (the model, CPU sets as cpulists)."""
    try:
        packages = tuple(Package(id=_int(p, "id", f"packages[{i}]"), cpus=_cpus(p, "cpus", f"packages[{i}]"))
                         for i, p in enumerate(_list(data, "packages")))
        cores = tuple(Core(package_id=int(c.get("package_id", 0)), core_id=int(c.get("core_id", 0)),
                           cpus=_cpus(c, "cpus", f"cores[{i}]"))
                      for i, c in enumerate(_list(data, "cores")))
        caches = tuple(Cache(level=_int(c, "level", f"caches[{i}]"), type=str(c.get("type", "Unified")),
                             size_bytes=int(c.get("size_bytes", 0)), line_bytes=int(c.get("line_bytes", 0)),
                             cpus=_cpus(c, "cpus", f"caches[{i}]"))
                       for i, c in enumerate(_list(data, "caches")))
        nodes = []
        for i, n in enumerate(_list(data, "numa_nodes")):
            where = f"numa_nodes[{i}]"
            cpus = _cpus(n, "cpus", where, "")
            nodes.append(NumaNode(
                id=_int(n, "id", where), cpus=cpus, memory_bytes=int(n.get("memory_bytes", 0)),
                memory_free_bytes=int(n.get("memory_free_bytes", 0)),
                hugepages=tuple(Hugepages(size_bytes=int(h["size_bytes"]), total=int(h["total"]),
                                          free=int(h["free"])) for h in n.get("hugepages", [])),
                distances=tuple(int(d) for d in n.get("distances", [])),
                memory_only=bool(n.get("memory_only", False)),
                local_cpus=_cpus(n, "local_cpus", where, cpus.cpulist()), tier=str(n.get("tier", ""))))
        kinds = tuple(CPUKind(name=str(k.get("name", "")), rank=int(k.get("rank", 0)),
                              cpus=_cpus(k, "cpus", f"kinds[{i}]"))
                      for i, k in enumerate(_list(data, "kinds")))
        pci = tuple(PCIDevice(address=str(d.get("address", "")), class_code=int(d.get("class_code", 0)),
                              vendor=int(d.get("vendor", 0)), device=int(d.get("device", 0)),
                              numa_node=int(d.get("numa_node", -1)),
                              local_cpus=_cpus(d, "local_cpus", f"pci_devices[{i}]", ""))
                    for i, d in enumerate(_list(data, "pci_devices")))
        info = data.get("cpu_info")
        cpu_info = _NO_CPU_INFO if not isinstance(info, dict) else CPUInfo(
            vendor=str(info.get("vendor", "")), family=int(info.get("family", 0)),
            model=int(info.get("model", 0)), model_name=str(info.get("model_name", "")),
            flags=frozenset(str(f) for f in info.get("flags", [])),
            hypervisor=bool(info.get("hypervisor", False)), arch=str(info.get("arch", "")))
        return Topology(cpus=_cpus(data, "cpus", "topology"), offline=_cpus(data, "offline", "topology", ""),
                        packages=packages, cores=cores, caches=caches, numa_nodes=tuple(nodes), kinds=kinds,
                        pci_devices=pci, cpu_info=cpu_info,
                        warnings=tuple(str(w) for w in data.get("warnings", [])))
    except (KeyError, TypeError, ValueError) as exc:
        raise TopologyError(f"malformed topology JSON ({exc!r})") from exc

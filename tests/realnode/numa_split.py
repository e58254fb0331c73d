"""This machine's CPUs as two NUMA nodes, for a real node whose devices sit on either: one picture for
the kubelet and the same one for the agent.

The test machine has one NUMA node, so a device plugin's NUMA 1 would be a node the kubelet does not
know (its Topology Manager hints only over the nodes cAdvisor reads from
`/sys/devices/system/node`).  `kubelet_node_dir` writes a `/sys/devices/system/node` of two nodes
(the first half of the CPUs on node 0, the rest on node 1, each `cpuN` a link to the real
`../../cpu/cpuN`, memory split in two, the host's hugepage sizes with empty pools) that the real
node's mount namespace binds over the real one, so only the kubelet (and containerd) see it.
`agent_root` writes a sysfs root of the same split for the agent's `--fsroot`: the agent runs on
the host and pins the same real CPUs, only grouped as the kubelet groups them.  Both are built from
the kernel's documented file formats (Documentation/ABI/stable/sysfs-devices-node,
sysfs-devices-system-cpu), with each CPU its own core in one package.
"""

from __future__ import annotations

from pathlib import Path

from agent.topology.cpuset import CPUSet

HUGEPAGES = Path("/sys/kernel/mm/hugepages")
MEM_KB = 4 * 1024 * 1024  # per node: what the kubelet and the agent are told, not what is there


def host_cpus() -> list[int]:
    """The online CPUs of this machine."""
    return CPUSet.parse(Path("/sys/devices/system/cpu/online").read_text().strip()).sorted()


def split(cpus: list[int]) -> tuple[list[int], list[int]]:
    """(node 0's CPUs, node 1's): the first half and the rest (at least one each)."""
    if len(cpus) < 2:
        raise ValueError("two NUMA nodes need two CPUs")
    half = len(cpus) // 2
    return cpus[:half], cpus[half:]


def _span(cpus: list[int]) -> str:
    return CPUSet(cpus).cpulist()


def _mask(cpus: list[int]) -> str:
    bits = CPUSet(cpus).mask
    words = [(bits >> (32 * i)) & 0xFFFFFFFF for i in range(max(1, (max(cpus) + 32) // 32))]
    return ",".join(f"{w:08x}" for w in reversed(words))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _node_files(folder: Path, node: int, cpus: list[int]) -> None:
    d = folder / f"node{node}"
    _write(d / "cpulist", _span(cpus) + "\n")
    _write(d / "cpumap", _mask(cpus) + "\n")
    _write(d / "meminfo", f"Node {node} MemTotal:       {MEM_KB} kB\nNode {node} MemFree:        "
                          f"{MEM_KB // 2} kB\nNode {node} MemUsed:        {MEM_KB // 2} kB\n")
    _write(d / "distance", ("10 20" if node == 0 else "20 10") + "\n")


def kubelet_node_dir(folder: Path, cpus: list[int]) -> Path:
    """A `/sys/devices/system/node` of two nodes over `cpus`, written in `folder` (returned)."""
    halves = split(cpus)
    _write(folder / "possible", "0-1\n")
    _write(folder / "online", "0-1\n")
    for node in (0, 1):
        _node_files(folder, node, halves[node])
        for cpu in halves[node]:
            (folder / f"node{node}" / f"cpu{cpu}").symlink_to(f"../../cpu/cpu{cpu}")
        sizes = sorted(p.name for p in HUGEPAGES.iterdir()) if HUGEPAGES.is_dir() else []
        for size in sizes:  # cAdvisor reads every node's pools
            pool = folder / f"node{node}" / "hugepages" / size
            for name in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                _write(pool / name, "0\n")
    return folder


def agent_root(root: Path, cpus: list[int]) -> Path:
    """A sysfs root (`--fsroot`) of `cpus` in two NUMA nodes, each CPU its own core of package 0."""
    every = _span(cpus) + "\n"
    base = root / "sys/devices/system/cpu"
    for name in ("possible", "present", "online"):
        _write(base / name, every)
    for cpu in cpus:
        t = base / f"cpu{cpu}" / "topology"
        _write(t / "physical_package_id", "0\n")
        _write(t / "core_id", f"{cpu}\n")
        _write(t / "thread_siblings_list", f"{cpu}\n")
        _write(t / "thread_siblings", _mask([cpu]) + "\n")
        _write(t / "core_siblings_list", every)
        _write(t / "core_siblings", _mask(cpus) + "\n")
        if cpu:
            _write(base / f"cpu{cpu}" / "online", "1\n")
    nodes = root / "sys/devices/system/node"
    _write(nodes / "possible", "0-1\n")
    _write(nodes / "online", "0-1\n")
    for node, mine in enumerate(split(cpus)):
        _node_files(nodes, node, mine)
    _write(root / "proc/meminfo", f"MemTotal:       {2 * MEM_KB} kB\nMemFree:        {MEM_KB} kB\n")
    return root

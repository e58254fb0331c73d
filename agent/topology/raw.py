"""What the C helper's one pass over a file-system root returns, as plain frozen records.

These records are facts as sysfs states them, inconsistencies included; `discover` turns them into
the model, resolving disagreements the way hwloc does.  Ids the tree does not give are -1; sets a
file does not give are None (absent), never an empty set standing in for "unknown".
"""

from __future__ import annotations

from agent.topology.cpuset import CPUSet
from agent.topology.record import record


@record
class RawCache:
    """One `cpuN/cache/indexM` folder."""

    level: int  # -1 when the `level` file is missing
    type: str  # "Data" | "Instruction" | "Unified" | "" when missing
    size_bytes: int  # -1 when missing
    line_bytes: int  # coherency_line_size, -1 when missing
    id: int  # the `id` file, -1 when missing
    cpus: CPUSet | None  # shared_cpu_list, else shared_cpu_map; None when neither


@record
class RawCPU:
    """One `/sys/devices/system/cpu/cpuN` folder (N is `id`)."""

    id: int
    online: bool  # `cpuN/online`, else membership of cpu/online, else True
    has_topology: bool  # whether `cpuN/topology/` exists
    package_id: int  # physical_package_id
    die_id: int
    cluster_id: int
    core_id: int
    book_id: int
    drawer_id: int
    thread_siblings: CPUSet | None  # thread_siblings_list / thread_siblings / core_cpus(_list)
    package_cpus: CPUSet | None  # package_cpus(_list) / core_siblings(_list)
    die_cpus: CPUSet | None
    cluster_cpus: CPUSet | None
    book_siblings: CPUSet | None
    drawer_siblings: CPUSet | None
    capacity: int  # cpu_capacity, -1 when missing
    max_freq_khz: int  # cpufreq/cpuinfo_max_freq, -1 when missing
    caches: tuple[RawCache, ...]


@record
class RawHugepages:
    size_bytes: int
    total: int
    free: int


@record
class RawNode:
    """One `/sys/devices/system/node/nodeN` folder."""

    id: int
    cpus: CPUSet | None  # cpulist, else cpumap; None when neither
    mem_total_bytes: int  # meminfo "Node N MemTotal", -1 when missing
    mem_free_bytes: int  # -1 when missing
    hugepages: tuple[RawHugepages, ...]
    distances: tuple[int, ...]  # the `distance` row as written; empty when missing
    initiators: tuple[int, ...]  # access0 (else access1) /initiators/nodeK ids (HMAT), ascending


@record
class RawPCI:
    """One PCI function under `/sys/bus/pci/devices` (virtual functions are skipped by the scan)."""

    address: str  # "0000:3b:00.0"
    class_code: int  # 24-bit class, e.g. 0x030200
    vendor: int
    device: int
    numa_node: int  # -1 when unknown
    local_cpus: CPUSet | None


@record
class RawError:
    """A file the scan could not use: `code` is an errno-style name, `path` is relative to the root."""

    code: str
    path: str


@record
class RawScan:
    root: str
    possible: CPUSet | None
    present: CPUSet | None
    online: CPUSet | None  # cpu/online; None when missing
    offline: CPUSet | None
    cpus: tuple[RawCPU, ...]  # ascending id
    has_node_dir: bool  # whether /sys/devices/system/node exists
    nodes: tuple[RawNode, ...]  # ascending id
    kinds: tuple[tuple[str, CPUSet], ...]  # hybrid PMUs: ("cpu_core", cpus), ("cpu_atom", cpus)
    cpu_flags: tuple[str, ...]  # lower-case, sorted, unique
    cpu_vendor: str  # "GenuineIntel", "AuthenticAMD", ... ("" when unknown)
    cpu_family: int  # -1 when unknown
    cpu_model: int  # -1 when unknown
    cpu_model_name: str
    hypervisor: bool
    arch: str  # from the cpuinfo shape (uname on "/"): "x86", "arm", "power", "s390", "ia64", ...
    mem_total_bytes: int  # /proc/meminfo MemTotal, -1 when missing
    pci: tuple[RawPCI, ...]
    errors: tuple[RawError, ...]
    # NUMA nodes that are NVIDIA GPU memory (/proc/driver/nvidia/gpus/<pci>/numa_status "Node: N"):
    # (node id, PCI address of the GPU that owns it)
    gpu_memory_nodes: tuple[tuple[int, str], ...] = ()

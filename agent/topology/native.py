"""The C helper's entry points as Python values: the sysfs scan, affinity and memory policy.

The cpulist/cpumask parsers live one layer down, in `bitmask`, so that `CPUSet` can use them;
`parse_cpulist` and `parse_cpumask` are re-exported here as the C helper's other entry points.
"""

from __future__ import annotations

import errno
import os
import struct

from agent.errors import EnforcementError, TopologyError
from agent.topology.bitmask import FIRST_WORDS as _FIRST_WORDS
from agent.topology.bitmask import WORD as _WORD
from agent.topology.bitmask import errname as _errname
from agent.topology.bitmask import ffi as _ffi
from agent.topology.bitmask import int_to_words as _int_to_words
from agent.topology.bitmask import lib as _lib
from agent.topology.bitmask import parse_cpulist as parse_cpulist
from agent.topology.bitmask import parse_cpumask as parse_cpumask
from agent.topology.bitmask import words_to_int as _words_to_int
from agent.topology.cpuset import CPUSet
from agent.topology.raw import (
    RawCache,
    RawCPU,
    RawError,
    RawHugepages,
    RawNode,
    RawPCI,
    RawScan,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time, and `discover` is timed as a whole process
    from typing import Any

_ABSENT = -1

# topo_cpu_t in native byte order: 9 int32, 3 uint32, 2 int64, then 6 topo_set_t (int32 off, uint32 n).
_CPU_RECORD = struct.Struct("=9i3I2q" + "iI" * 6)
if _CPU_RECORD.size != _ffi.sizeof("topo_cpu_t"):  # the header and this format must change together
    raise ImportError(f"topo_cpu_t is {_ffi.sizeof('topo_cpu_t')} bytes, expected {_CPU_RECORD.size}")

_MEMPOLICY = {
    "default": _lib.TOPO_MPOL_DEFAULT,
    "preferred": _lib.TOPO_MPOL_PREFERRED,
    "bind": _lib.TOPO_MPOL_BIND,
}


# topo_cache_t: index, level, line_bytes (int32), flags (uint32), id, size_bytes (int64),
# cpus (int32 off, uint32 n), type (char[16]).
_CACHE_RECORD = struct.Struct("=3iI2qiI16s")
if _CACHE_RECORD.size != _ffi.sizeof("topo_cache_t"):
    raise ImportError(f"topo_cache_t is {_ffi.sizeof('topo_cache_t')} bytes, expected {_CACHE_RECORD.size}")


class _Reader:
    """Turns one C scan result into records; sets that share pool words share one CPUSet."""

    def __init__(self, p: Any) -> None:
        self.p = p
        self.strings = bytes(_ffi.buffer(p.strings, p.nstrings))
        self.words = bytes(_ffi.buffer(p.words, p.nwords * _WORD)) if p.nwords else b""
        self.sets: dict[int, CPUSet] = {}
        self.empty = CPUSet()

    def string(self, off: int) -> str:
        end = self.strings.index(b"\0", off)
        return self.strings[off:end].decode("utf-8", "replace")

    def cpuset(self, s: Any) -> CPUSet | None:
        return self._set(s.off, s.n)

    def cpus(self) -> tuple[RawCPU, ...]:
        # One unpack of each whole array beats reading cffi fields record by record.
        p = self.p
        data = bytes(_ffi.buffer(p.cpus, p.ncpus * _CPU_RECORD.size)) if p.ncpus else b""
        size = _CACHE_RECORD.size
        cache_bytes = bytes(_ffi.buffer(p.caches, p.ncaches * size)) if p.ncaches else b""
        records = _CACHE_RECORD.iter_unpack(cache_bytes)
        cs = self._set
        # Threads of a core list the same caches; the C side copies those records byte for byte,
        # so equal records (or runs of them) mean equal values and one Python object serves all.
        memo: dict[tuple[Any, ...], RawCache] = {}
        types: dict[bytes, str] = {}
        runs: dict[bytes, tuple[RawCache, ...]] = {}
        caches: list[RawCache] = []
        for f in records:
            got = memo.get(f)
            if got is None:
                kind = types.get(f[8])
                if kind is None:
                    kind = types[f[8]] = f[8].split(b"\0", 1)[0].decode("ascii", "replace")
                got = memo[f] = RawCache(
                    level=f[1], type=kind, size_bytes=f[5], line_bytes=f[2], id=f[4], cpus=cs(f[6], f[7])
                )
            caches.append(got)

        def run(first: int, count: int) -> tuple[RawCache, ...]:
            key = cache_bytes[first * size : (first + count) * size]
            got = runs.get(key)
            if got is None:
                got = runs[key] = tuple(caches[first : first + count])
            return got

        return tuple(
            RawCPU(
                id=f[0], online=bool(f[1]), has_topology=bool(f[2]), package_id=f[3], die_id=f[4],
                cluster_id=f[5], core_id=f[6], book_id=f[7], drawer_id=f[8],
                thread_siblings=cs(f[14], f[15]), package_cpus=cs(f[16], f[17]),
                die_cpus=cs(f[18], f[19]), cluster_cpus=cs(f[20], f[21]),
                book_siblings=cs(f[22], f[23]), drawer_siblings=cs(f[24], f[25]),
                capacity=f[12], max_freq_khz=f[13], caches=run(f[9], f[10]),
            )
            for f in _CPU_RECORD.iter_unpack(data)
        )

    def _set(self, off: int, n: int) -> CPUSet | None:
        if off == _ABSENT:
            return None
        if n == 0:
            return self.empty
        got = self.sets.get(off)
        if got is None:
            got = CPUSet.from_mask(_words_to_int(self.words[off * _WORD : (off + n) * _WORD]))
            self.sets[off] = got
        return got

    def nodes(self) -> tuple[RawNode, ...]:
        p = self.p
        ints = p.ints
        out = []
        for n in p.nodes[0 : p.nnodes]:
            hps = tuple(
                RawHugepages(size_bytes=h.size_bytes, total=h.total, free=h.free)
                for h in p.hugepages[n.hp_off : n.hp_off + n.nhp]
            )
            out.append(
                RawNode(
                    id=n.id,
                    cpus=self.cpuset(n.cpus),
                    mem_total_bytes=n.mem_total_bytes,
                    mem_free_bytes=n.mem_free_bytes,
                    hugepages=hps,
                    distances=tuple(ints[n.dist_off : n.dist_off + n.ndist]),
                    initiators=tuple(ints[n.init_off : n.init_off + n.ninit]),
                )
            )
        return tuple(out)

    def pci(self) -> tuple[RawPCI, ...]:
        return tuple(
            RawPCI(
                address=self.string(d.addr),
                class_code=d.class_code,
                vendor=d.vendor,
                device=d.device,
                numa_node=d.numa_node,
                local_cpus=self.cpuset(d.local_cpus),
            )
            for d in self.p.pci[0 : self.p.npci]
        )

    def kinds(self) -> tuple[tuple[str, CPUSet], ...]:
        out = []
        for name, s in (("cpu_core", self.p.kind_core), ("cpu_atom", self.p.kind_atom)):
            cpus = self.cpuset(s)
            if cpus is not None:
                out.append((name, cpus))
        return tuple(out)

    def gpu_memory_nodes(self) -> tuple[tuple[int, str], ...]:
        return tuple((g.node, self.string(g.addr)) for g in self.p.gpu_nodes[0 : self.p.ngpu_nodes])

    def errors(self) -> tuple[RawError, ...]:
        return tuple(
            RawError(code=_errname(e.code), path=self.string(e.path))
            for e in self.p.errors[0 : self.p.nerrors]
        )


def scan(root: str = "/", parts: int = 0) -> RawScan:
    """Scan a file-system root (the host's "/" or an extracted sysfs dump) in one pass.

    `parts`: how many threads share the CPU folders; 0 lets the C side decide, 1 is one thread.
    """
    p = _lib.topo_scan_parts(os.fsencode(root), parts)
    if p == _ffi.NULL:
        raise TopologyError("out of memory scanning", root)
    try:
        return _convert(p, root)
    finally:
        _lib.topo_scan_free(p)


def _convert(p: Any, root: str) -> RawScan:
    """The records of one C scan result; raises TopologyError for a failed scan."""
    r = _Reader(p)
    if p.status:
        where = r.string(p.status_path) if p.status_path >= 0 else ""
        path = where if where == root else os.path.join(root, where)
        raise TopologyError(f"cannot scan ({_errname(p.status)}, {os.strerror(p.status)})", path)
    flags = r.string(p.cpu_flags).lower().split()
    return RawScan(
        root=root,
        possible=r.cpuset(p.possible),
        present=r.cpuset(p.present),
        online=r.cpuset(p.online),
        offline=r.cpuset(p.offline),
        cpus=r.cpus(),
        has_node_dir=bool(p.has_node_dir),
        nodes=r.nodes(),
        kinds=r.kinds(),
        cpu_flags=tuple(sorted(set(flags))),
        cpu_vendor=r.string(p.cpu_vendor),
        cpu_family=p.cpu_family,
        cpu_model=p.cpu_model,
        cpu_model_name=r.string(p.cpu_model_name),
        hypervisor=bool(p.hypervisor),
        arch=r.string(p.arch),
        mem_total_bytes=p.mem_total_bytes,
        pci=r.pci(),
        errors=r.errors(),
        gpu_memory_nodes=r.gpu_memory_nodes(),
    )


def set_affinity(pid: int, cpus: CPUSet) -> None:
    """Pin a process or thread (0 = the caller) to `cpus`; raises EnforcementError."""
    if not cpus:
        raise EnforcementError("cannot pin to an empty CPU set", f"pid {pid}")
    buf, nwords = _int_to_words(cpus.mask)
    rc = _lib.topo_set_affinity(pid, buf, nwords)
    if rc:
        raise EnforcementError(
            f"sched_setaffinity({cpus.cpulist()}) failed: {_errname(rc)} {os.strerror(rc)}", f"pid {pid}"
        )


def get_affinity(pid: int) -> CPUSet:
    """The CPUs a process or thread (0 = the caller) may run on; raises EnforcementError."""
    cap = _FIRST_WORDS
    nwords = _ffi.new("size_t *")
    while True:
        buf = _ffi.new("uint64_t[]", cap)
        rc = _lib.topo_get_affinity(pid, buf, cap, nwords)
        if rc != errno.ENOSPC:
            break
        cap = nwords[0]
    if rc:
        raise EnforcementError(f"sched_getaffinity failed: {_errname(rc)} {os.strerror(rc)}", f"pid {pid}")
    return CPUSet.from_mask(_words_to_int(_ffi.buffer(buf, nwords[0] * _WORD)[:]))


def bind_memory(nodes: CPUSet | None, mode: str) -> None:
    """Set the calling thread's NUMA memory policy: "bind", "preferred" (to `nodes`) or "default".

    `nodes` is a set of NUMA node ids (a CPUSet used as an id set); raises EnforcementError.
    """
    policy = _MEMPOLICY.get(mode)
    if policy is None:
        raise EnforcementError(f"unknown memory policy {mode!r}", "set_mempolicy")
    if policy == _lib.TOPO_MPOL_DEFAULT:
        buf, nwords = _ffi.NULL, 0
    else:
        if not nodes:
            raise EnforcementError(f"memory policy {mode!r} needs at least one NUMA node", "set_mempolicy")
        buf, nwords = _int_to_words(nodes.mask)
    rc = _lib.topo_set_mempolicy(policy, buf, nwords)
    if rc:
        where = nodes.cpulist() if nodes else ""
        raise EnforcementError(
            f"set_mempolicy({mode} {where}) failed: {_errname(rc)} {os.strerror(rc)}", "set_mempolicy"
        )

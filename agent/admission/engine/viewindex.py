"""The index of a cluster view that the placement engine searches, and the free figures it holds.

Public API: `NodeState` (one node's free figures, cloned before any change), `node_holds` /
`zone_holds` / `minus`, `Index` (states, zones and nodes sorted by free CPU, memos that stay true
because states only shrink), `index_of(view, nodes)` (cached per view object) and `carry` (moves an
index to the view `commit` made).  The cache is per process and not shared between threads.
Details: README.md beside this module.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from agent.admission.engine.model import Node, Resources, Zone

WHOLE_GPU = 1000
# Views whose index is kept (strong references, so an id is never reused while cached).
_CACHED_VIEWS = 4


# ---- per-node mutable figures ----------------------------------------------------------------------

class NodeState:
    """A node's free figures during one decision; never mutated once stored (clone, then change)."""

    __slots__ = ("zcpu", "zmem", "zgpus", "zhp", "zmig", "cpu", "mem", "gpus", "hp", "mig", "pods",
                 "gfree", "zdev", "dev", "zdevnames")

    zcpu: list[int]
    zmem: list[int]
    zgpus: list[int]
    zhp: list[Mapping[str, int]]
    zmig: list[Mapping[str, int]]
    cpu: int
    mem: int
    gpus: int
    hp: Mapping[str, int]
    mig: Mapping[str, int]
    pods: int
    gfree: list[int]
    zdev: list[Mapping[str, int]]  # device plugin resources per zone
    dev: Mapping[str, int]  # and at node level (the Node's allocatable less what pods ask)
    zdevnames: frozenset[str]  # the device names the node's zones list: placed per zone

    @classmethod
    def of(cls, node: Node) -> NodeState:
        s = cls()
        s.zcpu = [z.cpu_milli for z in node.zones]
        s.zmem = [z.memory for z in node.zones]
        s.zgpus = [z.gpus for z in node.zones]
        s.zhp = [z.hugepages for z in node.zones]
        s.zmig = [z.mig for z in node.zones]
        f = node.free
        s.cpu, s.mem, s.gpus, s.hp, s.mig = f.cpu_milli, f.memory, f.gpus, f.hugepages, f.mig
        s.pods = node.free_pods
        s.gfree = list(node.gpu_free_milli)
        s.zdev = [z.devices for z in node.zones]
        s.dev = f.devices
        s.zdevnames = frozenset(k for z in node.zones if z.devices for k in z.devices)
        return s

    def clone(self) -> NodeState:
        s = NodeState()
        s.zcpu, s.zmem, s.zgpus = list(self.zcpu), list(self.zmem), list(self.zgpus)
        s.zhp, s.zmig = list(self.zhp), list(self.zmig)
        s.cpu, s.mem, s.gpus, s.hp, s.mig = self.cpu, self.mem, self.gpus, self.hp, self.mig
        s.pods = self.pods
        s.gfree = list(self.gfree)
        s.zdev, s.dev, s.zdevnames = list(self.zdev), self.dev, self.zdevnames
        return s

    def whole_gpus(self) -> int:
        """Whole GPUs free: the node's count, bounded by the GPUs nobody shares when known."""
        if self.gfree:
            return min(self.gpus, sum(1 for f in self.gfree if f >= WHOLE_GPU))
        return self.gpus

    def to_node(self, node: Node) -> Node:
        """`node` with these free figures."""
        zones = tuple(
            Zone(z.numa, self.zcpu[i], z.cpu_capacity_milli, self.zmem[i], _frozen(self.zhp[i]),
                 self.zgpus[i], _frozen(self.zmig[i]), z.l3_cpus, _frozen(self.zdev[i]))
            for i, z in enumerate(node.zones))
        free = Resources(self.cpu, self.mem, _frozen(self.hp), self.gpus, node.free.gpu_milli,
                         _frozen(self.mig), _frozen(self.dev))
        return Node(node.name, node.labels, node.taints, node.unschedulable, free, node.capacity,
                    zones, tuple(self.gfree), node.gpu_model, self.pods, node.topology_policy,
                    node.topology_scope)


def _frozen(m: Mapping[str, int]) -> Mapping[str, int]:
    return m if not m or isinstance(m, MappingProxyType) else MappingProxyType(dict(m))


def _holds(have: Mapping[str, int], want: Mapping[str, int]) -> bool:
    return all(have.get(k, 0) >= v for k, v in want.items())


def minus(have: Mapping[str, int], want: Mapping[str, int]) -> Mapping[str, int]:
    """`have` less `want`, key by key (`have` itself when `want` is empty)."""
    if not want:
        return have
    out = dict(have)
    for k, v in want.items():
        out[k] = out.get(k, 0) - v
    return out


def node_holds(s: NodeState, r: Resources) -> bool:
    """Whether the node's totals hold one more pod asking `r`."""
    if s.pods < 1 or s.cpu < r.cpu_milli or s.mem < r.memory:
        return False
    if r.hugepages and not _holds(s.hp, r.hugepages):
        return False
    if r.mig and not _holds(s.mig, r.mig):
        return False
    if r.gpus and s.whole_gpus() < r.gpus:
        return False
    if r.gpu_milli and not any(f >= r.gpu_milli for f in s.gfree):
        return False
    return not r.devices or _holds(s.dev, r.devices)


def zone_holds(s: NodeState, i: int, r: Resources) -> bool:
    """Whether zone `i` holds the CPU, memory, whole GPUs, hugepages, MIG devices and zone-level
    devices of `r`."""
    if s.zcpu[i] < r.cpu_milli or s.zmem[i] < r.memory or s.zgpus[i] < r.gpus:
        return False
    if r.hugepages and not _holds(s.zhp[i], r.hugepages):
        return False
    if r.devices and not zone_devices_hold(s, s.zdev[i], r.devices):
        return False
    return not r.mig or _holds(s.zmig[i], r.mig)


def zone_devices_hold(s: NodeState, have: Mapping[str, int], want: Mapping[str, int]) -> bool:
    """Whether `have` (one zone's devices, or several zones' summed) holds the zone-level ones of `want`."""
    names = s.zdevnames
    return all(have.get(k, 0) >= v for k, v in want.items() if k in names)


# ---- the index of a view ---------------------------------------------------------------------------

class Index:
    """A view's nodes with their free figures, and its zones sorted by free CPU."""

    __slots__ = ("nodes", "states", "zkeys", "nkeys", "gpu_nodes", "kmin", "by_name", "dead",
                 "cpu_per_gpu", "policies")

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.states = [_state_of(n, _STATES_PER_NODE * len(nodes)) for n in nodes]
        self.zkeys = sorted((z.cpu_milli, i, p) for i, n in enumerate(nodes)
                            for p, z in enumerate(n.zones))
        self.nkeys = sorted((n.free.cpu_milli, i) for i, n in enumerate(nodes))
        self.gpu_nodes = [i for i, n in enumerate(nodes) if n.capacity.gpus or n.free.gpus
                          or n.gpu_free_milli]
        self.kmin: dict[tuple[int, int], int] = {}
        self.by_name = {n.name: i for i, n in enumerate(nodes)}
        # request signature -> nodes whose totals cannot hold it (only grows: states only shrink)
        self.dead: dict[tuple[Any, ...], set[int]] = {}
        # the nodes' CPU millicores per GPU thousandth when empty, once asked (capacities never change)
        self.cpu_per_gpu: float | None = None
        # every Topology Manager policy the nodes report (`update` keeps each node's)
        self.policies = frozenset(n.topology_policy for n in nodes)

    def update(self, i: int, node: Node) -> None:
        """Replace node `i` (its sorted keys move)."""
        old = self.states[i]
        for p, cpu in enumerate(old.zcpu):
            del self.zkeys[bisect.bisect_left(self.zkeys, (cpu, i, p))]
        del self.nkeys[bisect.bisect_left(self.nkeys, (old.cpu, i))]
        self.nodes[i] = node
        self.states[i] = NodeState.of(node)
        for p, z in enumerate(node.zones):
            bisect.insort(self.zkeys, (z.cpu_milli, i, p))
        bisect.insort(self.nkeys, (node.free.cpu_milli, i))


_cache: dict[int, tuple[object, Index]] = {}
# Node states by node identity: a caller that builds each view from the unchanged Node objects of the
# last one (the controller's passes) does not work them out again.  States are never mutated once
# stored, so indexes may share them.  Emptied when it outgrows a few views' worth.
_states: dict[int, tuple[Node, NodeState]] = {}
_STATES_PER_NODE = 4


def _state_of(node: Node, limit: int) -> NodeState:
    hit = _states.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    if len(_states) >= limit:
        _states.clear()
    state = _states[id(node)] = (node, NodeState.of(node))
    return state[1]


def index_of(key: object, nodes: Sequence[Node]) -> Index:
    """The index of view `key` over `nodes`, built once per view object."""
    hit = _cache.get(id(key))
    if hit is not None and hit[0] is key:
        return hit[1]
    ix = Index(nodes)
    _remember(key, ix)
    return ix


def _remember(key: object, ix: Index) -> None:
    _cache[id(key)] = (key, ix)
    while len(_cache) > _CACHED_VIEWS:
        del _cache[next(iter(_cache))]


def carry(old: object, new: object, ix: Index, changed: Mapping[int, Node]) -> None:
    """Move `ix`, the index of view `old`, to view `new`: `old` with the nodes `changed` replaced."""
    # the old view's entry is dropped, since its index now describes `new`
    _cache.pop(id(old), None)
    for i in sorted(changed):
        ix.update(i, changed[i])
    _remember(new, ix)

"""The placement engine: `place(view, gang) -> Placement | Refusal`, a pure function.

Public API:

- `place(view, gang) -> Placement | Refusal`: every pod of every pod set of `gang` on a node (and, by
  NUMA policy, a zone) of `view`, or a refusal naming the binding constraint.  No I/O, no clock, no
  randomness: the same view and gang give the same answer.
- `commit(view, gang, placement) -> ClusterView`: `view` with the placed pods' requests taken off
  their nodes and zones, exactly as `place` counted them (the next gang of one pass sees this).

Rules per pod: the node is schedulable, its NoSchedule/NoExecute taints are tolerated
(PreferNoSchedule only ranks it lower), its labels match the nodeSelector and the required node
affinity, it admits one more pod, and its node-level free resources hold the request.  Then by policy:

- `single-numa-node`: CPU, memory, hugepages, whole GPUs and MIG devices from one zone; the pod's
  `PodPlacement.zone` is that zone.  CPU is compared in millicores as the NRT reports whole CPUs.
- `restricted`: the zones the node would use must be as few as an empty node would need (the fewest
  zones whose `cpu_capacity_milli` hold the CPU request, kubelet's "preferred" hint).  The pod's
  zone is recorded only when that is one zone (then it pins exactly like single-numa-node); a
  multi-zone pod gets zone None, and the view takes its CPUs from the chosen zones tightest first
  (`commit` chooses those zones again on the state it counts: the same number of zones, possibly
  other ones than `place` counted, which only the NRT settles).
- `best-effort` / `none`: node totals only, zone None.  Nodes without zones take only these.
- GPUs: a shared-GPU pod (`gpu_milli`) takes one physical GPU of `Node.gpu_free_milli` (its
  `gpu_index`); whole GPUs come from the zone for single-numa-node, else from the node's whole free
  GPUs (the first entries at 1000, as `agent.admission.fragmentation.taken` counts them).

Scoring (lower is better), so the cluster is left less fragmented than plain best fit:
PreferNoSchedule taints first, then the GPU score (`fragmentation.gpu_choice` against
`view.gpu_mix`, else best fit), then whether the pod breaks a whole zone, then the CPU left in the
zone (best fit), then whether that remainder splits an L3 group (`Zone.l3_cpus`), then the node's free CPU
(the busier node first, so idle nodes stay idle), then node order.
`Placement.score` sums, per pod, the GPU score plus the share of the zone left over plus one per
whole zone broken.

Search: pod sets largest request first, greedy on the score; if that strands a pod, a bounded
depth-first search over each pod's few best candidates.  Candidates come from an index of zones
sorted by free CPU (bisected at the request), cached per view object and carried over by `commit`,
so a decision compares the 16 tightest zones that hold a pod (plus the nodes the gang already
uses) instead of every node: a few dozen checks however large the cluster.  A pod set with
`colocate_label` is placed within one value (domain) of that label: domains whose totals cannot hold
the gang are skipped, the rest are tried least free first (best fit at the domain level) until four
placed it or 64 were tried, and the best-scored placement wins.  The index cache is per process and
not shared between threads: call `place`/`commit` from one thread.

A refusal is "never" when the gang does not fit `view.empty` either (the same nodes, nothing
running), else "not-now"; with no `view.empty` it is always "not-now".
"""

from __future__ import annotations

import bisect
import importlib
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from agent.admission.model import (
    ClusterView,
    Gang,
    Node,
    NodeSelectorRequirement,
    Placement,
    PodPlacement,
    PodSet,
    Refusal,
    Resources,
    Taint,
    Toleration,
    Zone,
)

WHOLE_GPU = 1000
# How many feasible candidates a pod compares before choosing (the index yields them tightest first).
_WINDOW = 16
# Bounded backtracking: each pod tries this many of its best candidates, within this many steps.
_BRANCH = 3
_STEPS_PER_POD = 48
# Colocation: domains (label values) are tried least free first, until this many placed the gang
# (the best-scored of them wins) or this many combinations were tried.
_DOMAIN_PLACEMENTS = 4
_MAX_DOMAIN_COMBOS = 64
# Views whose index is kept (strong references, so an id is never reused while cached).
_CACHED_VIEWS = 4

# GPU scores are sums of float products: two nodes whose fragmentation rises equally can differ in the
# last bits, and that noise, not the CPU rules after it, would pick the node.  Scores tie to this many
# decimals (of a GPU thousandth).
_GPU_SCORE_DIGITS = 6

_NO_MAP: Mapping[str, int] = MappingProxyType({})


def _load_gpu_choice() -> Callable[..., tuple[float, int | None] | None] | None:
    # The fragmentation module is developed beside this one; without it GPUs fall back to best fit.
    try:
        module = importlib.import_module("agent.admission.fragmentation")
    except ImportError:
        return None
    choice = getattr(module, "gpu_choice", None)
    return choice if callable(choice) else None


_gpu_choice = _load_gpu_choice()


def _load_gpu_supply() -> Callable[[Sequence[Node]], dict[str, int]] | None:
    # The cluster's GPUs per model, for pod mixes whose types name GPU models.
    try:
        module = importlib.import_module("agent.admission.fragmentation")
    except ImportError:
        return None
    supply = getattr(module, "gpu_supply", None)
    return supply if callable(supply) else None


_gpu_supply = _load_gpu_supply()


def _load_cluster_cpu() -> Callable[[Sequence[Node]], float] | None:
    # The cluster's CPU per GPU thousandth, which tells the score a workload asks more CPU than it has.
    try:
        module = importlib.import_module("agent.admission.fragmentation")
    except ImportError:
        return None
    figure = getattr(module, "cluster_cpu_per_milli", None)
    return figure if callable(figure) else None


_cluster_cpu = _load_cluster_cpu()


# ---- per-node mutable figures ----------------------------------------------------------------------

class _State:
    """A node's free figures during one decision; never mutated once stored (clone, then change)."""

    __slots__ = ("zcpu", "zmem", "zgpus", "zhp", "zmig", "cpu", "mem", "gpus", "hp", "mig", "pods",
                 "gfree")

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

    @classmethod
    def of(cls, node: Node) -> _State:
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
        return s

    def clone(self) -> _State:
        s = _State()
        s.zcpu, s.zmem, s.zgpus = list(self.zcpu), list(self.zmem), list(self.zgpus)
        s.zhp, s.zmig = list(self.zhp), list(self.zmig)
        s.cpu, s.mem, s.gpus, s.hp, s.mig = self.cpu, self.mem, self.gpus, self.hp, self.mig
        s.pods = self.pods
        s.gfree = list(self.gfree)
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
                 self.zgpus[i], _frozen(self.zmig[i]), z.l3_cpus)
            for i, z in enumerate(node.zones))
        free = Resources(self.cpu, self.mem, _frozen(self.hp), self.gpus, node.free.gpu_milli,
                         _frozen(self.mig))
        return Node(node.name, node.labels, node.taints, node.unschedulable, free, node.capacity,
                    zones, tuple(self.gfree), node.gpu_model, self.pods)


def _frozen(m: Mapping[str, int]) -> Mapping[str, int]:
    return m if not m or isinstance(m, MappingProxyType) else MappingProxyType(dict(m))


def _holds(have: Mapping[str, int], want: Mapping[str, int]) -> bool:
    return all(have.get(k, 0) >= v for k, v in want.items())


def _minus(have: Mapping[str, int], want: Mapping[str, int]) -> Mapping[str, int]:
    if not want:
        return have
    out = dict(have)
    for k, v in want.items():
        out[k] = out.get(k, 0) - v
    return out


def _node_holds(s: _State, r: Resources) -> bool:
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
    return True


def _zone_holds(s: _State, i: int, r: Resources) -> bool:
    if s.zcpu[i] < r.cpu_milli or s.zmem[i] < r.memory or s.zgpus[i] < r.gpus:
        return False
    if r.hugepages and not _holds(s.zhp[i], r.hugepages):
        return False
    return not r.mig or _holds(s.zmig[i], r.mig)


# ---- node filters ----------------------------------------------------------------------------------

def _tolerates(tol: Toleration, taint: Taint) -> bool:
    if tol.effect and tol.effect != taint.effect:
        return False
    if tol.operator == "Exists":
        return not tol.key or tol.key == taint.key
    return tol.key == taint.key and tol.value == taint.value


def _untolerated(node: Node, tolerations: Sequence[Toleration]) -> tuple[bool, int]:
    """(a NoSchedule/NoExecute taint is not tolerated, how many PreferNoSchedule ones are not)."""
    hard, soft = False, 0
    for taint in node.taints:
        if any(_tolerates(t, taint) for t in tolerations):
            continue
        if taint.effect == "PreferNoSchedule":
            soft += 1
        else:
            hard = True
    return hard, soft


def _matches(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _filter_reason(node: Node, ps: PodSet) -> str | None:
    """Why `node` cannot take pods of `ps` whatever is free there, or None when it can."""
    if node.unschedulable:
        return "unschedulable"
    if node.taints and _untolerated(node, ps.tolerations)[0]:
        return "untolerated taint"
    if any(node.labels.get(k) != v for k, v in ps.node_selector.items()):
        return "nodeSelector"
    if ps.required_affinity and not any(
            all(_matches(req, node.labels) for req in term) for term in ps.required_affinity):
        return "node affinity"
    if ps.numa_policy in ("single-numa-node", "restricted") and not node.zones:
        return "no NUMA zones (no NodeResourceTopology)"
    return None


# ---- the index of a view ---------------------------------------------------------------------------

class _Index:
    """A view's nodes with their free figures, and its zones sorted by free CPU."""

    __slots__ = ("nodes", "states", "zkeys", "nkeys", "gpu_nodes", "kmin", "by_name", "dead", "_cpu_per_gpu")

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
        self._cpu_per_gpu: float | None = None

    def cpu_per_gpu(self) -> float:
        """The nodes' CPU millicores per GPU thousandth when empty (capacities never change here)."""
        if self._cpu_per_gpu is None:
            self._cpu_per_gpu = _cluster_cpu(self.nodes) if _cluster_cpu is not None else 0.0
        return self._cpu_per_gpu

    def update(self, i: int, node: Node) -> None:
        """Replace node `i` (its sorted keys move)."""
        old = self.states[i]
        for p, cpu in enumerate(old.zcpu):
            del self.zkeys[bisect.bisect_left(self.zkeys, (cpu, i, p))]
        del self.nkeys[bisect.bisect_left(self.nkeys, (old.cpu, i))]
        self.nodes[i] = node
        self.states[i] = _State.of(node)
        for p, z in enumerate(node.zones):
            bisect.insort(self.zkeys, (z.cpu_milli, i, p))
        bisect.insort(self.nkeys, (node.free.cpu_milli, i))


_cache: dict[int, tuple[object, _Index]] = {}
# Node states by node identity: a caller that builds each view from the unchanged Node objects of the
# last one (the controller's passes) does not work them out again.  States are never mutated once
# stored, so indexes may share them.  Emptied when it outgrows a few views' worth.
_states: dict[int, tuple[Node, _State]] = {}
_STATES_PER_NODE = 4


def _state_of(node: Node, limit: int) -> _State:
    hit = _states.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    if len(_states) >= limit:
        _states.clear()
    state = _states[id(node)] = (node, _State.of(node))
    return state[1]


def _index(key: object, nodes: Sequence[Node]) -> _Index:
    hit = _cache.get(id(key))
    if hit is not None and hit[0] is key:
        return hit[1]
    ix = _Index(nodes)
    _remember(key, ix)
    return ix


def _remember(key: object, ix: _Index) -> None:
    _cache[id(key)] = (key, ix)
    while len(_cache) > _CACHED_VIEWS:
        del _cache[next(iter(_cache))]


# ---- one decision ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Choice:
    """Where one pod would go and what it costs."""

    key: tuple[Any, ...]
    node: int
    zones: tuple[int, ...]  # the zones it takes CPU from (empty for node totals)
    cpu_split: tuple[int, ...]  # millicores taken from each of `zones`
    gpu_index: int | None
    cost: float


class _Work:
    """One placement attempt over an index: the nodes it changed and the pod sets' node filters."""

    def __init__(self, ix: _Index, mix: tuple[tuple[Resources, float], ...],
                 models: tuple[frozenset[str] | None, ...] = ()) -> None:
        self.ix = ix
        self.mix = mix
        self.models = models
        # the cluster's GPUs per model price the GPUs model-constrained pod types need
        self.supply = _gpu_supply(ix.nodes) if models and _gpu_supply is not None else None
        # and its CPU per GPU tells a workload that asks more CPU than the cluster has
        self.cluster_cpu = ix.cpu_per_gpu() if mix else 0.0
        self.touched: dict[int, _State] = {}
        self.eligible: dict[tuple[str, int], tuple[bool, int]] = {}
        self.base: dict[tuple[str, int], tuple[bool, int]] = {}

    def state(self, i: int) -> _State:
        return self.touched.get(i) or self.ix.states[i]

    def filter(self, ps: PodSet, i: int) -> tuple[bool, int]:
        """(node `i` may take pods of `ps`, its PreferNoSchedule penalty), cached per pod set."""
        k = (ps.name, i)
        hit = self.eligible.get(k)
        if hit is None:
            node = self.ix.nodes[i]
            if not (node.taints or node.unschedulable or ps.node_selector or ps.required_affinity):
                # the common case, without building a reason
                return bool(node.zones) or ps.numa_policy not in ("single-numa-node", "restricted"), 0
            hit = (_filter_reason(node, ps) is None,
                   _untolerated(node, ps.tolerations)[1] if node.taints else 0)
            self.eligible[k] = hit
        return hit

    def base_fit(self, ps: PodSet, i: int, dead: set[int]) -> tuple[bool, int]:
        """`filter`, and whether untouched node `i`'s totals hold a pod of `ps` (cached).

        `dead` is the index's set of nodes whose totals cannot hold this request: states only
        shrink while an index lives (`commit`), so a node that cannot hold it never will.
        """
        if i in dead:
            return False, 0
        k = (ps.name, i)
        hit = self.base.get(k)
        if hit is None:
            ok, soft = self.filter(ps, i)
            if ok and not _node_holds(self.ix.states[i], ps.requests):
                dead.add(i)
                ok = False
            hit = (ok, soft)
            self.base[k] = hit
        return hit

    # -- candidates --

    def candidates(self, ps: PodSet, allowed: tuple[int, ...] | None, limit: int) -> list[_Choice]:
        """The best `limit` places for one pod of `ps`, best first."""
        r = ps.requests
        found: list[_Choice] = []
        if r.gpus or r.gpu_milli or self.mix:
            # With a GPU mix every pod is scored by GPU fragmentation, CPU-only ones too: taking
            # a GPU node's CPUs can strand its GPUs as surely as taking a share of them.
            pool: Iterable[int] = (self.ix.gpu_nodes if not self.mix else range(len(self.ix.nodes))) \
                if allowed is None else allowed
            for i in pool:
                found.extend(self._options(ps, i))
        elif allowed is not None:
            for i in allowed:
                found.extend(self._options(ps, i))
        elif ps.numa_policy == "single-numa-node":
            found = self._scan_zones(ps)
        else:
            found = self._scan_nodes(ps)
        found.sort(key=lambda c: c.key)
        return found[:limit]

    def _scan_zones(self, ps: PodSet) -> list[_Choice]:
        r = ps.requests
        zkeys = self.ix.zkeys
        found: list[_Choice] = []
        seen = 0
        for i in self.touched:  # their index keys are stale: look at them directly
            found.extend(self._options(ps, i))
        dead = self.ix.dead.setdefault(_signature(r), set())
        for pos in range(bisect.bisect_left(zkeys, (r.cpu_milli, -1, -1)), len(zkeys)):
            _, i, p = zkeys[pos]
            if i in self.touched:
                continue
            ok, soft = self.base_fit(ps, i, dead)
            if not ok:
                continue
            s = self.ix.states[i]
            if not _zone_holds(s, p, r):
                continue
            found.append(self._zone_choice(ps, i, s, p, soft))
            seen += 1
            if seen >= _WINDOW:
                break
        return found

    def _scan_nodes(self, ps: PodSet) -> list[_Choice]:
        r = ps.requests
        nkeys = self.ix.nkeys
        found: list[_Choice] = []
        seen = 0
        for i in self.touched:
            found.extend(self._options(ps, i))
        for pos in range(bisect.bisect_left(nkeys, (r.cpu_milli, -1)), len(nkeys)):
            i = nkeys[pos][1]
            if i in self.touched:
                continue
            options = self._options(ps, i)
            if options:
                found.extend(options)
                seen += 1
                if seen >= _WINDOW:
                    break
        return found

    def _options(self, ps: PodSet, i: int) -> list[_Choice]:
        """Every way node `i` can take one pod of `ps` now (at most one per zone)."""
        ok, soft = self.filter(ps, i)
        if not ok:
            return []
        s = self.state(i)
        r = ps.requests
        if not _node_holds(s, r):
            return []
        gpu: tuple[float, int | None] = (0.0, None)
        if r.gpus or r.gpu_milli or self.mix:
            scored = self._gpu_score(i, s, r)
            if scored is None:
                return []
            gpu = scored
        policy = ps.numa_policy
        if policy == "single-numa-node":
            return [self._zone_choice(ps, i, s, p, soft, gpu)
                    for p in range(len(s.zcpu)) if _zone_holds(s, p, r)]
        if policy == "restricted":
            choice = self._restricted(ps, i, s, soft, gpu)
            return [choice] if choice is not None else []
        key = (soft, gpu[0], 0, s.cpu - r.cpu_milli, 0, i, -1)
        return [_Choice(key, i, (), (), gpu[1], gpu[0])]

    def _gpu_score(self, i: int, s: _State, r: Resources) -> tuple[float, int | None] | None:
        if self.mix and _gpu_choice is not None:
            node = self.ix.nodes[i]
            if i in self.touched:
                node = s.to_node(node)
            scored = _gpu_choice(node, r, self.mix, self.models, self.supply, self.cluster_cpu)
            return None if scored is None else (round(scored[0], _GPU_SCORE_DIGITS), scored[1])
        if r.gpu_milli:  # best fit: the GPU with the least free that holds the share
            fits = [(f, g) for g, f in enumerate(s.gfree) if f >= r.gpu_milli]
            if not fits:
                return None
            f, g = min(fits)
            return float(f - r.gpu_milli) / WHOLE_GPU, g
        return float(s.whole_gpus() - r.gpus), None

    def _zone_choice(self, ps: PodSet, i: int, s: _State, p: int, soft: int,
                     gpu: tuple[float, int | None] | None = None) -> _Choice:
        r = ps.requests
        if gpu is None:
            gpu = (0.0, None)
        zone = self.ix.nodes[i].zones[p]
        free = s.zcpu[p]
        left = free - r.cpu_milli
        cap = zone.cpu_capacity_milli or free
        broken = 1 if free >= cap and left > 0 else 0
        l3 = zone.l3_cpus * 1000
        l3_split = 1 if l3 and left % l3 else 0
        cost = gpu[0] + broken + (left / cap if cap else 0.0)
        key = (soft, gpu[0], broken, left, l3_split, s.cpu, i, p)
        return _Choice(key, i, (p,), (r.cpu_milli,), gpu[1], cost)

    def _restricted(self, ps: PodSet, i: int, s: _State, soft: int,
                    gpu: tuple[float, int | None]) -> _Choice | None:
        r = ps.requests
        k = self._kmin(i, r.cpu_milli)
        if k == 1:
            options = [self._zone_choice(ps, i, s, p, soft, gpu)
                       for p in range(len(s.zcpu)) if _zone_holds(s, p, r)]
            return min(options, key=lambda c: c.key) if options else None
        if k == 0:
            return None
        best: tuple[tuple[int, tuple[int, ...]], tuple[int, ...]] | None = None
        for combo in itertools.combinations(range(len(s.zcpu)), k):
            cpu = sum(s.zcpu[p] for p in combo)
            if (cpu < r.cpu_milli or sum(s.zmem[p] for p in combo) < r.memory
                    or sum(s.zgpus[p] for p in combo) < r.gpus):
                continue
            rank = (cpu - r.cpu_milli, combo)
            if best is None or rank < best[0]:
                best = (rank, combo)
        if best is None:
            return None
        combo = tuple(sorted(best[1], key=lambda p: (s.zcpu[p], p)))
        split: list[int] = []
        need = r.cpu_milli
        for p in combo:  # tightest zones first, as the allocator's best fit would
            take = min(need, s.zcpu[p])
            split.append(take)
            need -= take
        left = best[0][0]
        cap = sum(self.ix.nodes[i].zones[p].cpu_capacity_milli for p in combo) or 1
        broken = sum(1 for p, t in zip(combo, split, strict=True)
                     if s.zcpu[p] >= self.ix.nodes[i].zones[p].cpu_capacity_milli and t < s.zcpu[p])
        cost = gpu[0] + broken + left / cap
        key = (soft, gpu[0], broken, left, 0, i, combo[0])
        return _Choice(key, i, combo, tuple(split), gpu[1], cost)

    def _kmin(self, i: int, cpu: int) -> int:
        """The fewest zones an empty node `i` needs for `cpu` millicores (0: none can)."""
        k = (i, cpu)
        hit = self.ix.kmin.get(k)
        if hit is None:
            caps = sorted((z.cpu_capacity_milli for z in self.ix.nodes[i].zones), reverse=True)
            total, hit = 0, 0
            for n, c in enumerate(caps, 1):
                total += c
                if total >= cpu:
                    hit = n
                    break
            self.ix.kmin[k] = hit
        return hit

    # -- applying --

    def take(self, ps: PodSet, c: _Choice) -> None:
        """Count one pod of `ps` at `c`."""
        r = ps.requests
        s = self.state(c.node).clone()
        s.pods -= 1
        s.cpu -= r.cpu_milli
        s.mem -= r.memory
        s.hp = _minus(s.hp, r.hugepages)
        s.mig = _minus(s.mig, r.mig)
        if r.gpus:
            left = r.gpus
            for g, f in enumerate(s.gfree):
                if left and f >= WHOLE_GPU:
                    s.gfree[g] = 0
                    left -= 1
            s.gpus -= r.gpus
        elif r.gpu_milli and c.gpu_index is not None:
            if s.gfree[c.gpu_index] >= WHOLE_GPU:  # a shared GPU is no longer a whole one
                s.gpus = max(0, s.gpus - 1)
            s.gfree[c.gpu_index] -= r.gpu_milli
        if c.zones:
            first = c.zones[0]
            for p, cpu in zip(c.zones, c.cpu_split, strict=True):
                s.zcpu[p] -= cpu
            if len(c.zones) == 1:
                s.zmem[first] -= r.memory
                s.zgpus[first] -= r.gpus
                s.zhp[first] = _minus(s.zhp[first], r.hugepages)
                s.zmig[first] = _minus(s.zmig[first], r.mig)
            else:
                mem, gpus = r.memory, r.gpus
                for p in c.zones:
                    m, g = min(mem, s.zmem[p]), min(gpus, s.zgpus[p])
                    s.zmem[p] -= m
                    s.zgpus[p] -= g
                    mem, gpus = mem - m, gpus - g
        self.touched[c.node] = s


def _signature(r: Resources) -> tuple[Any, ...]:
    return (r.cpu_milli, r.memory, r.gpus, r.gpu_milli, tuple(sorted(r.hugepages.items())),
            tuple(sorted(r.mig.items())))


def _pod_zone(ps: PodSet, c: _Choice) -> int | None:
    if len(c.zones) != 1:
        return None
    return c.zones[0]


def _size(ps: PodSet) -> tuple[int, ...]:
    r = ps.requests
    return (r.gpus * WHOLE_GPU + r.gpu_milli, r.cpu_milli, r.memory, ps.count)


# ---- describing a refusal --------------------------------------------------------------------------

def _cpus(milli: int) -> str:
    if milli % 1000 == 0:
        n = milli // 1000
        return f"{n} CPU" if n == 1 else f"{n} CPUs"
    return f"{milli / 1000:g} CPUs"


def _bytes(n: int) -> str:
    for suffix, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift and n % (1 << (shift - 10 if shift > 10 else 0)) == 0:
            return f"{n / (1 << shift):g}{suffix}"
    return f"{n} bytes"


def _node_map(key: str, attr: str) -> Callable[[_State], int]:
    def get(s: _State) -> int:
        found: Mapping[str, int] = getattr(s, attr)
        return found.get(key, 0)
    return get


def _zone_map(key: str, attr: str) -> Callable[[_State, int], int]:
    def get(s: _State, p: int) -> int:
        found: list[Mapping[str, int]] = getattr(s, attr)
        return found[p].get(key, 0)
    return get


def _explain(work: _Work, ps: PodSet, allowed: tuple[int, ...] | None) -> str:
    """The constraint that stops one more pod of `ps`, in one line (the slow path of a refusal)."""
    r = ps.requests
    pool = range(len(work.ix.nodes)) if allowed is None else allowed
    names = work.ix.nodes
    excluded: dict[str, int] = {}
    live: list[int] = []
    for i in pool:
        why = _filter_reason(names[i], ps)
        if why is None:
            live.append(i)
        else:
            excluded[why] = excluded.get(why, 0) + 1
    if not live:
        detail = ", ".join(f"{why}: {n}" for why, n in sorted(excluded.items()))
        return f"no node passes the pod's filters ({detail or 'no nodes'})"
    live = [i for i in live if work.state(i).pods > 0]
    if not live:
        return "no eligible node admits another pod"
    checks: list[tuple[str, Callable[[_State], int], int, Callable[[int], str]]] = [
        ("", lambda s: s.cpu, r.cpu_milli, _cpus),
        (" memory", lambda s: s.mem, r.memory, _bytes),
        (" whole GPUs", lambda s: s.whole_gpus(), r.gpus, str),
        (" of one GPU", lambda s: max(s.gfree, default=0), r.gpu_milli,
         lambda v: f"{v / WHOLE_GPU:g}"),
    ]
    checks += [(f" {k}", _node_map(k, "hp"), v, _bytes) for k, v in sorted(r.hugepages.items())]
    checks += [(f" {k}", _node_map(k, "mig"), v, str) for k, v in sorted(r.mig.items())]
    for what, get, want, fmt in checks:
        if want <= 0:
            continue
        have, at = max((get(work.state(i)), -i) for i in live)
        if have < want:
            return (f"pod needs {fmt(want)}{what} on one node; most free on a node is {fmt(have)} "
                    f"(node {names[-at].name})")
    live = [i for i in live if _node_holds(work.state(i), r)]
    if not live:
        return "no node holds the pod's CPU, memory and devices together"
    if ps.numa_policy in ("single-numa-node", "restricted"):
        zone_checks: list[tuple[str, Callable[[_State, int], int], int, Callable[[int], str]]] = [
            ("", lambda s, p: s.zcpu[p], r.cpu_milli, _cpus),
            (" memory", lambda s, p: s.zmem[p], r.memory, _bytes),
            (" whole GPUs", lambda s, p: s.zgpus[p], r.gpus, str),
        ]
        zone_checks += [(f" {k}", _zone_map(k, "zhp"), v, _bytes)
                        for k, v in sorted(r.hugepages.items())]
        zone_checks += [(f" {k}", _zone_map(k, "zmig"), v, str)
                        for k, v in sorted(r.mig.items())]
        single = ps.numa_policy == "single-numa-node"
        where = "in one NUMA zone" if single else "in the fewest NUMA zones an empty node needs"
        for what, zget, want, fmt in zone_checks:
            if want <= 0 or not single:
                continue
            have, at = max((zget(work.state(i), p), -i) for i in live
                           for p in range(len(work.state(i).zcpu)))
            if have < want:
                return (f"pod needs {fmt(want)}{what} {where}; largest free zone has {fmt(have)} "
                        f"(node {names[-at].name})")
        if not any(work._options(ps, i) for i in live):
            return f"no node holds the pod's CPU, memory and devices together {where}"
    if r.gpus or r.gpu_milli:
        return "no node's GPUs can take the pod without exceeding what is free"
    return "no node holds it"


# ---- the search ------------------------------------------------------------------------------------

_Slot = tuple[PodSet, int, tuple[int, ...] | None]  # pod set, index, allowed nodes (None: all)


def _broken(choices: Sequence[_Choice]) -> int:
    """How many whole zones zone choices (`_Work._zone_choice`) break: their key's third field."""
    return sum(c.key[2] for c in choices)


def _one_node(work: _Work, slots: Sequence[_Slot], greedy: list[_Choice]) -> list[_Choice] | None:
    """The gang on one node, when a node among the first pod's best places holds all of it and
    breaks no more whole zones than the greedy placement `greedy` (None otherwise).

    Pods of one gang talk to each other, and a gang on one node needs no per-pod pin: its Job's pod
    template carries the node (`agent.admission.placing`).  Only gangs of zone-aligned pods with no
    GPU and no colocation label (those have their own domain search)."""
    if len({c.node for c in greedy}) == 1:
        return None
    for ps, _, allowed in slots:
        if allowed is not None or ps.numa_policy != "single-numa-node" or work.mix \
                or ps.requests.gpus or ps.requests.gpu_milli:
            return None
    limit = _broken(greedy)
    ps0 = slots[0][0]
    tried: set[int] = set()
    work.touched.clear()
    for first in work.candidates(ps0, None, _WINDOW):
        if first.node in tried:
            continue
        tried.add(first.node)
        work.touched.clear()
        chosen = [first]
        work.take(ps0, first)
        for ps, _, _ in slots[1:]:
            options = work.candidates(ps, (first.node,), 1)
            if not options:
                break
            work.take(ps, options[0])
            chosen.append(options[0])
        else:
            if _broken(chosen) <= limit:
                return chosen
    return None


def _search(work: _Work, slots: Sequence[_Slot]) -> tuple[list[_Choice] | None, str]:
    """Greedy over `slots`, then bounded backtracking; (choices, "") or (None, the first failure).

    A greedy placement over several nodes is replaced by one on a single node where `_one_node`
    finds one as good for the cluster's whole zones."""
    chosen: list[_Choice] = []
    failure = ""
    for ps, index, allowed in slots:
        options = work.candidates(ps, allowed, 1)
        if not options:
            failure = _prefix(ps, index) + _explain(work, ps, allowed)
            break
        work.take(ps, options[0])
        chosen.append(options[0])
    else:
        if len(slots) > 1:
            saved = dict(work.touched)
            local = _one_node(work, slots, chosen)
            if local is not None:
                return local, ""
            work.touched = saved
        return chosen, ""
    work.touched.clear()
    if len(slots) == 1 or not work.candidates(ps, allowed, 1):
        # the pod does not fit even with nothing of the gang placed: no other order can help
        return None, failure
    budget = [_STEPS_PER_POD * len(slots)]
    path: list[_Choice] = []

    def dfs(k: int) -> bool:
        if k == len(slots):
            return True
        ps, _, allowed = slots[k]
        budget[0] -= 1
        if budget[0] < 0:
            return False
        saved = dict(work.touched)
        for c in work.candidates(ps, allowed, _BRANCH):
            work.take(ps, c)
            path.append(c)
            if dfs(k + 1):
                return True
            path.pop()
            work.touched = dict(saved)
            if budget[0] < 0:
                return False
        return False

    if dfs(0):
        return path, ""
    return None, failure


def _prefix(ps: PodSet, index: int) -> str:
    if ps.count > 1:
        return f'pod set "{ps.name}" (pod {index + 1} of {ps.count}): '
    return f'pod set "{ps.name}": '


def _slots(gang: Gang, domains: Mapping[str, tuple[int, ...]]) -> list[_Slot]:
    slots: list[_Slot] = []
    for ps in sorted(gang.pod_sets, key=_size, reverse=True):
        allowed = domains.get(ps.colocate_label) if ps.colocate_label else None
        slots.extend((ps, k, allowed) for k in range(ps.count))
    return slots


_Domains = list[tuple[str, tuple[int, ...]]]  # (label value, its nodes in order)


def _domain_choices(ix: _Index, gang: Gang) -> tuple[list[str], list[_Domains], str]:
    """Per colocation label, the values whose nodes could hold that label's pods, most promising
    (least free, best fit) first; and why none could when a label has no such value."""
    labels = sorted({ps.colocate_label for ps in gang.pod_sets if ps.colocate_label})
    per_label: list[_Domains] = []
    for label in labels:
        sets = [ps for ps in gang.pod_sets if ps.colocate_label == label]
        need_cpu = sum(ps.count * ps.requests.cpu_milli for ps in sets)
        need_pods = sum(ps.count for ps in sets)
        zoned = [ps.requests.cpu_milli for ps in sets if ps.numa_policy == "single-numa-node"]
        biggest = max(zoned, default=0)
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(ix.nodes):
            value = n.labels.get(label)
            if value is not None:
                groups.setdefault(value, []).append(i)
        if not groups:
            return labels, [], f"no node has the colocation label {label}"
        ranked: list[tuple[int, str, tuple[int, ...]]] = []
        most: tuple[int, str] = (-1, "")
        for value, members in groups.items():
            cpu = pods = zone = 0
            for i in members:
                st = ix.states[i]
                cpu += st.cpu
                pods += st.pods
                zone = max(zone, max(st.zcpu, default=0))
            most = max(most, (cpu, value))
            if cpu >= need_cpu and pods >= need_pods and zone >= biggest:
                ranked.append((cpu, value, tuple(members)))
        if not ranked:
            return labels, [], (f"no {label} domain holds the whole gang: it needs {_cpus(need_cpu)} and "
                                f"{need_pods} pods; the most free is {label}={most[1]} with {_cpus(most[0])}")
        ranked.sort()
        per_label.append([(value, members) for _, value, members in ranked])
    return labels, per_label, ""


def _attempt(ix: _Index, mix: tuple[tuple[Resources, float], ...], gang: Gang,
             models: tuple[frozenset[str] | None, ...] = (),
             ) -> tuple[list[tuple[PodSet, int, _Choice]] | None, str]:
    labels, per_label, why_none = _domain_choices(ix, gang)
    if why_none:
        return None, why_none
    if not labels:
        work = _Work(ix, mix, models)
        slots = _slots(gang, {})
        found, why = _search(work, slots)
        if found is None:
            return None, why
        return [(s[0], s[1], c) for s, c in zip(slots, found, strict=True)], ""
    best: tuple[float, list[tuple[PodSet, int, _Choice]]] | None = None
    first_why = ""
    tried = placed = 0
    for combo in itertools.product(*per_label):
        if tried >= _MAX_DOMAIN_COMBOS or placed >= _DOMAIN_PLACEMENTS:
            break
        tried += 1
        domains = {lab: nodes for lab, (_, nodes) in zip(labels, combo, strict=True)}
        work = _Work(ix, mix, models)
        slots = _slots(gang, domains)
        found, why = _search(work, slots)
        if found is None:
            if not first_why:
                where = ", ".join(f"{lab}={value}" for lab, (value, _) in zip(labels, combo, strict=True))
                first_why = f"{why} (in {where})"
            continue
        placed += 1
        cost = sum(c.cost for c in found)
        if best is None or cost < best[0]:
            best = (cost, [(s[0], s[1], c) for s, c in zip(slots, found, strict=True)])
    if best is None:
        return None, f"no {'/'.join(labels)} domain holds the whole gang ({tried} tried); {first_why}"
    return best[1], ""


def place(view: ClusterView, gang: Gang) -> Placement | Refusal:
    """Place every pod of `gang` on `view`, all or nothing; a Refusal names the binding constraint."""
    bad = _invalid(gang)
    if bad:
        return Refusal(gang.key, "never", bad)
    ix = _index(view, view.nodes)
    found, why = _attempt(ix, view.gpu_mix, gang, view.gpu_mix_models)
    if found is not None:
        pods = sorted(
            (PodPlacement(pod_set=ps.name, index=k, node=ix.nodes[c.node].name,
                          zone=(ix.nodes[c.node].zones[c.zones[0]].numa
                                if _pod_zone(ps, c) is not None else None),
                          gpu_index=c.gpu_index)
             for ps, k, c in found),
            key=lambda p: (p.pod_set, p.index))
        return Placement(gang.key, tuple(pods), round(sum(c.cost for _, _, c in found), 6))
    if not view.empty:
        return Refusal(gang.key, "not-now", why)
    empty = _index(view.empty, view.empty)
    never, why_never = _attempt(empty, view.gpu_mix, gang, view.gpu_mix_models)
    if never is None:
        return Refusal(gang.key, "never", f"{why_never} even on the empty cluster")
    return Refusal(gang.key, "not-now", why)


def _invalid(gang: Gang) -> str:
    if not gang.pod_sets:
        return "the gang has no pod sets"
    names = [ps.name for ps in gang.pod_sets]
    if len(set(names)) != len(names):
        return "pod set names repeat"
    for ps in gang.pod_sets:
        r = ps.requests
        if ps.count < 1:
            return f'pod set "{ps.name}": count must be at least 1'
        if r.gpus and r.gpu_milli:
            return f'pod set "{ps.name}": a pod takes whole GPUs or one share, not both'
        if not 0 <= r.gpu_milli < WHOLE_GPU:
            return f'pod set "{ps.name}": gpu_milli must be below {WHOLE_GPU}'
        if min(r.cpu_milli, r.memory, r.gpus) < 0:
            return f'pod set "{ps.name}": negative request'
    return ""


def commit(view: ClusterView, gang: Gang, placement: Placement) -> ClusterView:
    """`view` with `placement`'s pods counted on their nodes and zones, as `place` counted them."""
    ix = _index(view, view.nodes)
    by_name = ix.by_name
    sets = {ps.name: ps for ps in gang.pod_sets}
    work = _Work(ix, view.gpu_mix, view.gpu_mix_models)
    for pod in placement.pods:
        ps = sets[pod.pod_set]
        i = by_name[pod.node]
        node = ix.nodes[i]
        c = _recount(work, ps, i, node, pod)
        work.take(ps, c)
    nodes = list(ix.nodes)
    for i, s in work.touched.items():
        nodes[i] = s.to_node(ix.nodes[i])
    new = replace(view, nodes=tuple(nodes))
    # carry the index over: the old view's entry is dropped, since its index now describes `new`
    _cache.pop(id(view), None)
    for i in sorted(work.touched):
        ix.update(i, nodes[i])
    _remember(new, ix)
    return new


def _recount(work: _Work, ps: PodSet, i: int, node: Node, pod: PodPlacement) -> _Choice:
    """The choice `place` made for `pod`, rebuilt from its placement record."""
    s = work.state(i)
    r = ps.requests
    if pod.zone is not None:
        p = next(k for k, z in enumerate(node.zones) if z.numa == pod.zone)
        return _Choice((), i, (p,), (r.cpu_milli,), pod.gpu_index, 0.0)
    if ps.numa_policy == "restricted" and node.zones:
        c = work._restricted(ps, i, s, 0, (0.0, pod.gpu_index))
        if c is not None:
            return c
    return _Choice((), i, (), (), pod.gpu_index, 0.0)


"""Where one pod can go and what it costs: the candidates of one placement attempt, and their scores.

Public API: `Work(index, mix, models)`, one placement attempt over a `viewindex.Index` (`candidates`,
`options`, `take`, and the places the policy rows choose from), and `WINDOW`, how many feasible
candidates a pod compares.  Scores are lower-is-better and leave the cluster less fragmented than plain
best fit; their order, a choice's cost and how candidates are found: README.md beside this module.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agent.admission.engine.choice import Choice
from agent.admission.engine.filters import filter_reason, untolerated
from agent.admission.engine.fragmentation import cluster_cpu_per_milli, gpu_choice, gpu_supply
from agent.admission.engine.model import NODE_POLICY, PodSet, Resources
from agent.admission.engine.policies import GPUScore, engine_policy
from agent.admission.engine.scope import split
from agent.admission.engine.viewindex import (
    WHOLE_GPU,
    Index,
    NodeState,
    minus,
    node_holds,
    zone_devices_hold,
    zone_holds,
)
from agent.api.policies import Scope

# How many feasible candidates a pod compares before choosing (the index yields them tightest first).
WINDOW = 16

# GPU scores are sums of float products: two nodes whose fragmentation rises equally can differ in the
# last bits, and that noise, not the CPU rules after it, would pick the node.  Scores tie to this many
# decimals (of a GPU thousandth).
_GPU_SCORE_DIGITS = 6


def _cpu_per_gpu(ix: Index) -> float:
    """The index's nodes' CPU millicores per GPU thousandth when empty, worked out once per index."""
    if ix.cpu_per_gpu is None:
        ix.cpu_per_gpu = cluster_cpu_per_milli(ix.nodes)
    return ix.cpu_per_gpu


class Work:
    """One placement attempt over an index: the nodes it changed and the pod sets' node filters."""

    def __init__(self, ix: Index, mix: tuple[tuple[Resources, float], ...],
                 models: tuple[frozenset[str] | None, ...] = ()) -> None:
        self.ix = ix
        self.mix = mix
        self.models = models
        # the cluster's GPUs per model price the GPUs model-constrained pod types need
        self.supply = gpu_supply(ix.nodes) if models else None
        # and its CPU per GPU tells a workload that asks more CPU than the cluster has
        self.cluster_cpu = _cpu_per_gpu(ix) if mix else 0.0
        self.touched: dict[int, NodeState] = {}
        self.eligible: dict[tuple[str, int], tuple[bool, int]] = {}
        self.base: dict[tuple[str, int], tuple[bool, int]] = {}

    def state(self, i: int) -> NodeState:
        return self.touched.get(i) or self.ix.states[i]

    def zoned(self, ps: PodSet) -> Resources:
        """What one pod of `ps` asks of its zones: all of its requests, or its devices alone when its
        CPU and memory are not aligned."""
        if ps.cpu_aligned:
            return ps.requests
        r = ps.requests
        return Resources(gpus=r.gpus, gpu_milli=r.gpu_milli, mig=r.mig, devices=r.devices)

    def filter(self, ps: PodSet, i: int) -> tuple[bool, int]:
        """(node `i` may take pods of `ps`, its PreferNoSchedule penalty), cached per pod set."""
        k = (ps.name, i)
        hit = self.eligible.get(k)
        if hit is None:
            node = self.ix.nodes[i]
            if not (node.taints or node.unschedulable or ps.node_selector or ps.required_affinity):
                # the common case, without building a reason
                policy = ps.numa_policy
                if policy == NODE_POLICY:
                    policy = node.topology_policy
                return bool(node.zones) or not engine_policy(policy).zoned, 0
            hit = (filter_reason(node, ps) is None,
                   untolerated(node, ps.tolerations)[1] if node.taints else 0)
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
            if ok and not node_holds(self.ix.states[i], ps.requests):
                dead.add(i)
                ok = False
            hit = (ok, soft)
            self.base[k] = hit
        return hit

    # -- candidates --

    def candidates(self, ps: PodSet, allowed: tuple[int, ...] | None, limit: int) -> list[Choice]:
        """The best `limit` places for one pod of `ps`, best first."""
        r = ps.requests
        found: list[Choice] = []
        if r.gpus or r.gpu_milli or self.mix:
            # With a GPU mix every pod is scored by GPU fragmentation, CPU-only ones too: taking
            # a GPU node's CPUs can strand its GPUs as surely as taking a share of them.
            pool: Iterable[int] = (self.ix.gpu_nodes if not self.mix else range(len(self.ix.nodes))) \
                if allowed is None else allowed
            for i in pool:
                found.extend(self.options(ps, i))
        elif allowed is not None:
            for i in allowed:
                found.extend(self.options(ps, i))
        elif engine_policy(ps.numa_policy).one_zone:
            found = self._scan_zones(ps)
            if not found and len(ps.containers) > 1:
                found = self._scan_nodes(ps)  # no zone holds it whole: the container scope may split it
        else:
            found = self._scan_nodes(ps)
        found.sort(key=lambda c: c.key)
        return found[:limit]

    def _scan_zones(self, ps: PodSet) -> list[Choice]:
        r = self.zoned(ps)
        zkeys = self.ix.zkeys
        found: list[Choice] = []
        seen = 0
        for i in self.touched:  # their index keys are stale: look at them directly
            found.extend(self.options(ps, i))
        dead = self.ix.dead.setdefault(_signature(ps.requests), set())
        for pos in range(bisect.bisect_left(zkeys, (r.cpu_milli, -1, -1)), len(zkeys)):
            _, i, p = zkeys[pos]
            if i in self.touched:
                continue
            ok, soft = self.base_fit(ps, i, dead)
            if not ok:
                continue
            s = self.ix.states[i]
            if not zone_holds(s, p, r):
                continue
            found.append(self._zone_choice(ps, i, s, p, soft))
            seen += 1
            if seen >= WINDOW:
                break
        return found

    def _scan_nodes(self, ps: PodSet) -> list[Choice]:
        r = ps.requests
        nkeys = self.ix.nkeys
        found: list[Choice] = []
        seen = 0
        for i in self.touched:
            found.extend(self.options(ps, i))
        for pos in range(bisect.bisect_left(nkeys, (r.cpu_milli, -1)), len(nkeys)):
            i = nkeys[pos][1]
            if i in self.touched:
                continue
            options = self.options(ps, i)
            if options:
                found.extend(options)
                seen += 1
                if seen >= WINDOW:
                    break
        return found

    def options(self, ps: PodSet, i: int) -> list[Choice]:
        """Every way node `i` can take one pod of `ps` now (at most one per zone)."""
        ok, soft = self.filter(ps, i)
        if not ok:
            return []
        s = self.state(i)
        r = ps.requests
        if not node_holds(s, r):
            return []
        gpu: GPUScore = (0.0, None)
        if r.gpus or r.gpu_milli or self.mix:
            scored = self._gpu_score(i, s, r)
            if scored is None:
                return []
            gpu = scored
        return engine_policy(ps.policy_on(self.ix.nodes[i])).options(self, ps, i, s, soft, gpu)

    def zone_choices(self, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> list[Choice]:
        """One pod of `ps` in each zone of node `i` that holds it."""
        z = self.zoned(ps)
        return [self._zone_choice(ps, i, s, p, soft, gpu) for p in range(len(s.zcpu)) if zone_holds(s, p, z)]

    def node_choice(self, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> Choice:
        """One pod of `ps` on node `i`'s totals, no zone."""
        key = (soft, gpu[0], 0, s.cpu - ps.requests.cpu_milli, 0, i, -1)
        return Choice(key, i, (), (), gpu[1], gpu[0])

    def _gpu_score(self, i: int, s: NodeState, r: Resources) -> GPUScore | None:
        if self.mix:
            node = self.ix.nodes[i]
            if i in self.touched:
                node = s.to_node(node)
            scored = gpu_choice(node, r, self.mix, self.models, self.supply, self.cluster_cpu)
            return None if scored is None else (round(scored[0], _GPU_SCORE_DIGITS), scored[1])
        if r.gpu_milli:  # best fit: the GPU with the least free that holds the share
            fits = [(f, g) for g, f in enumerate(s.gfree) if f >= r.gpu_milli]
            if not fits:
                return None
            f, g = min(fits)
            return float(f - r.gpu_milli) / WHOLE_GPU, g
        return float(s.whole_gpus() - r.gpus), None

    def _zone_choice(self, ps: PodSet, i: int, s: NodeState, p: int, soft: int,
                     gpu: GPUScore | None = None) -> Choice:
        r = self.zoned(ps)
        if gpu is None:
            gpu = (0.0, None)
        zone = self.ix.nodes[i].zones[p]
        free = s.zcpu[p]
        left = free - r.cpu_milli
        cap = zone.cpu_capacity_milli or free
        broken = 1 if free >= cap and left > 0 and r.cpu_milli else 0
        l3 = zone.l3_cpus * 1000
        l3_split = 1 if l3 and left % l3 else 0
        cost = gpu[0] + broken + (left / cap if cap else 0.0)
        key = (soft, gpu[0], broken, left, l3_split, s.cpu, i, p)
        return Choice(key, i, (p,), (r.cpu_milli,), gpu[1], cost)

    def splits(self, ps: PodSet, i: int) -> bool:
        """Whether node `i` may split a single-numa-node pod of `ps` over zones: the node aligns
        containers one by one (its scope "container"), the pod has several, and it asks its zones for
        CPU and memory alone (a pod with devices takes one zone whole)."""
        r = ps.requests
        return (len(ps.containers) > 1 and self.ix.nodes[i].topology_scope == Scope.CONTAINER
                and ps.cpu_aligned and not (r.gpus or r.gpu_milli or r.mig or r.devices))

    def container_scope(self, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> list[Choice]:
        """A single-numa-node pod on a node of the container scope: in one zone where one holds it
        whole, else split over zones (`split_choice`)."""
        whole = [self._zone_choice(ps, i, s, p, soft, gpu)
                 for p in range(len(s.zcpu)) if zone_holds(s, p, ps.requests)]
        if whole:
            return whole
        choice = self.split_choice(ps, i, s, soft, gpu)
        return [choice] if choice is not None else []

    def split_choice(self, ps: PodSet, i: int, s: NodeState, soft: int,
                     gpu: GPUScore) -> Choice | None:
        """The pod's containers over two or more zones of node `i`, each in a zone that holds it
        (`agent.admission.engine.scope.split`); its memory from those zones' total."""
        where = split(s.zcpu, ps.containers)
        if where is None or len(set(where)) < 2:
            return None
        per: dict[int, int] = {}
        for p, cpu in zip(where, ps.containers, strict=True):
            per[p] = per.get(p, 0) + cpu
        zones = tuple(sorted(per))
        if sum(s.zmem[p] for p in zones) < ps.requests.memory:
            return None
        caps = [self.ix.nodes[i].zones[p].cpu_capacity_milli for p in zones]
        broken = sum(1 for p, cap in zip(zones, caps, strict=True) if s.zcpu[p] >= cap and per[p] < s.zcpu[p])
        left = sum(s.zcpu[p] - per[p] for p in zones)
        cost = gpu[0] + broken + left / (sum(caps) or 1)
        key = (soft, gpu[0], broken, left, 0, s.cpu, i, zones[0])
        return Choice(key, i, zones, tuple(per[p] for p in zones), gpu[1], cost, where)

    def restricted(self, ps: PodSet, i: int, s: NodeState, soft: int,
                    gpu: GPUScore) -> Choice | None:
        r = self.zoned(ps)
        k = self._kmin(i, r.cpu_milli)
        if k == 1:
            options = [self._zone_choice(ps, i, s, p, soft, gpu)
                       for p in range(len(s.zcpu)) if zone_holds(s, p, r)]
            return min(options, key=lambda c: c.key) if options else None
        if k == 0:
            return None
        best: tuple[tuple[int, tuple[int, ...]], tuple[int, ...]] | None = None
        for combo in itertools.combinations(range(len(s.zcpu)), k):
            cpu = sum(s.zcpu[p] for p in combo)
            if (cpu < r.cpu_milli or sum(s.zmem[p] for p in combo) < r.memory
                    or sum(s.zgpus[p] for p in combo) < r.gpus):
                continue
            if r.devices and not zone_devices_hold(s, _summed([s.zdev[p] for p in combo]), r.devices):
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
        return Choice(key, i, combo, tuple(split), gpu[1], cost)

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

    def take(self, ps: PodSet, c: Choice) -> None:
        """Count one pod of `ps` at `c`."""
        r = ps.requests
        s = self.state(c.node).clone()
        s.pods -= 1
        s.cpu -= r.cpu_milli
        s.mem -= r.memory
        s.hp = minus(s.hp, r.hugepages)
        s.mig = minus(s.mig, r.mig)
        s.dev = minus(s.dev, r.devices)
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
            z = self.zoned(ps)
            first = c.zones[0]
            for p, cpu in zip(c.zones, c.cpu_split, strict=True):
                s.zcpu[p] -= cpu
            zdev = {k: v for k, v in z.devices.items() if k in s.zdevnames} if z.devices else {}
            if len(c.zones) == 1:
                s.zmem[first] -= z.memory
                s.zgpus[first] -= z.gpus
                s.zhp[first] = minus(s.zhp[first], z.hugepages)
                s.zmig[first] = minus(s.zmig[first], z.mig)
                s.zdev[first] = minus(s.zdev[first], zdev)
            else:
                mem, gpus = z.memory, z.gpus
                for p in c.zones:
                    m, g = min(mem, s.zmem[p]), min(gpus, s.zgpus[p])
                    s.zmem[p] -= m
                    s.zgpus[p] -= g
                    mem, gpus = mem - m, gpus - g
                    if zdev:
                        took = {k: min(v, s.zdev[p].get(k, 0)) for k, v in zdev.items()}
                        s.zdev[p] = minus(s.zdev[p], took)
                        zdev = {k: v - took[k] for k, v in zdev.items() if v > took[k]}
        self.touched[c.node] = s


def _signature(r: Resources) -> tuple[Any, ...]:
    return (r.cpu_milli, r.memory, r.gpus, r.gpu_milli, tuple(sorted(r.hugepages.items())),
            tuple(sorted(r.mig.items())), tuple(sorted(r.devices.items())))


def _summed(maps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    return out


"""`choose_gpus`: whole GPUs for one request, on the NUMA nodes its CPUs can come from; a pure function.

One NUMA node that holds all the GPUs and the request's CPUs first, else the fewest nodes that hold the
GPUs; among equals best fit, then NUMA distance, then node ids; inside the nodes the lowest PCI
addresses.  `single-numa-node` accepts only one node, `restricted` only nodes whose CPUs fit (their
rows of `agent.alloc.policies`).  GPUs of unknown NUMA node fill in last, never under single-numa-node
unless no GPU's place is known.  The full order and why: README.md beside this module.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from agent.alloc.exclusive import allocate
from agent.alloc.policies import ALLOC_POLICIES
from agent.alloc.request import Request
from agent.api.policies import NumaPolicy
from agent.errors import AllocationError
from agent.gpu.model import GPU
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology

# Node sets tried per size; past it only the best-ranked by GPU count are tried (as in `exclusive`).
_MAX_COMBINATIONS = 128


@dataclass(frozen=True, slots=True)
class GPUChoice:
    """The chosen GPUs (PCI bus order) and the NUMA nodes the CPU request should prefer."""

    gpus: tuple[GPU, ...]
    numa_nodes: frozenset[int] | None  # where the CPUs should come from; None: GPUs of unknown place

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(g.pci_address for g in self.gpus)


def is_held(gpu: GPU, held: Collection[str]) -> bool:
    """Whether `held` (PCI addresses or UUIDs, as the state file records them) names this GPU."""
    return gpu.pci_address in held or (bool(gpu.uuid) and gpu.uuid in held)


def choose_gpus(topology: Topology, free_cpus: CPUSet, request: Request, gpus: Sequence[GPU],
                held: Collection[str], count: int) -> GPUChoice:
    """Choose `count` whole GPUs among `gpus` not in `held`, aligned with `request`'s CPUs from `free_cpus`.

    Raises AllocationError saying what was free when the request cannot be met under its policy.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise AllocationError(f"GPU count must be a non-negative integer, got {count!r}")
    if count == 0:
        return GPUChoice((), None)
    if not gpus:
        raise AllocationError(f"requested {count} GPU(s), but this node has no GPUs")
    free = sorted((g for g in gpus if not is_held(g, held)), key=lambda g: g.pci_address)
    if len(free) < count:
        raise AllocationError(f"requested {count} GPU(s): {len(free)} of {len(gpus)} free")
    cpu_nodes = {n.id for n in topology.numa_nodes if n.cpus}
    by_node: dict[int, list[GPU]] = {}
    unplaced: list[GPU] = []
    for g in free:
        if g.numa_node in cpu_nodes:
            by_node.setdefault(g.numa_node, []).append(g)
        else:
            unplaced.append(g)
    policy = ALLOC_POLICIES[request.numa_policy]
    if not by_node and not any(g.numa_node in cpu_nodes for g in gpus):
        return GPUChoice(tuple(free[:count]), None)
    nodes = _choose_nodes(topology, free_cpus, request, by_node, count)
    if nodes is not None:
        # The CPUs may come from any node of the chosen set: that is the set their fit was judged on.
        return GPUChoice(_take(by_node, nodes, count, ()), frozenset(nodes))
    counts = ", ".join(f"{n}={len(by_node.get(n, ()))}" for n in sorted(cpu_nodes)) or "none"
    name = request.numa_policy
    if policy.one_node:
        if any(len(v) >= count for v in by_node.values()):
            raise AllocationError(f"{name}: no NUMA node holds {count} free GPU(s) and "
                                  f"{request.cpus} free CPU(s) (free GPUs per NUMA node: {counts})")
        raise AllocationError(f"{name}: no NUMA node holds {count} free GPU(s) "
                              f"(free GPUs per NUMA node: {counts}; {len(unplaced)} of unknown place)")
    if policy.strict and sum(map(len, by_node.values())) >= count:
        raise AllocationError(f"{name}: no NUMA nodes holding {count} free GPU(s) also hold "
                              f"{request.cpus} free CPU(s) (free GPUs per NUMA node: {counts})")
    # The known GPUs cannot make up the count: all of them, then GPUs of unknown place.
    picked = _take(by_node, tuple(sorted(by_node)), count, unplaced)
    return GPUChoice(picked, frozenset(by_node) or None)


def allocate_with_gpus(topology: Topology, free_cpus: CPUSet, request: Request, gpus: Sequence[GPU],
                       held: Collection[str], count: int) -> tuple[CPUSet, GPUChoice]:
    """`count` GPUs by `choose_gpus`, then the request's CPUs preferring (or, under a strict NUMA
    policy, confined to) the GPUs' NUMA nodes; raises AllocationError when either cannot be met."""
    chosen = choose_gpus(topology, free_cpus, request, gpus, held, count)
    if chosen.numa_nodes is not None:
        request = replace(request, preferred_numa=chosen.numa_nodes)
    return allocate(topology, free_cpus, request), chosen


def _take(by_node: dict[int, list[GPU]], nodes: Sequence[int], count: int,
          unplaced: Sequence[GPU]) -> tuple[GPU, ...]:
    """The lowest-addressed GPUs of `nodes` (largest groups first), then of `unplaced`, in bus order."""
    picked: list[GPU] = []
    for n in sorted(nodes, key=lambda n: (-len(by_node[n]), n)):
        picked.extend(by_node[n][:count - len(picked)])
    picked.extend(unplaced[:count - len(picked)])
    return tuple(sorted(picked, key=lambda g: g.pci_address))


def _choose_nodes(topology: Topology, free_cpus: CPUSet, request: Request,
                  by_node: dict[int, list[GPU]], count: int) -> tuple[int, ...] | None:
    """The NUMA node set to take the GPUs from, by the preference in README.md; None when none qualifies."""
    policy = ALLOC_POLICIES[request.numa_policy]
    fit_memo: dict[tuple[int, ...], bool] = {}

    def fits(combo: tuple[int, ...]) -> bool:
        if combo not in fit_memo:
            fit_memo[combo] = _cpus_fit(topology, free_cpus, request, combo)
        return fit_memo[combo]

    def rank(combo: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
        slack = sum(len(by_node[n]) for n in combo) - count
        distance = sum(topology.distance(a, b) for a, b in itertools.combinations(combo, 2))
        return slack, distance, combo

    singles = sorted(((n,) for n, g in by_node.items() if len(g) >= count), key=rank)
    for combo in singles:
        if fits(combo):
            return combo
    if policy.one_node:
        return None
    known = sorted(by_node)
    for k in range(_fewest([len(by_node[n]) for n in known], count), len(known) + 1):
        combos = sorted(_combinations(by_node, known, k, count), key=rank)
        if not combos:
            continue
        fitting = [c for c in combos if fits(c)]
        if fitting:
            # Among node sets of the fewest nodes, those whose CPUs fit the request come first.
            return fitting[0]
        if not policy.strict:
            return combos[0]
    return None


def _cpus_fit(topology: Topology, free_cpus: CPUSet, request: Request, nodes: tuple[int, ...]) -> bool:
    """Whether the CPU request could be met inside `nodes` alone (asked of the CPU allocator itself,
    under restricted: confined to them, in as few of them as an idle machine would use)."""
    if request.cpus == 0:
        return True
    try:
        allocate(topology, free_cpus, Request(request.cpus, NumaPolicy.RESTRICTED.value, request.smt,
                                              frozenset(nodes), request.reserved))
    except AllocationError:
        return False
    return True


def _fewest(counts: Sequence[int], need: int) -> int:
    """How many of `counts` (largest first) it takes to reach `need`; len+1 when they cannot."""
    total = 0
    for k, c in enumerate(sorted(counts, reverse=True), 1):
        total += c
        if total >= need:
            return k
    return len(counts) + 1


def _combinations(by_node: dict[int, list[GPU]], known: list[int], k: int,
                  count: int) -> list[tuple[int, ...]]:
    """k-node sets holding at least `count` free GPUs: all when few, else those built around the
    k fullest nodes (each node with the k-1 fullest others)."""
    def enough(combo: tuple[int, ...]) -> bool:
        return sum(len(by_node[n]) for n in combo) >= count

    if math.comb(len(known), k) <= _MAX_COMBINATIONS:
        return [c for c in itertools.combinations(known, k) if enough(c)]
    fullest = sorted(known, key=lambda n: (-len(by_node[n]), n))
    shortlist = {tuple(sorted(fullest[:k]))}
    for n in known:
        others = [m for m in fullest if m != n][:k - 1]
        shortlist.add(tuple(sorted([n, *others])))
    return [c for c in shortlist if enough(c)]

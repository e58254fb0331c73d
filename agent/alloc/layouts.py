"""How one request lies over the NUMA nodes it may use: `packed` (the fewest nodes) or `spread` (even shares).

Quality, compared in this order (docs/design.md): fewest NUMA nodes, fewest sockets, fewest L3 groups,
fewest split cores (whole cores before single threads), then best fit (take from the smallest free
group that holds the request, so large free groups stay whole for large requests).  After those:
smaller NUMA distance, lower CPU ids.  Every combination of the minimal size is ranked on cheap
bounds and the best few are allocated for real (`pool.take`) and compared on the result.  Which
layout a NUMA policy uses, and the node count it allows, is its row of `agent.alloc.policies`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from agent.alloc.index import TopologyIndex
from agent.alloc.pool import Pool, fewest, take
from agent.alloc.request import Request
from agent.errors import AllocationError

# Enumerating NUMA combinations is exact but combinatorial (70 at most on 8 nodes); past this many we
# rank a shortlist instead, to stay well under a millisecond on machines with many small nodes.
_MAX_COMBINATIONS = 128
# How many of the best-ranked NUMA combinations are allocated for real and compared on the result.
_EVALUATED = 3

# A NUMA policy's bound on the node count: raises AllocationError when `k` nodes are more than it allows.
NodeLimit = Callable[[Pool, Request, list[int], int], None]


def _outside(ix: TopologyIndex, combo: Sequence[int], request: Request) -> int:
    if request.preferred_numa is None:
        return 0
    return sum(1 for i in combo if ix.numa_ids[i] not in request.preferred_numa)


def _pair_distance(ix: TopologyIndex, combo: Sequence[int]) -> int:
    return sum(ix.distance[a][b] for a, b in itertools.combinations(combo, 2))


def _combinations(pool: Pool, nodes: list[int], k: int, need: int,
                  weight: Sequence[int]) -> list[tuple[int, ...]]:
    """k-combinations of `nodes` whose `weight` sums to at least `need`: all of them when few enough,
    else a shortlist (the k largest; the k nearest around each node; whole packages, fullest first)."""
    if math.comb(len(nodes), k) <= _MAX_COMBINATIONS:
        return [c for c in itertools.combinations(nodes, k) if sum(weight[i] for i in c) >= need]
    ix = pool.ix
    by_weight = sorted(nodes, key=lambda i: (-weight[i], i))
    shortlist = [by_weight[:k]]
    for seed in nodes:
        rest = sorted((i for i in nodes if i != seed), key=lambda i: (ix.distance[seed][i], -weight[i], i))
        shortlist.append([seed, *rest[:k - 1]])
    package_free: dict[int, int] = {}
    for i in nodes:
        p = ix.numa_packages[i] & -ix.numa_packages[i]
        package_free[p] = package_free.get(p, 0) + weight[i]
    by_package = sorted(by_weight, key=lambda i: -package_free[ix.numa_packages[i] & -ix.numa_packages[i]])
    shortlist.append(by_package[:k])
    found = {tuple(sorted(c)) for c in shortlist}
    return sorted(c for c in found if sum(weight[i] for i in c) >= need)


def _packages_spanned(ix: TopologyIndex, combo: Sequence[int]) -> int:
    """How many packages the NUMA nodes of `combo` reach into.

    Where packages hold whole NUMA nodes this is exactly the sockets an answer inside a minimal
    combination touches (it needs every node); elsewhere it ranks combinations and the answers'
    real socket counts decide among the finalists.
    """
    bits = 0
    for i in combo:
        bits |= ix.numa_packages[i]
    return bits.bit_count()


def _l3_bound(pool: Pool, combo: Sequence[int], n: int) -> int:
    """Fewest L3 groups an n-CPU answer inside `combo` can touch (ignoring the socket choice)."""
    ix = pool.ix
    if ix.l3_spans_numa:
        # L3 groups hold several NUMA nodes (or the whole machine): every node of a minimal
        # combination is needed, so every L3 group they reach is touched.
        bits = 0
        for i in combo:
            bits |= ix.numa_l3s[i]
        return bits.bit_count()
    # Each L3 group lies inside one node, so (but for broken inputs) each cell is one L3 group.
    return fewest([pool.cell_free[c] for i in combo for c in ix.numa_cells[i]], n)


def _quality(ix: TopologyIndex, mask: int) -> tuple[int, int, int]:
    """(sockets, L3 groups, split cores) of an answer."""
    sockets = sum(1 for m in ix.package_masks if m & mask)
    l3 = sum(1 for m in ix.l3_masks if m & mask)
    split = 0
    for m, size in zip(ix.core_masks, ix.core_sizes, strict=True):
        if m & mask:
            split += (m & mask).bit_count() < size
    return sockets, l3, split


def packed(pool: Pool, request: Request, allowed: list[int], limit: NodeLimit | None = None) -> int:
    """Pack the request into the fewest NUMA nodes of `allowed`, as many as `limit` lets it span."""
    ix = pool.ix
    n = request.cpus
    nodes = [i for i in allowed if pool.numa_free[i]]
    k = fewest((pool.numa_free[i] for i in nodes), n)
    if limit is not None:
        limit(pool, request, allowed, k)
    combos = _combinations(pool, nodes, k, n, pool.numa_free)

    def cheap(combo: tuple[int, ...]) -> tuple[int, int]:
        return _outside(ix, combo, request), _packages_spanned(ix, combo)

    keyed = [(cheap(c), c) for c in combos]
    best_cheap = min(key for key, _ in keyed)
    finalists = [c for key, c in keyed if key == best_cheap]
    if len(finalists) > 1:
        tpc = ix.threads_per_core

        def finer(combo: tuple[int, ...]) -> tuple[int, int, int, int, tuple[int, ...]]:
            whole = sum(pool.numa_whole[i] for i in combo)
            # Whole cores too few for the request mean split cores; a ranking hint only, the real
            # split count is measured on the answers below.
            deficit = max(0, n - whole) // tpc
            leftover = sum(pool.numa_free[i] for i in combo) - n
            return _l3_bound(pool, combo, n), deficit, _pair_distance(ix, combo), leftover, combo

        finalists.sort(key=finer)
    best_mask = 0
    best_key: tuple[int, int, int, int, int, tuple[int, ...]] | None = None
    for combo in finalists[:_EVALUATED]:
        cells = [c for i in combo for c in ix.numa_cells[i]]
        mask = take(pool, cells, n, 0)
        if len(finalists) == 1:
            return mask
        sockets, l3, split = _quality(ix, mask)
        leftover = sum(pool.numa_free[i] for i in combo) - n
        key = (sockets, l3, split, _pair_distance(ix, combo), leftover, combo)
        if best_key is None or key < best_key:
            best_key, best_mask = key, mask
    return best_mask


def spread(pool: Pool, request: Request, allowed: list[int]) -> int:
    """Balance the request over the fewest NUMA nodes that can each take an even share."""
    ix = pool.ix
    group = ix.threads_per_core if pool.full_cores else 1
    units = request.cpus // group
    caps = [f // group for f in pool.numa_free]
    nodes = [i for i in allowed if caps[i]]
    ordered = sorted((caps[i] for i in nodes), reverse=True)
    k_min = fewest(ordered, units)
    if k_min > len(nodes):
        raise AllocationError(
            f"spread: {request.cpus} CPUs do not fit in groups of {group} ({pool.describe()})")
    chosen_k = None
    for k in range(k_min, len(nodes) + 1):
        # An even share fits somewhere at this size exactly when it fits the k largest nodes.
        if ordered[k - 1] >= units // k and sum(ordered[:k]) >= units:
            chosen_k = k
            break
    even = chosen_k is not None
    k = chosen_k if chosen_k is not None else k_min
    combos = _combinations(pool, nodes, k, units, caps)
    best: tuple[tuple[int, int, int, int, int, tuple[int, ...]], list[int]] | None = None
    # Sum of squares of what stays free per node: smaller means the leftovers stay balanced.
    squares = sum(caps[i] * caps[i] for i in nodes)
    for combo in combos:
        if even and min(caps[i] for i in combo) < units // k:
            continue
        shares = _water_fill([caps[i] for i in combo], units)
        left = squares
        for i, share in zip(combo, shares, strict=True):
            left += (caps[i] - share) ** 2 - caps[i] * caps[i]
        key = (max(shares) - min(shares), _outside(ix, combo, request), _packages_spanned(ix, combo),
               _pair_distance(ix, combo), left, combo)
        if best is None or key < best[0]:
            best = (key, shares)
    if best is None:  # unreachable: the k largest nodes always qualify
        raise AllocationError(f"spread: cannot place {request.cpus} CPUs ({pool.describe()})")
    combo = best[0][-1]
    mask = 0
    for i, share in zip(combo, best[1], strict=True):
        if share:
            mask |= take(pool, list(ix.numa_cells[i]), share * group, 0)
    return mask


def _water_fill(caps: list[int], total: int) -> list[int]:
    """Split `total` over bins of capacity `caps` as evenly as the capacities allow."""
    order = sorted(range(len(caps)), key=lambda i: (caps[i], i))
    shares = [0] * len(caps)
    left = total
    for pos, i in enumerate(order):
        give = min(caps[i], left // (len(caps) - pos))
        shares[i] = give
        left -= give
    # What the floors left over goes one unit at a time to the bins with the most room.
    while left:
        spare = sorted((i for i in range(len(caps)) if caps[i] > shares[i]),
                       key=lambda i: (shares[i], -(caps[i] - shares[i]), i))
        for i in spare[:left]:
            shares[i] += 1
        left -= min(left, len(spare))
    return shares

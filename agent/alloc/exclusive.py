"""`allocate`: exclusive, topology-aligned CPUs for one request; a pure function of its inputs.

Quality, compared in this order (docs/design.md): fewest NUMA nodes, fewest sockets, fewest L3 groups,
fewest split cores (whole cores before single threads), then best fit (take from the smallest free
group that holds the request, so large free groups stay whole for large requests).  After those:
smaller NUMA distance, lower CPU ids.

The search runs top-down.  NUMA nodes: every combination of the minimal size is ranked on cheap
bounds and the best few are allocated for real and compared on the result.  Inside the chosen nodes,
packages and then L3 groups: each level chooses the fewest groups (the largest, then the best fit for
the rest, judged by what the finer levels would make of it) and hands all their cells down.  Cores
last: whole free cores first, then the remainder from the part-used core that fits it most tightly
(keeping whole cores free for later requests).  Exhaustive search on small machines finds nothing
better (tests/alloc/test_properties.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from agent.alloc.index import TopologyIndex, index_of
from agent.alloc.request import Request
from agent.errors import AllocationError
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology

# Enumerating NUMA combinations is exact but combinatorial (70 at most on 8 nodes); past this many we
# rank a shortlist instead, to stay well under a millisecond on machines with many small nodes.
_MAX_COMBINATIONS = 128
# How many of the best-ranked NUMA combinations are allocated for real and compared on the result.
_EVALUATED = 3


def allocate(topology: Topology, free: CPUSet, request: Request) -> CPUSet:
    """Choose `request.cpus` CPUs from `free` (less `request.reserved`) under the request's policies.

    Raises AllocationError naming the constraint that failed and what was free.
    """
    ix = index_of(topology)
    n = request.cpus
    full_cores = request.smt == "full-cores"
    tpc = ix.threads_per_core
    if full_cores and n % tpc:
        raise AllocationError(
            f"smt=full-cores: {n} CPUs is not a multiple of {tpc} threads per core")
    if n == 0:
        return EMPTY
    pool = _Pool(ix, free.mask & ~request.reserved.mask & ix.cpus_mask, full_cores)
    allowed = _allowed_nodes(ix, request)
    unit = "whole-core CPUs" if full_cores else "CPUs"
    total = sum(pool.numa_free[i] for i in allowed)
    if total < n:
        where = " on the preferred NUMA nodes" if len(allowed) < len(ix.numa_ids) else ""
        raise AllocationError(f"{request.numa_policy}: not enough free {unit}{where}: "
                              f"requested {n}, free {total} ({pool.describe()})")
    if request.numa_policy == "spread":
        mask = _spread(pool, request, allowed)
    else:
        mask = _packed(pool, request, allowed)
    return CPUSet.from_mask(mask)


class _Pool:
    """The CPUs one request may take, counted per core, cell and NUMA node."""

    __slots__ = ("ix", "avail", "full_cores", "core_free", "cell_free", "cell_partial", "cell_whole",
                 "numa_free", "numa_whole", "_partial")

    def __init__(self, ix: TopologyIndex, avail: int, full_cores: bool) -> None:
        self.ix = ix
        self.full_cores = full_cores
        masks, sizes = ix.core_masks, ix.core_sizes
        core_free = [(m & avail).bit_count() for m in masks]
        if full_cores:
            # A core with a used thread is not free at all when cores may not be split.
            whole = 0
            for j, f in enumerate(core_free):
                if f == sizes[j]:
                    whole |= masks[j]
                else:
                    core_free[j] = 0
            avail = whole
        self.avail = avail
        self.core_free = core_free
        self.cell_free = [sum(core_free[r.start:r.stop]) for r in ix.cell_cores]
        # CPUs in wholly free cores, and the number of part-used cores, per cell.
        self.cell_whole = [sum(sizes[j] for j in r if core_free[j] == sizes[j]) for r in ix.cell_cores]
        self.cell_partial = [sum(1 for j in r if 0 < core_free[j] < sizes[j]) for r in ix.cell_cores]
        self.numa_free = [sum(self.cell_free[c] for c in cells) for cells in ix.numa_cells]
        self.numa_whole = [sum(self.cell_whole[c] for c in cells) for cells in ix.numa_cells]
        self._partial: dict[int, list[int]] = {}

    def partial_frees(self, cells: Iterable[int]) -> list[int]:
        """Free threads of each part-used core in `cells`."""
        out: list[int] = []
        for c in cells:
            if self.cell_partial[c]:
                got = self._partial.get(c)
                if got is None:
                    sizes, free = self.ix.core_sizes, self.core_free
                    got = [free[j] for j in self.ix.cell_cores[c] if 0 < free[j] < sizes[j]]
                    self._partial[c] = got
                out.extend(got)
        return out

    def describe(self) -> str:
        """Free counts per NUMA node, for error messages."""
        unit = "whole-core CPUs" if self.full_cores else "CPUs"
        counts = ", ".join(f"{nid}={f}" for nid, f in zip(self.ix.numa_ids, self.numa_free, strict=True))
        return f"free {unit} per NUMA node: {counts}"


def _allowed_nodes(ix: TopologyIndex, request: Request) -> list[int]:
    """NUMA positions the answer may use: the preferred ones under a strict policy, else all."""
    everything = list(range(len(ix.numa_ids)))
    if request.preferred_numa is None or request.numa_policy not in ("single-numa-node", "restricted"):
        return everything
    inside = [i for i in everything if ix.numa_ids[i] in request.preferred_numa]
    if not inside:
        raise AllocationError(
            f"{request.numa_policy}: none of the preferred NUMA nodes "
            f"{sorted(request.preferred_numa)} has CPUs (NUMA nodes with CPUs: {list(ix.numa_ids)})")
    return inside


def _fewest(counts: Iterable[int], n: int) -> int:
    """How many of `counts` (largest first) it takes to reach n; one more than exist when they cannot."""
    total = 0
    k = 0
    for c in sorted(counts, reverse=True):
        if total >= n:
            break
        total += c
        k += 1
    return k if total >= n else k + 1


def _outside(ix: TopologyIndex, combo: Sequence[int], request: Request) -> int:
    if request.preferred_numa is None:
        return 0
    return sum(1 for i in combo if ix.numa_ids[i] not in request.preferred_numa)


def _pair_distance(ix: TopologyIndex, combo: Sequence[int]) -> int:
    return sum(ix.distance[a][b] for a, b in itertools.combinations(combo, 2))


def _combinations(pool: _Pool, nodes: list[int], k: int, need: int,
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


def _l3_bound(pool: _Pool, combo: Sequence[int], n: int) -> int:
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
    return _fewest([pool.cell_free[c] for i in combo for c in ix.numa_cells[i]], n)


def _l3_free(pool: _Pool, cells: Iterable[int]) -> list[int]:
    """Free CPUs per L3 group over `cells`."""
    ix = pool.ix
    per: dict[int, int] = {}
    for c in cells:
        per[ix.cell_l3[c]] = per.get(ix.cell_l3[c], 0) + pool.cell_free[c]
    return list(per.values())


def _split_estimate(pool: _Pool, cells: list[int], r: int) -> int:
    """Split cores `_pick_cores` would leave taking r CPUs from `cells` (exact for uniform cores)."""
    tpc = pool.ix.threads_per_core
    whole = sum(pool.cell_whole[c] for c in cells)
    if whole >= r:
        return 0 if r % tpc == 0 else 1
    return _fewest(pool.partial_frees(cells), r - whole)


def _quality(ix: TopologyIndex, mask: int) -> tuple[int, int, int]:
    """(sockets, L3 groups, split cores) of an answer."""
    sockets = sum(1 for m in ix.package_masks if m & mask)
    l3 = sum(1 for m in ix.l3_masks if m & mask)
    split = 0
    for m, size in zip(ix.core_masks, ix.core_sizes, strict=True):
        if m & mask:
            split += (m & mask).bit_count() < size
    return sockets, l3, split


def _packed(pool: _Pool, request: Request, allowed: list[int]) -> int:
    """Pack the request into the fewest NUMA nodes (single-numa-node, restricted, best-effort)."""
    ix = pool.ix
    n = request.cpus
    nodes = [i for i in allowed if pool.numa_free[i]]
    k = _fewest((pool.numa_free[i] for i in nodes), n)
    policy = request.numa_policy
    if policy == "single-numa-node" and k > 1:
        where = " among the preferred NUMA nodes" if request.preferred_numa is not None else ""
        raise AllocationError(
            f"single-numa-node: no NUMA node{where} has {n} free "
            f"{'whole-core CPUs' if pool.full_cores else 'CPUs'} ({pool.describe()})")
    if policy == "restricted":
        capacity = _capacity(ix, request, allowed)
        k_cap = _fewest(capacity, n)
        if k > k_cap:
            raise AllocationError(
                f"restricted: {n} CPUs fit in {k_cap} NUMA node(s) of this machine but would now "
                f"span {k} ({pool.describe()})")
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
        mask = _take(pool, cells, n, 0)
        if len(finalists) == 1:
            return mask
        sockets, l3, split = _quality(ix, mask)
        leftover = sum(pool.numa_free[i] for i in combo) - n
        key = (sockets, l3, split, _pair_distance(ix, combo), leftover, combo)
        if best_key is None or key < best_key:
            best_key, best_mask = key, mask
    return best_mask


def _capacity(ix: TopologyIndex, request: Request, allowed: list[int]) -> list[int]:
    """What each allowed NUMA node could hold for this request on an idle machine (less reserved)."""
    reserved = request.reserved.mask
    if request.smt != "full-cores":
        return [(ix.numa_masks[i] & ~reserved).bit_count() for i in allowed]
    out = []
    for i in allowed:
        total = 0
        for c in ix.numa_cells[i]:
            for j in ix.cell_cores[c]:
                if not ix.core_masks[j] & reserved:
                    total += ix.core_sizes[j]
        out.append(total)
    return out


def _spread(pool: _Pool, request: Request, allowed: list[int]) -> int:
    """Balance the request over the fewest NUMA nodes that can each take an even share."""
    ix = pool.ix
    group = ix.threads_per_core if pool.full_cores else 1
    units = request.cpus // group
    caps = [f // group for f in pool.numa_free]
    nodes = [i for i in allowed if caps[i]]
    ordered = sorted((caps[i] for i in nodes), reverse=True)
    k_min = _fewest(ordered, units)
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
            mask |= _take(pool, list(ix.numa_cells[i]), share * group, 0)
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


# Levels of `_take`: 0 groups cells by package, 1 by L3 group, 2 picks cores.
_PACKAGE, _L3, _CORES = 0, 1, 2


def _take(pool: _Pool, cells: list[int], r: int, level: int) -> int:
    """Take r CPUs from `cells`, choosing the fewest groups at this level (package, then L3 group).

    One group that holds r: the best fit.  Otherwise the largest groups, then the best fit for what
    they leave; the next level then chooses among all the chosen groups' cells, in that order, so a
    group is only drained as far as the finer levels find worthwhile.
    """
    ix = pool.ix
    if level == _CORES:
        picked = _pick_cores(pool, cells, r)
        if picked is None:
            raise AllocationError(
                f"smt=full-cores: no combination of whole free cores makes exactly {r} CPUs "
                f"({pool.describe()})")
        return picked[0]
    key_of = ix.cell_package if level == _PACKAGE else ix.cell_l3
    groups: dict[int, list[int]] = {}
    for c in cells:
        if pool.cell_free[c]:
            groups.setdefault(key_of[c], []).append(c)
    stats = [(sum(pool.cell_free[c] for c in g), sum(pool.cell_partial[c] for c in g), g)
             for g in groups.values()]
    if sum(s[0] for s in stats) == r:
        return _whole(pool, [c for s in stats for c in s[2]])

    def fit(s: tuple[int, int, list[int]], base: list[int]) -> tuple[int, int, int, int]:
        # What the finer levels will see: the already chosen cells plus this candidate's, for all r.
        union = base + s[2]
        l3 = _fewest(_l3_free(pool, union), r) if level == _PACKAGE else 0
        return l3, _split_estimate(pool, union, r), s[0], ix.cell_masks[s[2][0]]

    fitting = [s for s in stats if s[0] >= r]
    if fitting:
        best = fitting[0] if len(fitting) == 1 else min(fitting, key=lambda s: fit(s, []))
        return _take(pool, best[2], r, level + 1)
    # Largest first; among equals, the one with fewer part-used cores, then the lowest CPUs.
    stats.sort(key=lambda s: (-s[0], s[1], ix.cell_masks[s[2][0]]))
    chosen: list[int] = []
    rest = r
    while stats[0][0] < rest:
        free, _, g = stats.pop(0)
        chosen.extend(g)
        rest -= free
    fitting = [s for s in stats if s[0] >= rest]
    best = fitting[0] if len(fitting) == 1 else min(fitting, key=lambda s: fit(s, chosen))
    return _take(pool, chosen + best[2], r, level + 1)


def _whole(pool: _Pool, cells: list[int]) -> int:
    """Every free CPU of `cells`."""
    m = 0
    for c in cells:
        m |= pool.ix.cell_masks[c]
    return m & pool.avail


def _lowest(mask: int, count: int) -> int:
    """The `count` lowest set bits of mask."""
    out = 0
    for _ in range(count):
        low = mask & -mask
        out |= low
        mask ^= low
    return out


def _pick_cores(pool: _Pool, cells: list[int], r: int) -> tuple[int, int] | None:
    """(mask, split cores) taking r CPUs from `cells`: whole cores first, then the tightest part-used core.

    None when whole cores cannot make exactly r under smt=full-cores.
    """
    ix = pool.ix
    sizes, masks, core_free, avail = ix.core_sizes, ix.core_masks, pool.core_free, pool.avail
    whole: list[int] = []
    partial: list[int] = []
    for c in cells:
        for j in ix.cell_cores[c]:
            f = core_free[j]
            if f:
                (whole if f == sizes[j] else partial).append(j)
    mask = 0
    split = 0
    untouched: list[int] = []
    # Bigger cores first, so that mixed core sizes (hybrid parts) still add up exactly; otherwise
    # in the order the cells came, which is the order the caller ranked its groups.
    whole.sort(key=lambda j: -sizes[j])
    for j in whole:
        if r >= sizes[j]:
            mask |= masks[j]
            r -= sizes[j]
        else:
            untouched.append(j)
    if not r:
        return mask, split
    # The rest is smaller than a core: a part-used core that holds it (the tightest) keeps whole
    # cores whole; failing that, a slice of a whole core; failing that, several part-used cores.
    holds = [j for j in partial if core_free[j] >= r]
    if holds:
        j = min(holds, key=lambda j: (core_free[j], j))
        return mask | _lowest(masks[j] & avail, r), split + 1
    if untouched and not pool.full_cores:
        return mask | _lowest(masks[untouched[0]] & avail, r), split + 1
    for j in sorted(partial, key=lambda j: (-core_free[j], j)):
        take = min(r, core_free[j])
        mask |= _lowest(masks[j] & avail, take)
        split += 1
        r -= take
        if not r:
            return mask, split
    return None

"""`Pool`: the CPUs one request may take, and `take`, which picks them inside chosen NUMA nodes.

Inside the chosen nodes, packages and then L3 groups: each level chooses the fewest groups (the
largest, then the best fit for the rest, judged by what the finer levels would make of it) and hands
all their cells down.  Cores last: whole free cores first, then the remainder from the part-used core
that fits it most tightly (keeping whole cores free for later requests).  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.alloc.index import TopologyIndex
from agent.errors import AllocationError


class Pool:
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


def fewest(counts: Iterable[int], n: int) -> int:
    """How many of `counts` (largest first) it takes to reach n; one more than exist when they cannot."""
    total = 0
    k = 0
    for c in sorted(counts, reverse=True):
        if total >= n:
            break
        total += c
        k += 1
    return k if total >= n else k + 1


def _l3_free(pool: Pool, cells: Iterable[int]) -> list[int]:
    """Free CPUs per L3 group over `cells`."""
    ix = pool.ix
    per: dict[int, int] = {}
    for c in cells:
        per[ix.cell_l3[c]] = per.get(ix.cell_l3[c], 0) + pool.cell_free[c]
    return list(per.values())


def _split_estimate(pool: Pool, cells: list[int], r: int) -> int:
    """Split cores `_pick_cores` would leave taking r CPUs from `cells` (exact for uniform cores)."""
    tpc = pool.ix.threads_per_core
    whole = sum(pool.cell_whole[c] for c in cells)
    if whole >= r:
        return 0 if r % tpc == 0 else 1
    return fewest(pool.partial_frees(cells), r - whole)


# Levels of `take`: 0 groups cells by package, 1 by L3 group, 2 picks cores.
_PACKAGE, _L3, _CORES = 0, 1, 2


def take(pool: Pool, cells: list[int], r: int, level: int) -> int:
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
        l3 = fewest(_l3_free(pool, union), r) if level == _PACKAGE else 0
        return l3, _split_estimate(pool, union, r), s[0], ix.cell_masks[s[2][0]]

    fitting = [s for s in stats if s[0] >= r]
    if fitting:
        best = fitting[0] if len(fitting) == 1 else min(fitting, key=lambda s: fit(s, []))
        return take(pool, best[2], r, level + 1)
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
    return take(pool, chosen + best[2], r, level + 1)


def _whole(pool: Pool, cells: list[int]) -> int:
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


def _pick_cores(pool: Pool, cells: list[int], r: int) -> tuple[int, int] | None:
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

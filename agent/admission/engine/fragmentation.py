"""Shared-GPU fragmentation: how much of a node's free GPU a typical workload could not use.

FGD (USENIX ATC '23) plus topolet's terms: a price on GPU models that constrained pods need, and CPU
stranding.  Public API: `GpuMix` (a target workload compiled for scoring), `gpu_supply(nodes)`,
`cluster_cpu_per_milli(nodes)`, `fragmentation(cpu_milli, memory, gpu_free_milli, mix, model="")` (a
node state's expected fragment) and `gpu_choice(node, request, mix, models=(), supply=None,
cluster_cpu=0.0)`: None when the request does not fit, else `(score, gpu_index)`, lower is better.
Pure; `GpuMix` memoises by node state.  The measure, its terms and their effect: README.md beside this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from agent.admission.engine.model import Node, Resources

WHOLE = 1000
"""Thousandths in one GPU: a `gpu_free_milli` entry of WHOLE is a GPU nobody shares yet."""

STRANDING = 1.0
"""Weight of the stranded-GPU term; 0 gives the paper's FGD measure."""

RESERVE = 1.0
"""Weight of the price of GPU taken from a model that model-constrained pod types need; 0: none."""

_MEMO_LIMIT = 1 << 18


class GpuMix:
    """A target workload compiled for scoring: pod types grouped by their GPU demand.

    The demand is `(gpus, gpu_milli)`: whole GPUs, or one share.  Within a demand, the types differ
    only in CPU and memory, which decide whether the type fits the node at all.  `models`, parallel
    to `mix` (empty: none constrained), gives each type the GPU models it may use (None: any);
    `supply` is the cluster's GPUs per model, and `reserve` weighs the price of taking GPU from a
    model constrained types need (see `gpu_choice`).  `stranding` weighs the free GPU the node's
    free CPU cannot feed (0: FGD's measure as published); `cluster_cpu_per_milli` is the cluster's
    CPU per GPU thousandth (0: unknown), and a workload that asks more than that holds every free
    GPU to its whole CPU per GPU (`cpu_short`).
    """

    __slots__ = ("no_gpu", "total", "cpu_per_milli", "stranding", "_memo", "choices", "_groups",
                 "_by_model", "constrained", "pressure", "reserve", "supply", "all_cpu_per_milli",
                 "cluster_cpu_per_milli", "cpu_short")

    def __init__(self, mix: Sequence[tuple[Resources, float]], stranding: float = STRANDING,
                 models: Sequence[frozenset[str] | None] = (), supply: Mapping[str, int] | None = None,
                 reserve: float = RESERVE, cluster_cpu_per_milli: float = 0.0) -> None:
        if models and len(models) != len(mix):
            raise ValueError(f"{len(models)} GPU model sets for {len(mix)} pod types")
        groups: dict[tuple[int, int, frozenset[str] | None], list[tuple[int, int, float]]] = {}
        no_gpu = 0.0
        total = 0.0
        for n, (request, popularity) in enumerate(mix):
            total += popularity
            if request.gpus == 0 and request.gpu_milli == 0:
                no_gpu += popularity
                continue
            allowed = models[n] if models else None
            demand = (request.gpus, request.gpu_milli if request.gpus == 0 else 0, allowed)
            groups.setdefault(demand, []).append((request.cpu_milli, request.memory, popularity))
        self.no_gpu = no_gpu
        self.total = total
        self.stranding = stranding
        self.reserve = reserve
        self.supply = dict(supply or {})
        # per GPU model, how much of the constrained demand falls on each of its GPUs (see _pressure)
        self.pressure = _pressure(mix, models, self.supply) if models and self.supply else {}
        gpu_milli = sum(p * (r.gpus * WHOLE + r.gpu_milli) for r, p in mix)
        gpu_cpu = sum(p * r.cpu_milli for r, p in mix if r.gpus or r.gpu_milli)
        self.cpu_per_milli = gpu_cpu / gpu_milli if gpu_milli else 0.0
        # a CPU-only pod is held to the whole workload's CPU per GPU: CPU-only pods take CPU too, and
        # where CPU is short (the trace's cpu250) the node must keep more per free GPU
        cpu = sum(p * r.cpu_milli for r, p in mix)
        self.all_cpu_per_milli = cpu / gpu_milli if gpu_milli else 0.0
        self.cluster_cpu_per_milli = cluster_cpu_per_milli
        # the workload asks more CPU than the cluster has: CPU-only pods compete for every spare core,
        # so each free GPU must keep the whole workload's CPU (and `_held` adds nothing more)
        self.cpu_short = 0.0 < cluster_cpu_per_milli <= self.all_cpu_per_milli
        if self.cpu_short:
            self.cpu_per_milli = self.all_cpu_per_milli
        self._groups = groups
        # whether any type names models: else the node's model never matters (one memo entry per state)
        self.constrained = any(allowed is not None for _, _, allowed in groups)
        self._by_model: dict[str, tuple[tuple[int, int, tuple[tuple[int, int, float], ...]], ...]] = {}
        self._memo: dict[tuple[str, int, int, tuple[int, ...]], float] = {}
        # gpu_choice answers by (model, free CPU, free memory, request, per-GPU free): `gpu_choice` fills it
        self.choices: dict[tuple[object, ...], tuple[float, int | None]] = {}

    def demands(self, model: str = "") -> tuple[tuple[int, int, tuple[tuple[int, int, float], ...]], ...]:
        """Per demand `(gpus, gpu_milli)` the CPU/memory needs of the types a `model` node can host,
        with their popularity, smallest CPU first."""
        found = self._by_model.get(model)
        if found is None:
            merged: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
            for (gpus, milli, allowed), kinds in self._groups.items():
                if allowed is None or model in allowed:
                    merged.setdefault((gpus, milli), []).extend(kinds)
            found = tuple((gpus, milli, tuple(sorted(kinds)))
                          for (gpus, milli), kinds in sorted(merged.items()))
            self._by_model[model] = found
        return found

    def fragmentation(self, cpu_milli: int, memory: int, gpu_free_milli: Sequence[int],
                      model: str = "") -> float:
        """The expected fragment, in GPU thousandths, of a `model` node with this much free."""
        key = (model if self.constrained else "", cpu_milli, memory, tuple(sorted(gpu_free_milli)))
        found = self._memo.get(key)
        if found is not None:
            return found
        value = self._compute(cpu_milli, memory, key[3], key[0])
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = value
        return value

    def _compute(self, cpu_milli: int, memory: int, gpus: tuple[int, ...], model: str) -> float:
        free = sum(gpus)
        if free == 0:
            return 0.0
        whole = sum(1 for f in gpus if f >= WHOLE)
        frag = self.total * free
        for count, milli, kinds in self.demands(model):
            if count:
                if whole < count:
                    continue
                usable = whole * WHOLE
            else:
                usable = sum(f for f in gpus if f >= milli)
                if usable == 0:
                    continue
            fitting = 0.0
            for cpu, mem, popularity in kinds:
                if cpu > cpu_milli:
                    break
                if mem <= memory:
                    fitting += popularity
            # a type that fits leaves only the GPUs it cannot use as fragments
            frag -= fitting * usable
        if self.stranding and self.cpu_per_milli:
            # GPU the node's free CPU cannot feed at the workload's CPU per GPU
            frag += self.stranding * self.total * max(0.0, free - cpu_milli / self.cpu_per_milli)
        return frag


def _pressure(mix: Sequence[tuple[Resources, float]], models: Sequence[frozenset[str] | None],
              supply: Mapping[str, int]) -> dict[str, float]:
    """Per GPU model: the constrained demand that falls on it (apportioned by supply) per GPU of it,
    relative to the workload's GPU demand per GPU of the cluster."""
    total_supply = sum(supply.values())
    demand = sum(p * (r.gpus * WHOLE + r.gpu_milli) for r, p in mix)
    if not total_supply or not demand:
        return {}
    load: dict[str, float] = dict.fromkeys(supply, 0.0)
    for (r, p), allowed in zip(mix, models, strict=True):
        if allowed is None:
            continue
        there = {m: supply[m] for m in allowed if supply.get(m)}
        room = sum(there.values())
        for m, n in there.items():
            load[m] += p * (r.gpus * WHOLE + r.gpu_milli) * n / room
    return {m: (load[m] / demand) / (n / total_supply) for m, n in supply.items() if n}


def _held(gm: GpuMix, gpus: tuple[int, ...], cpu_before: int, cpu_after: int) -> float:
    """The extra stranding a CPU-only pod is charged: at the whole workload's CPU per GPU rather than
    the GPU pods' alone."""
    if not gm.stranding or not gm.cpu_per_milli:
        return 0.0
    free = sum(gpus)

    def extra(cpu: int) -> float:
        return (max(0.0, free - cpu / gm.all_cpu_per_milli) - max(0.0, free - cpu / gm.cpu_per_milli))

    return gm.stranding * gm.total * (extra(cpu_after) - extra(cpu_before))


def gpu_supply(nodes: Iterable[Node]) -> dict[str, int]:
    """The GPUs per model (`Node.gpu_model`) of `nodes`, as they have them when empty."""
    supply: dict[str, int] = {}
    for n in nodes:
        count = max(n.capacity.gpus, len(n.gpu_free_milli))
        if count:
            supply[n.gpu_model] = supply.get(n.gpu_model, 0) + count
    return supply


def cluster_cpu_per_milli(nodes: Iterable[Node]) -> float:
    """The CPU millicores per GPU thousandth of `nodes` as they are when empty (0 without GPUs)."""
    cpu = gpus = 0
    for n in nodes:
        cpu += n.capacity.cpu_milli
        gpus += max(n.capacity.gpus, len(n.gpu_free_milli))
    return cpu / (gpus * WHOLE) if gpus else 0.0


def _free_gpus(node: Node) -> tuple[int, ...]:
    if node.gpu_free_milli:
        return node.gpu_free_milli
    # a node that reports no sharing state: its free devices are whole
    return (WHOLE,) * node.free.gpus


def fits(node: Node, request: Resources) -> bool:
    """Whether the node's free CPU, memory and GPUs can take the request."""
    if request.cpu_milli > node.free.cpu_milli or request.memory > node.free.memory:
        return False
    gpus = _free_gpus(node)
    if request.gpus:
        return sum(1 for f in gpus if f >= WHOLE) >= request.gpus
    if request.gpu_milli:
        return any(f >= request.gpu_milli for f in gpus)
    return True


def fragmentation(
    cpu_milli: int, memory: int, gpu_free_milli: Sequence[int],
    mix: Sequence[tuple[Resources, float]] | GpuMix, model: str = "",
) -> float:
    """The expected fragment (GPU thousandths) of a `model` node state w.r.t. the target workload `mix`."""
    return compiled(mix).fragmentation(cpu_milli, memory, gpu_free_milli, model)


_last: tuple[Sequence[tuple[Resources, float]], Sequence[frozenset[str] | None], GpuMix] | None = None


def compiled(
    mix: Sequence[tuple[Resources, float]] | GpuMix, models: Sequence[frozenset[str] | None] = (),
    supply: Mapping[str, int] | None = None, cluster_cpu: float = 0.0,
) -> GpuMix:
    """The compiled form of `mix` (with its types' GPU `models`, the cluster's GPUs per model and its
    CPU per GPU thousandth), reused while callers pass the same mix and models objects and equal
    cluster figures."""
    global _last
    if isinstance(mix, GpuMix):
        return mix
    if (_last is not None and _last[0] is mix and _last[1] is models and _last[2].supply == (supply or {})
            and _last[2].cluster_cpu_per_milli == cluster_cpu):
        return _last[2]
    gm = GpuMix(mix, models=models, supply=supply, cluster_cpu_per_milli=cluster_cpu)
    # the engine passes one ClusterView's mix for every node: keep its compiled form and memo
    _last = (mix, models, gm)
    return gm


def taken(gpus: Sequence[int], request: Resources, index: int | None) -> tuple[int, ...]:
    """The per-GPU free thousandths after `request` takes GPU `index` (shared) or whole GPUs."""
    after = list(gpus)
    if request.gpus:
        left = request.gpus
        for i, f in enumerate(after):
            if left and f >= WHOLE:
                after[i] = 0
                left -= 1
    elif index is not None:
        after[index] -= request.gpu_milli
    return tuple(after)


def gpu_choice(
    node: Node, request: Resources, mix: Sequence[tuple[Resources, float]] | GpuMix,
    models: Sequence[frozenset[str] | None] = (), supply: Mapping[str, int] | None = None,
    cluster_cpu: float = 0.0,
) -> tuple[float, int | None] | None:
    """None when `request` does not fit `node`, else (rise in fragmentation, GPU for a shared pod).

    `models`, parallel to `mix`, are the GPU models each type may use (empty: any); the node's own is
    `node.gpu_model`; `supply` is the cluster's GPUs per model (`gpu_supply`), which prices the GPU
    taken from a model constrained types need; `cluster_cpu` is its CPU per GPU thousandth
    (`cluster_cpu_per_milli`), which tells a workload that asks more CPU than the cluster has.  With
    an empty mix the score is plain best fit: the free GPU thousandths the node keeps.
    """
    if not fits(node, request):
        return None
    gpus = _free_gpus(node)
    gm = compiled(mix, models, supply, cluster_cpu)
    if not gm.total:
        if request.gpu_milli and not request.gpus:
            index = min((f, i) for i, f in enumerate(gpus) if f >= request.gpu_milli)[1]
            return float(sum(gpus) - request.gpu_milli), index
        return float(sum(gpus) - request.gpus * WHOLE), None
    model = node.gpu_model if gm.constrained else ""
    key = (model, node.free.cpu_milli, node.free.memory, request.cpu_milli, request.memory, request.gpus,
           request.gpu_milli, *gpus)
    found = gm.choices.get(key)
    if found is None:
        found = _choose(gm, model, node.free.cpu_milli, node.free.memory, gpus, request)
        if len(gm.choices) >= _MEMO_LIMIT:
            gm.choices.clear()
        gm.choices[key] = found
    return found


def _choose(
    gm: GpuMix, model: str, cpu_free: int, mem_free: int, gpus: tuple[int, ...], request: Resources
) -> tuple[float, int | None]:
    cpu = cpu_free - request.cpu_milli
    mem = mem_free - request.memory
    # the GPU taken from a model that constrained pods need is GPU they cannot have later
    before = gm.fragmentation(cpu_free, mem_free, gpus, model) - gm.reserve * gm.total * (
        request.gpus * WHOLE + request.gpu_milli) * gm.pressure.get(model, 0.0)
    if not request.gpus and not request.gpu_milli:
        return gm.fragmentation(cpu, mem, gpus, model) - before + _held(gm, gpus, cpu_free, cpu), None
    if request.gpus:
        return gm.fragmentation(cpu, mem, taken(gpus, request, None), model) - before, None
    best: tuple[float, int, int] | None = None
    tried: set[int] = set()
    for i, f in enumerate(gpus):
        if f < request.gpu_milli or f in tried:
            continue
        # GPUs with the same free amount give the same state: score one of them
        tried.add(f)
        rise = gm.fragmentation(cpu, mem, taken(gpus, request, i), model) - before
        candidate = (rise, f, i)
        if best is None or candidate < best:
            best = candidate
    assert best is not None
    return best[0], best[2]

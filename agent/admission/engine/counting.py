"""How many pods of one kind the cluster has room for, counted zone by zone: a gang of identical pods
that asks for more is refused without a search.

Pure: no I/O.  `countable(gang) -> PodSet | None`, `room(work, ps, enough=None) -> int`,
`short(work, ps) -> str | None`.

A gang of one pod set of identical pods asking CPU and memory only (no GPUs, devices, hugepages, no
colocation, one container or the pod scope) fits a node exactly as many times as the least of its free
pod count, its totals over the pod's requests, and, where the pod's NUMA policy takes one zone, the sum
over its zones of each zone's own count: the zones are independent and the pods identical, so any
order of placing them reaches that count and no search can beat it.  Summed over the nodes that may
take the pod set (taints, selectors, affinity), that is exact: a gang asking for more is refused at
once, where the search placed every pod it could and then backtracked through them (seconds for a gang
of hundreds of pods, for each waiting gang on each pass that re-decides it).  The refusal's text keeps
the search's shape: the first pod that finds no room, and what it needed.
"""

from __future__ import annotations

from agent.admission.engine.candidates import Work
from agent.admission.engine.model import Gang, PodSet
from agent.admission.engine.policies import engine_policy
from agent.admission.engine.refusals import bytes_text, cpus


def countable(gang: Gang) -> PodSet | None:
    """The gang's one pod set when `room` is exact for it (see the module docstring), else None."""
    if len(gang.pod_sets) != 1:
        return None
    (ps,) = gang.pod_sets
    r = ps.requests
    if (ps.colocate_label is not None or len(ps.containers) > 1 or r.gpus or r.gpu_milli or r.hugepages
            or r.mig or r.devices or r.cpu_milli <= 0):
        return None
    return ps


def room(work: Work, ps: PodSet, enough: int | None = None) -> int:
    """Pods of `ps` (a `countable` pod set) the index's nodes have room for, on the nodes that may take
    it; counting stops once it reaches `enough` (a gang that fits is told so after the first nodes that
    hold it, not after all of them)."""
    cpu, mem = ps.requests.cpu_milli, ps.requests.memory
    total = 0
    for i, node in enumerate(work.ix.nodes):
        if not work.filter(ps, i)[0]:
            continue
        s = work.state(i)
        fits = min(s.pods, s.cpu // cpu, s.mem // mem if mem > 0 else s.pods)
        if fits <= 0:
            continue
        row = engine_policy(ps.policy_on(node))
        if row.zoned and ps.cpu_aligned:
            if not row.one_zone:
                return -1  # restricted: a pod may take several zones; not counted here
            zones = sum(min(c // cpu, m // mem if mem > 0 else c // cpu) for c, m in zip(s.zcpu, s.zmem,
                                                                                         strict=True))
            fits = min(fits, zones)
        total += fits
        if enough is not None and total >= enough:
            return total
    return total


def short(work: Work, ps: PodSet) -> str | None:
    """Why the index has room for some pods of the `countable` pod set `ps` but not all, or None when it
    has room for all, or none (the search's first pod finds at once, and `explain` says, which taint,
    selector, zone or total keeps it out), or the count does not apply."""
    have = room(work, ps, ps.count)
    if have <= 0 or have >= ps.count:
        return None
    zoned = ps.cpu_aligned and any(engine_policy(ps.policy_on(node)).one_zone for node in work.ix.nodes)
    where = " in one NUMA zone" if zoned else " on one node"
    mem = ps.requests.memory
    each = cpus(ps.requests.cpu_milli) + (f" and {bytes_text(mem)}" if mem else "")
    return (f'pod set "{ps.name}" (pod {have + 1} of {ps.count}): pod needs {cpus(ps.requests.cpu_milli)}'
            f"{where}; the free {'zones' if zoned else 'nodes'} hold {have} pods of {each}")

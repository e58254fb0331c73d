"""The placement engine: `place(view, gang) -> Placement | Refusal`, a pure function.

- `place(view, gang)`: every pod of every pod set of `gang` on a node (and, by NUMA policy, a zone) of
  `view`, or a refusal naming the binding constraint ("never" when the gang does not fit `view.empty`
  either, else "not-now").  No I/O, no clock, no randomness: the same view and gang give the same answer.
- `commit(view, gang, placement) -> ClusterView`: `view` less the placed pods, exactly as `place` counted.

Call both from one thread: the index they search is cached per process, per view object.  The rules
per pod and NUMA policy, the score and how the parts stack: README.md beside this module.
"""

from __future__ import annotations

from dataclasses import replace

from agent.admission.engine.candidates import Work
from agent.admission.engine.choice import Choice
from agent.admission.engine.counting import countable, room, short
from agent.admission.engine.model import ClusterView, Gang, Node, Placement, PodPlacement, PodSet, Refusal
from agent.admission.engine.policies import engine_policy
from agent.admission.engine.search import attempt
from agent.admission.engine.viewindex import WHOLE_GPU, carry, index_of


def place(view: ClusterView, gang: Gang) -> Placement | Refusal:
    """Place every pod of `gang` on `view`, all or nothing; a Refusal names the binding constraint."""
    bad = _invalid(gang)
    if bad:
        return Refusal(gang.key, "never", bad)
    ix = index_of(view, view.nodes)
    counted = countable(gang)
    if counted is not None:  # more identical pods than there is room for: no search (`counting`)
        why_short = short(Work(ix, view.gpu_mix, view.gpu_mix_models), counted)
        if why_short is not None:
            if not view.empty:
                return Refusal(gang.key, "not-now", why_short)
            empty = index_of(view.empty, view.empty)
            empty_room = room(Work(empty, view.gpu_mix, view.gpu_mix_models), counted, counted.count)
            if empty_room >= counted.count:
                return Refusal(gang.key, "not-now", why_short)  # exact: it fits the empty cluster
    found, why = attempt(ix, view.gpu_mix, gang, view.gpu_mix_models)
    if found is not None:
        pods = sorted(
            (PodPlacement(pod_set=ps.name, index=k, node=ix.nodes[c.node].name,
                          zone=(ix.nodes[c.node].zones[c.zones[0]].numa
                                if _pod_zone(ps, c) is not None else None),
                          gpu_index=c.gpu_index,
                          zones=tuple(ix.nodes[c.node].zones[p].numa for p in c.containers))
             for ps, k, c in found),
            key=lambda p: (p.pod_set, p.index))
        return Placement(gang.key, tuple(pods), round(sum(c.cost for _, _, c in found), 6))
    if not view.empty:
        return Refusal(gang.key, "not-now", why)
    empty = index_of(view.empty, view.empty)
    never, why_never = attempt(empty, view.gpu_mix, gang, view.gpu_mix_models)
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
    ix = index_of(view, view.nodes)
    by_name = ix.by_name
    sets = {ps.name: ps for ps in gang.pod_sets}
    work = Work(ix, view.gpu_mix, view.gpu_mix_models)
    for pod in placement.pods:
        ps = sets[pod.pod_set]
        i = by_name[pod.node]
        node = ix.nodes[i]
        c = _recount(work, ps, i, node, pod)
        work.take(ps, c)
    changed = {i: s.to_node(ix.nodes[i]) for i, s in work.touched.items()}
    nodes = list(ix.nodes)
    for i, node in changed.items():
        nodes[i] = node
    new = replace(view, nodes=tuple(nodes))
    # carry the index over, so the next decision of a pass does not build it again
    carry(view, new, ix, changed)
    return new


def _recount(work: Work, ps: PodSet, i: int, node: Node, pod: PodPlacement) -> Choice:
    """The choice `place` made for `pod`, rebuilt from its placement record."""
    s = work.state(i)
    r = work.zoned(ps)
    if pod.zone is not None:
        p = next(k for k, z in enumerate(node.zones) if z.numa == pod.zone)
        return Choice((), i, (p,), (r.cpu_milli,), pod.gpu_index, 0.0)
    if pod.zones and len(pod.zones) == len(ps.containers):  # split by the container scope
        position = {z.numa: k for k, z in enumerate(node.zones)}
        per: dict[int, int] = {}
        for numa, cpu in zip(pod.zones, ps.containers, strict=True):
            per[position[numa]] = per.get(position[numa], 0) + cpu
        zones = tuple(sorted(per))
        return Choice((), i, zones, tuple(per[p] for p in zones), pod.gpu_index, 0.0,
                      tuple(position[numa] for numa in pod.zones))
    row = engine_policy(ps.policy_on(node))
    if row.recount_zones and node.zones:
        again = row.options(work, ps, i, s, 0, (0.0, pod.gpu_index))
        if again:
            return again[0]
    return Choice((), i, (), (), pod.gpu_index, 0.0)


def _pod_zone(ps: PodSet, c: Choice) -> int | None:
    if len(c.zones) != 1:
        return None
    return c.zones[0]

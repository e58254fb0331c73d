"""The search: every pod of a gang on the index, all or nothing, with the first failure when it fails.

Public API: `attempt(index, mix, gang, models) -> (placed, "") | (None, why)`: `placed` lists each pod
as (pod set, index in the set, `choice.Choice`); `why` names the first pod that found no place and the
binding constraint (`refusals.explain`).  Greedy largest first, then bounded backtracking, a one-node
shortcut and colocation domains: README.md beside this module.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from agent.admission.engine.candidates import WINDOW, Work
from agent.admission.engine.choice import Choice
from agent.admission.engine.model import NODE_POLICY, Gang, PodSet, Resources
from agent.admission.engine.policies import engine_policy
from agent.admission.engine.refusals import cpus, explain
from agent.admission.engine.viewindex import WHOLE_GPU, Index, NodeState

# Bounded backtracking: each pod tries this many of its best candidates, within this many steps a
# pod and at most _MAX_STEPS in all (a step costs about 0.1 ms: one decision stays near a second
# however many pods the gang has).
_BRANCH = 3
_STEPS_PER_POD = 48
_MAX_STEPS = 10_000
# Colocation: domains (label values) are tried least free first, until this many placed the gang
# (the best-scored of them wins) or this many combinations were tried.
_DOMAIN_PLACEMENTS = 4
_MAX_DOMAIN_COMBOS = 64


_Slot = tuple[PodSet, int, tuple[int, ...] | None]  # pod set, index, allowed nodes (None: all)


def _broken(choices: Sequence[Choice]) -> int:
    """How many whole zones zone choices (`candidates.Work._zone_choice`) break: their key's third field."""
    return sum(c.key[2] for c in choices)


def _one_node(work: Work, slots: Sequence[_Slot], greedy: list[Choice]) -> list[Choice] | None:
    """The gang on one node, when a node among the first pod's best places holds all of it and
    breaks no more whole zones than the greedy placement `greedy` (None otherwise).

    Pods of one gang talk to each other, and a gang on one node needs no per-pod pin: its Job's pod
    template carries the node (`agent.admission.jobs.patches.one_node_template`).  Only gangs of
    zone-aligned pods with no GPU and no colocation label (those have their own domain search)."""
    if len({c.node for c in greedy}) == 1:
        return None
    for ps, _, allowed in slots:
        if allowed is not None or not engine_policy(ps.numa_policy).one_zone or work.mix \
                or ps.requests.gpus or ps.requests.gpu_milli:
            return None
    limit = _broken(greedy)
    ps0 = slots[0][0]
    tried: set[int] = set()
    work.touched.clear()
    for first in work.candidates(ps0, None, WINDOW):
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


def _search(work: Work, slots: Sequence[_Slot]) -> tuple[list[Choice] | None, str]:
    """Greedy over `slots`, then bounded backtracking; (choices, "") or (None, the first failure).

    A greedy placement over several nodes is replaced by one on a single node where `_one_node`
    finds one as good for the cluster's whole zones."""
    chosen: list[Choice] = []
    failure = ""
    for ps, index, allowed in slots:
        options = work.candidates(ps, allowed, 1)
        if not options:
            failure = _prefix(ps, index) + explain(work, ps, allowed)
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
    path = _backtrack(work, slots)
    return (path, "") if path is not None else (None, failure)


def _backtrack(work: Work, slots: Sequence[_Slot]) -> list[Choice] | None:
    """Depth-first over each pod's `_BRANCH` best candidates, within `_STEPS_PER_POD` steps a pod
    and `_MAX_STEPS` in all.

    A loop over an explicit stack, not recursion: a gang may hold thousands of pods, one level each."""
    budget = min(_STEPS_PER_POD * len(slots), _MAX_STEPS)
    path: list[Choice] = []
    levels: list[tuple[Iterator[Choice], dict[int, NodeState]]] = []  # options left, state on entry
    while len(path) < len(slots):
        budget -= 1
        if budget < 0:
            return None
        ps, _, allowed = slots[len(path)]
        saved = dict(work.touched)
        levels.append((iter(work.candidates(ps, allowed, _BRANCH)), saved))
        while True:
            choice = next(levels[-1][0], None)
            if choice is not None:
                work.take(slots[len(levels) - 1][0], choice)
                path.append(choice)
                break
            levels.pop()  # no option left on this level: undo the one taken on the level above
            if not levels:
                return None
            path.pop()
            work.touched = dict(levels[-1][1])
    return path


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


def _size(ps: PodSet) -> tuple[int, ...]:
    r = ps.requests
    return (r.gpus * WHOLE_GPU + r.gpu_milli, r.cpu_milli, r.memory, ps.count)


_Domains = list[tuple[str, tuple[int, ...]]]  # (label value, its nodes in order)


def _domain_choices(ix: Index, gang: Gang) -> tuple[list[str], list[_Domains], str]:
    """Per colocation label, the values whose nodes could hold that label's pods, most promising
    (least free, best fit) first; and why none could when a label has no such value."""
    labels = sorted({ps.colocate_label for ps in gang.pod_sets if ps.colocate_label})
    per_label: list[_Domains] = []
    for label in labels:
        sets = [ps for ps in gang.pod_sets if ps.colocate_label == label]
        need_cpu = sum(ps.count * ps.requests.cpu_milli for ps in sets)
        need_pods = sum(ps.count for ps in sets)
        # the largest part one zone must hold (a container, where the container scope may split)
        zoned = [max(ps.containers) if ps.containers else ps.requests.cpu_milli for ps in sets
                 if engine_policy(ps.numa_policy).one_zone and ps.cpu_aligned]
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
            return labels, [], (f"no {label} domain holds the whole gang: it needs {cpus(need_cpu)} and "
                                f"{need_pods} pods; the most free is {label}={most[1]} with {cpus(most[0])}")
        ranked.sort()
        per_label.append([(value, members) for _, value, members in ranked])
    return labels, per_label, ""


def _node_policy_resolved(ix: Index, gang: Gang) -> Gang:
    """`gang` with its NODE_POLICY pod sets given the nodes' policy when every node reports the same
    one, so they take the same paths (zones bisected, one node) as pod sets that name it."""
    if len(ix.policies) != 1 or all(ps.numa_policy != NODE_POLICY for ps in gang.pod_sets):
        return gang
    (policy,) = ix.policies
    return replace(gang, pod_sets=tuple(replace(ps, numa_policy=policy) if ps.numa_policy == NODE_POLICY
                                        else ps for ps in gang.pod_sets))


def attempt(ix: Index, mix: tuple[tuple[Resources, float], ...], gang: Gang,
             models: tuple[frozenset[str] | None, ...] = (),
             ) -> tuple[list[tuple[PodSet, int, Choice]] | None, str]:
    gang = _node_policy_resolved(ix, gang)
    labels, per_label, why_none = _domain_choices(ix, gang)
    if why_none:
        return None, why_none
    if not labels:
        work = Work(ix, mix, models)
        slots = _slots(gang, {})
        found, why = _search(work, slots)
        if found is None:
            return None, why
        return [(s[0], s[1], c) for s, c in zip(slots, found, strict=True)], ""
    best: tuple[float, list[tuple[PodSet, int, Choice]]] | None = None
    first_why = ""
    tried = placed = 0
    for combo in itertools.product(*per_label):
        if tried >= _MAX_DOMAIN_COMBOS or placed >= _DOMAIN_PLACEMENTS:
            break
        tried += 1
        domains = {lab: nodes for lab, (_, nodes) in zip(labels, combo, strict=True)}
        work = Work(ix, mix, models)
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


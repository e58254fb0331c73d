"""Refusal texts: the one constraint that stops one more pod of a pod set, said in one line.

Public API: `explain(work, pod_set, allowed) -> str`, the binding constraint on the nodes `allowed`
(None: all) as `work` sees them (the order of the checks and the texts: README.md beside this module);
`cpus(millicores) -> str`, a CPU amount as these texts write it ("1 CPU", "16 CPUs", "0.5 CPUs"),
`bytes_text(n) -> str`, a byte amount ("64Mi", "1.5Gi").
This is the slow path of a refusal: it runs only once the search has found no place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent.admission.engine.candidates import Work
from agent.admission.engine.filters import filter_reason
from agent.admission.engine.model import PodSet
from agent.admission.engine.policies import engine_policy
from agent.admission.engine.viewindex import WHOLE_GPU, NodeState, node_holds


def cpus(milli: int) -> str:
    if milli % 1000 == 0:
        n = milli // 1000
        return f"{n} CPU" if n == 1 else f"{n} CPUs"
    return f"{milli / 1000:g} CPUs"


def bytes_text(n: int) -> str:
    for suffix, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift and n % (1 << (shift - 10 if shift > 10 else 0)) == 0:
            return f"{n / (1 << shift):g}{suffix}"
    return f"{n} bytes"


def _node_map(key: str, attr: str) -> Callable[[NodeState], int]:
    def get(s: NodeState) -> int:
        found: Mapping[str, int] = getattr(s, attr)
        return found.get(key, 0)
    return get


def _zone_map(key: str, attr: str) -> Callable[[NodeState, int], int]:
    def get(s: NodeState, p: int) -> int:
        found: list[Mapping[str, int]] = getattr(s, attr)
        return found[p].get(key, 0)
    return get


def explain(work: Work, ps: PodSet, allowed: tuple[int, ...] | None) -> str:
    """The constraint that stops one more pod of `ps`, in one line (the slow path of a refusal)."""
    r = ps.requests
    pool = range(len(work.ix.nodes)) if allowed is None else allowed
    names = work.ix.nodes
    excluded: dict[str, int] = {}
    live: list[int] = []
    for i in pool:
        why = filter_reason(names[i], ps)
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
    checks: list[tuple[str, Callable[[NodeState], int], int, Callable[[int], str]]] = [
        ("", lambda s: s.cpu, r.cpu_milli, cpus),
        (" memory", lambda s: s.mem, r.memory, bytes_text),
        (" whole GPUs", lambda s: s.whole_gpus(), r.gpus, str),
        (" of one GPU", lambda s: max(s.gfree, default=0), r.gpu_milli,
         lambda v: f"{v / WHOLE_GPU:g}"),
    ]
    checks += [(f" {k}", _node_map(k, "hp"), v, bytes_text) for k, v in sorted(r.hugepages.items())]
    checks += [(f" {k}", _node_map(k, "mig"), v, str) for k, v in sorted(r.mig.items())]
    checks += [(f" {k}", _node_map(k, "dev"), v, str) for k, v in sorted(r.devices.items())]
    for what, get, want, fmt in checks:
        if want <= 0:
            continue
        have, at = max((get(work.state(i)), -i) for i in live)
        if have < want:
            return (f"pod needs {fmt(want)}{what} on one node; most free on a node is {fmt(have)} "
                    f"(node {names[-at].name})")
    live = [i for i in live if node_holds(work.state(i), r)]
    if not live:
        return "no node holds the pod's CPU, memory and devices together"
    rows = [engine_policy(ps.policy_on(names[i])) for i in live]
    if all(row.zoned for row in rows):
        r = work.zoned(ps)  # without CPU and memory where those are not aligned
        zone_checks: list[tuple[str, Callable[[NodeState, int], int], int, Callable[[int], str]]] = [
            ("", lambda s, p: s.zcpu[p], r.cpu_milli, cpus),
            (" memory", lambda s, p: s.zmem[p], r.memory, bytes_text),
            (" whole GPUs", lambda s, p: s.zgpus[p], r.gpus, str),
        ]
        zone_checks += [(f" {k}", _zone_map(k, "zhp"), v, bytes_text)
                        for k, v in sorted(r.hugepages.items())]
        zone_checks += [(f" {k}", _zone_map(k, "zmig"), v, str)
                        for k, v in sorted(r.mig.items())]
        single = all(row.one_zone for row in rows)
        where = "in one NUMA zone" if single else "in the fewest NUMA zones an empty node needs"
        splitting = [i for i in live if work.splits(ps, i)]
        if single and splitting:
            # Container scope: each container needs one zone, not the pod (`engine.scope`).
            where = "in one NUMA zone, nor container by container"
            zone_checks = [] if len(splitting) < len(live) else [
                ("", lambda s, p: s.zcpu[p], max(ps.containers), cpus)]
        for what, zget, want, fmt in zone_checks:
            if want <= 0 or not single:
                continue
            have, at = max((zget(work.state(i), p), -i) for i in live
                           for p in range(len(work.state(i).zcpu)))
            if have < want:
                who = "a container" if splitting else "pod"
                return (f"{who} needs {fmt(want)}{what} in one NUMA zone; largest free zone has "
                        f"{fmt(have)} (node {names[-at].name})")
        if not any(work.options(ps, i) for i in live):
            return f"no node holds the pod's CPU, memory and devices together {where}"
    if r.gpus or r.gpu_milli:
        return "no node's GPUs can take the pod without exceeding what is free"
    return "no node holds it"


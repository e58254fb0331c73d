"""What the pinner knows of the node's cgroups beyond a container's own path.

`NodeCgroups`: the kubelet's cgroup driver and whether the agent sits at its cgroup namespace's
root, read once at start.  Planned cgroups: the name an allocation made before its container exists
carries (the pod-cgroup route's), below the pod's cgroup where no runtime makes one.  `find_own`: the
agent's own container among the pool's cgroups, which the kernel may keep from our writes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from agent.api.podplan import PodPlan
from agent.enforce import CgroupDriver, CgroupLayout, exists
from agent.enforce.cgroup import at_own_namespace_root, read_procs
from agent.enforce.kubepods import pod_cgroup_path
from agent.errors import EnforcementError

log = logging.getLogger("topolet.kube")

PLANNED_PREFIX = "topolet-planned-"  # no runtime names a container's cgroup so


def planned_cgroup(plan: PodPlan, container: str, driver: CgroupDriver | None) -> str:
    """The cgroup an allocation made before its container exists names: below the pod's cgroup,
    where no runtime makes one (the pod-cgroup route's; the engine counts it absent)."""
    pod = pod_cgroup_path(plan.uid, plan.qos, driver or CgroupDriver.CGROUPFS)
    return f"{pod}/{PLANNED_PREFIX}{container}"


def is_planned(cgroup: str) -> bool:
    """Whether `cgroup` is a planned one (`planned_cgroup`)."""
    return cgroup.rsplit("/", 1)[-1].startswith(PLANNED_PREFIX)


@dataclass(frozen=True)
class NodeCgroups:
    """What the pinner knows of the node's cgroups from the start: the kubelet's cgroup driver where
    its kubepods folder exists already (else found per pod), and whether this agent sits at the root
    of its cgroup v2 namespace."""

    driver: CgroupDriver | None
    at_namespace_root: bool

    @classmethod
    def read(cls, layout: CgroupLayout) -> NodeCgroups:
        if exists(layout, "kubepods.slice"):
            driver: CgroupDriver | None = CgroupDriver.SYSTEMD
        elif exists(layout, "kubepods"):
            driver = CgroupDriver.CGROUPFS
        else:
            driver = None
        return cls(driver, at_own_namespace_root())


def find_own(layout: CgroupLayout, candidates: frozenset[str], not_own: set[str]) -> str | None:
    """The agent's own container cgroup among `candidates`, found by our pid in its cgroup.procs (the
    kernel shows other containers' processes as 0 to a reader in its own pid namespace).

    In a private cgroup namespace on v2 (the DaemonSet's pod under containerd) that cgroup is the
    namespace's root, whose files nsdelegate keeps from the processes inside: every pool write there
    would fail the whole pass, so the agent's own container keeps the CPUs its runtime gave it.
    `not_own` (updated here) remembers the cgroups looked at that do not hold the agent: our process
    never moves, so they need no second look.
    """
    me = os.getpid()
    for rel in sorted(candidates - not_own):
        try:
            found = me in read_procs(layout, rel)
        except EnforcementError:
            continue  # gone meanwhile
        if not found:
            not_own.add(rel)
        else:
            log.info("leaving %s on its own CPUs: the agent's container, whose cpuset the kernel "
                     "keeps from it (cgroup namespace root under nsdelegate)", rel)
            return rel
    return None

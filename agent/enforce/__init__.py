"""Enforcement: write the cpusets it is told to, in an order the kernel accepts, and record them.

`agent.enforce` never decides (allocation policy lives in `agent.alloc`).  Cgroup paths are relative
to the cpuset controller's root ("topolet/job1"); errors are `EnforcementError(message, path)` and
`StateError`.  Entry points: `cgroup.detect_layout`, `apply.apply_assignment` /
`apply_with_shared_pool`, `kubepods` (the one pod -> cgroup mapping), `podcgroups.PodCgroupWatcher`,
`state_file.StateFile`.  The rule: commit the state BEFORE applying the cgroup change it describes.
Module list, write ordering and the state protocol: agent/enforce/README.md.
"""

from agent.api.qos import QOSClass
from agent.enforce.apply import (
    CgroupWrite,
    Drift,
    apply_assignment,
    apply_with_shared_pool,
    find_drift,
    repair_drift,
    shared_pool,
)
from agent.enforce.cgroup import (
    CgroupLayout,
    create_cgroup,
    detect_layout,
    exists,
    list_children,
    move_pid,
    read_cpus,
    read_cpuset,
    read_mems,
    read_partition,
    read_procs,
    remove_cgroup,
    write_cpuset,
)
from agent.enforce.kubepods import CgroupDriver, Runtime, container_cgroup_path, pod_cgroup_path
from agent.enforce.state import Allocation, Owner, State
from agent.enforce.state_file import StateFile
from agent.enforce.state_live import rebuild_from_cgroups

__all__ = [
    "Allocation",
    "CgroupDriver",
    "CgroupLayout",
    "CgroupWrite",
    "Drift",
    "Owner",
    "QOSClass",
    "Runtime",
    "State",
    "StateFile",
    "apply_assignment",
    "apply_with_shared_pool",
    "container_cgroup_path",
    "create_cgroup",
    "detect_layout",
    "exists",
    "find_drift",
    "list_children",
    "move_pid",
    "pod_cgroup_path",
    "read_cpus",
    "read_cpuset",
    "read_mems",
    "read_partition",
    "read_procs",
    "rebuild_from_cgroups",
    "remove_cgroup",
    "repair_drift",
    "shared_pool",
    "write_cpuset",
]

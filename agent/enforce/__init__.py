"""Enforcement: write the cpusets it is told to, in an order the kernel accepts, and record them.

`agent.enforce` never decides (allocation policy lives in `agent.alloc`).  Cgroup paths are relative
to the cpuset controller's root ("topolet/job1"); errors are `EnforcementError(message, path)` and
`StateError`.

Public API
----------
Layout (`agent.enforce.cgroup`):
    detect_layout(root=None, parent="topolet") -> CgroupLayout   v1 cpuset mount or v2 with cpuset
    CgroupLayout.abspath(rel), .workload_path(name, shared=False), .shared_path
Workload cgroups:
    create_cgroup(layout, rel, cpus=None, mems=None) -> rel       missing ancestors too; v1 seeds mems
    remove_cgroup(layout, rel, move_procs_to=None) -> bool
    move_pid(layout, rel, pid)                                    writes cgroup.procs
    read_cpuset(layout, rel, effective=False) -> (cpus, mems); read_cpus; read_mems
    read_procs(layout, rel) -> [pid]; list_children(layout, rel) -> [rel]; exists(layout, rel)
    read_partition(layout, rel) -> "member" | "root" | "isolated" | "root invalid (...)"   (v2)
    write_cpuset(layout, rel, cpus, mems=None)                    one cgroup, unordered
Ordered changes (`agent.enforce.apply`):
    apply_assignment(layout, cpus={rel: CPUSet}, mems=None, remove=()) -> [CgroupWrite]
        (v2: refuses cpus a sibling partition root holds, before any write)
    shared_pool(allowed, reserved, exclusive) -> CPUSet
    apply_with_shared_pool(layout, allowed=, reserved=, exclusive={rel: CPUSet}, shared=[rel], ...)
    find_drift(layout, cpus, mems=None) -> Drift; repair_drift(layout, cpus, mems=None, *, new=()) -> int
        (`new`: cgroups just created, written but not counted as drift)
Kubernetes (`agent.enforce.kubepods`): the one pod -> cgroup mapping
    container_cgroup_path(pod_uid, qos, container_id, runtime, driver) -> rel; pod_cgroup_path(...)
    qos_cgroup_path(qos, driver) -> rel; pod_uid_of_cgroup(name, qos, driver) -> uid | None
Pod cgroups written as the kubelet makes them (`agent.enforce.podcgroups`, over `agent.enforce.inotify`):
    PodCgroupWatcher(layout, driver, pod_cpuset, shared_pool): .start(), .stop(), .write_pod(uid),
        .keep_shared(), .shared_targets(), .pods(), .undone
State: commit the state BEFORE applying the cgroup change it describes
    StateFile(folder, on_write=None): .lock(timeout=None), .load(missing_ok=False), .commit(state),
        .load_or_rebuild(rebuild_fn), .writes                    (`agent.enforce.state_file`)
    State(allocations, reserved, generation): .with_allocation(a), .without(id), .get(id), .allocated()
    Allocation(id, cpus, mems, cgroup, owner, policy, created_at); Owner.of_process(pid), .process_alive()
                                                                  (`agent.enforce.state`)
    rebuild_from_cgroups(layout, reserved=EMPTY) -> State         (`agent.enforce.state_live`)
    the file's bytes: encode(state), decode(data)                 (`agent.enforce.state_codec`)
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

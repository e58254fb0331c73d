"""Pod containers pinned in the cgroups a kubelet and containerd make, with both cgroup drivers, live.

The trees are laid out from the runtimes' naming written out here by hand (not through
`agent.enforce.kubepods`), under a kubelet `--cgroup-root` unique to the test so parallel runs and a
real kubelet on the same machine are left alone.  On cgroup v2 (the guest of tests/vm) the
container cgroups are left with an empty `cpuset.cpus`, as runc leaves them, and every level
enables cpuset for its children, as the kubelet and runc do.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from agent.enforce.apply import apply_with_shared_pool
from agent.enforce.cgroup import CgroupLayout, create_cgroup, exists, move_pid, read_cpus
from agent.enforce.kubepods import container_cgroup_path
from agent.topology.cpuset import CPUSet
from tests.enforce.conftest import _remove_tree, proc_status

Spawn = Callable[[], "subprocess.Popen[bytes]"]


def _runtime_paths(driver: str, root: str, uid: str, cid: str, qos: str) -> str:
    """Where kubelet + containerd put a container: the runtimes' naming, spelled out."""
    if driver == "cgroupfs":
        return "/".join([root, "kubepods", *([qos] if qos else []), f"pod{uid}", cid])
    u = uid.replace("-", "_")
    slices = [f"{root}.slice", f"{root}-kubepods.slice"]
    if qos:
        slices.append(f"{root}-kubepods-{qos}.slice")
    slices.append(f"{root}-kubepods-{qos + '-' if qos else ''}pod{u}.slice")
    return "/".join([*slices, f"cri-containerd-{cid}.scope"])


@pytest.fixture
def kube_root(cpuset_root: CgroupLayout) -> Iterator[str]:
    """A kubelet cgroup root component of this test's own; its trees are removed afterwards."""
    root = f"tt{os.getpid()}x{uuid.uuid4().hex[:8]}"
    yield root
    for top in (root, f"{root}.slice"):
        _remove_tree(cpuset_root, top)


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_containers_are_pinned_in_the_runtimes_cgroups(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn, kube_root: str, driver: str
) -> None:
    layout = cpuset_root
    a, b = two_cpus
    allowed = CPUSet([a, b])
    guaranteed = (str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex)
    burstable = (str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex)
    made = {}
    for (uid, cid), qos in ((guaranteed, ""), (burstable, "burstable")):
        rel = _runtime_paths(driver, kube_root, uid, cid, qos)
        # runc on v1 copies the parent's cpus into a new container; on v2 it leaves them empty.
        everything = read_cpus(layout, "", effective=True)
        create_cgroup(layout, rel, cpus=None if layout.version == 2 else everything)
        assert rel == container_cgroup_path(uid, qos or "guaranteed", f"containerd://{cid}", None, driver,
                                             kubelet_root=(kube_root,))
        assert exists(layout, rel)
        p = spawn()
        move_pid(layout, rel, p.pid)
        made[qos or "guaranteed"] = (rel, p)

    excl, worker = made["guaranteed"]
    shared, sleeper = made["burstable"]
    apply_with_shared_pool(layout, allowed=allowed, reserved=CPUSet([a]), exclusive={excl: CPUSet([b])},
                           shared=[shared])
    assert proc_status(worker.pid, "Cpus_allowed_list") == CPUSet([b])
    assert proc_status(sleeper.pid, "Cpus_allowed_list") == CPUSet([a])
    assert read_cpus(layout, excl, effective=True) == CPUSet([b])

    # The container ends: its cgroup goes (as the runtime removes it) and the pool takes its CPU back.
    worker.kill()
    worker.wait()
    apply_with_shared_pool(layout, allowed=allowed, reserved=CPUSet([a]), exclusive={}, shared=[shared],
                           remove=[excl])
    assert not exists(layout, excl)
    assert proc_status(sleeper.pid, "Cpus_allowed_list") == allowed

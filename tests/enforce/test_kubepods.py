"""Pod/container -> cgroup path, every (QoS, runtime, driver) combination, against kubelet's naming."""

from __future__ import annotations

import pytest

from agent.enforce.cgroup import CgroupLayout
from agent.enforce.kubepods import (
    container_cgroup_path,
    pod_cgroup_path,
    pod_uid_of_cgroup,
    qos_cgroup_path,
    split_container_id,
)
from agent.errors import EnforcementError

UID = "1b3e5a7c-90d2-4e6f-8a1b-2c3d4e5f6a7b"
U_ = "1b3e5a7c_90d2_4e6f_8a1b_2c3d4e5f6a7b"  # systemd escapes "-" inside a slice component
CID = "0123456789abcdef" * 4

# Expected paths written from the conventions (kubelet cgroup names, containerd/cri-o scope
# prefixes), not from our output.
CASES = [
    ("guaranteed", "containerd", "systemd",
     f"kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope"),
    ("burstable", "containerd", "systemd",
     f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-{CID}.scope"),
    ("besteffort", "containerd", "systemd",
     f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/cri-containerd-{CID}.scope"),
    ("guaranteed", "cri-o", "systemd", f"kubepods.slice/kubepods-pod{U_}.slice/crio-{CID}.scope"),
    ("burstable", "cri-o", "systemd",
     f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/crio-{CID}.scope"),
    ("besteffort", "cri-o", "systemd",
     f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/crio-{CID}.scope"),
    ("guaranteed", "containerd", "cgroupfs", f"kubepods/pod{UID}/{CID}"),
    ("burstable", "containerd", "cgroupfs", f"kubepods/burstable/pod{UID}/{CID}"),
    ("besteffort", "containerd", "cgroupfs", f"kubepods/besteffort/pod{UID}/{CID}"),
    ("guaranteed", "cri-o", "cgroupfs", f"kubepods/pod{UID}/crio-{CID}"),
    ("burstable", "cri-o", "cgroupfs", f"kubepods/burstable/pod{UID}/crio-{CID}"),
    ("besteffort", "cri-o", "cgroupfs", f"kubepods/besteffort/pod{UID}/crio-{CID}"),
]


@pytest.mark.parametrize(("qos", "runtime", "driver", "expected"), CASES)
@pytest.mark.parametrize(("version", "root"), [(1, "/sys/fs/cgroup/cpuset"), (2, "/sys/fs/cgroup")])
def test_container_cgroup_path(
    qos: str, runtime: str, driver: str, expected: str, version: int, root: str
) -> None:
    rel = container_cgroup_path(UID, qos, CID, runtime, driver)
    assert rel == expected
    # The same relative path under either hierarchy; the layout adds the mount.
    assert CgroupLayout(version, root).abspath(rel) == f"{root}/{expected}"
    # The id as the API reports it (runtime scheme prefixed) resolves the same.
    assert container_cgroup_path(UID, qos, f"{runtime}://{CID}", None, driver) == expected
    assert rel.startswith(pod_cgroup_path(UID, qos, driver) + "/")


STATIC_UID = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"  # a static pod's UID is its config hash: no dashes


@pytest.mark.parametrize(
    ("uid", "qos", "driver", "root", "expected"),
    [
        (UID, "Guaranteed", "cgroupfs", (), f"kubepods/pod{UID}"),
        (UID, "BestEffort", "cgroupfs", ("k8s",), f"k8s/kubepods/besteffort/pod{UID}"),
        (UID, "Burstable", "systemd", ("k8s",),
         f"k8s.slice/k8s-kubepods.slice/k8s-kubepods-burstable.slice/k8s-kubepods-burstable-pod{U_}.slice"),
        (STATIC_UID, "guaranteed", "systemd", (), f"kubepods.slice/kubepods-pod{STATIC_UID}.slice"),
    ],
)
def test_pod_cgroup_path(uid: str, qos: str, driver: str, root: tuple[str, ...], expected: str) -> None:
    assert pod_cgroup_path(uid, qos, driver, root) == expected
    # The QoS class's folder holds it, and its name reads back to the pod (what a watch of it sees).
    folder, name = expected.rsplit("/", 1)
    assert qos_cgroup_path(qos, driver, root) == folder
    assert pod_uid_of_cgroup(name, qos, driver, root) == uid


@pytest.mark.parametrize(
    ("name", "qos", "driver"),
    [
        ("burstable", "guaranteed", "cgroupfs"),  # the QoS folders inside kubepods
        ("kubepods-besteffort.slice", "guaranteed", "systemd"),
        (CID, "burstable", "cgroupfs"),  # a container
        (f"pod{U_}", "guaranteed", "cgroupfs"),  # systemd's escaping where cgroupfs names it
        (f"kubepods-pod{UID}.slice", "guaranteed", "systemd"),  # and the other way round
        (f"kubepods-besteffort-pod{U_}.slice", "burstable", "systemd"),  # another class's pod
        (f"kubepods-burstable-pod{U_}.slice", "burstable", "cgroupfs"),
        ("pod../x", "guaranteed", "cgroupfs"),
        ("pod", "guaranteed", "cgroupfs"),
        ("kubepods-pod.slice", "guaranteed", "systemd"),
    ],
)
def test_folders_that_are_not_pods(name: str, qos: str, driver: str) -> None:
    assert pod_uid_of_cgroup(name, qos, driver) is None


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ((UID, "guaranteed", "docker://" + CID, None, "systemd"), "unsupported runtime scheme"),
        ((UID, "guaranteed", "containerd://" + CID, "cri-o", "systemd"), "scheme disagrees with runtime"),
        ((UID, "guaranteed", CID, None, "systemd"), "runtime unknown"),
        ((UID, "guaranteed", "../../etc", "containerd", "cgroupfs"), "path in the id"),
        ((UID, "guaranteed", CID.upper(), "containerd", "cgroupfs"), "not lower-case hex"),
        ((UID, "guaranteed", "abc", "containerd", "cgroupfs"), "too short"),
        (("../x", "guaranteed", CID, "containerd", "cgroupfs"), "bad pod uid"),
        ((UID, "critical", CID, "containerd", "cgroupfs"), "unknown QoS"),
        ((UID, "guaranteed", CID, "rkt", "cgroupfs"), "unknown runtime"),
        ((UID, "guaranteed", CID, "containerd", "openrc"), "unknown driver"),
    ],
)
def test_invalid_inputs_are_refused(args: tuple[str, str, str, str | None, str], why: str) -> None:
    with pytest.raises(EnforcementError):
        container_cgroup_path(*args)


def test_split_container_id() -> None:
    assert split_container_id(f"cri-o://{CID}") == ("cri-o", CID)
    assert split_container_id(CID) == (None, CID)

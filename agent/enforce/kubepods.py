"""The one place that maps a Kubernetes pod and container to its cgroup path.

`pod_cgroup_path`, `container_cgroup_path(pod_uid, qos, container_id, runtime, driver)`,
`qos_cgroup_path`; back the other way `pod_uid_of_cgroup` and `read_runtime_cgroups_path` (the
`cgroupsPath` a CRI runtime gives a container, as NRI passes it).  Paths are relative to the
controller's root, the same on cgroup v1 and v2; `CgroupLayout.abspath` adds the mount.
Naming rules (kubelet, containerd, cri-o; cgroupfs and systemd): agent/enforce/README.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from agent.api.qos import QOSClass
from agent.errors import EnforcementError

_E = TypeVar("_E", bound=StrEnum)


class Runtime(StrEnum):
    CONTAINERD = "containerd"
    CRIO = "cri-o"


class CgroupDriver(StrEnum):
    SYSTEMD = "systemd"
    CGROUPFS = "cgroupfs"


_SCOPE_PREFIX = {Runtime.CONTAINERD: "cri-containerd", Runtime.CRIO: "crio"}
# `containerStatuses[].containerID` carries the runtime as a URI scheme.
_ID_SCHEMES = {"containerd": Runtime.CONTAINERD, "cri-o": Runtime.CRIO}
_ID_RE = re.compile(r"[0-9a-f]{12,128}")
_UID_RE = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{0,127}")
_ROOT_PART_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.]*")


def _enum(kind: type[_E], value: _E | str) -> _E:
    try:
        return kind(value)
    except ValueError as exc:
        raise EnforcementError(f"unknown {kind.__name__} {value!r}") from exc


def split_container_id(container_id: str) -> tuple[Runtime | None, str]:
    """Split "containerd://<id>" into (runtime, id); a bare id gives (None, id).  Validates the id."""
    runtime: Runtime | None = None
    scheme, sep, rest = container_id.partition("://")
    if sep:
        if scheme not in _ID_SCHEMES:
            raise EnforcementError(f"unsupported container runtime {scheme!r}", container_id)
        runtime, container_id = _ID_SCHEMES[scheme], rest
    if not _ID_RE.fullmatch(container_id):
        raise EnforcementError("invalid container id", container_id)
    return runtime, container_id


def _kubelet_cgroup(parts: list[str], driver: CgroupDriver, kubelet_root: tuple[str, ...]) -> str:
    """The kubelet's cgroup named by `parts` below `kubelet_root` ("kubepods", "burstable", "pod<uid>")."""
    for part in kubelet_root:
        if not _ROOT_PART_RE.fullmatch(part):
            raise EnforcementError("invalid kubelet cgroup root component", part)
    parts = [*kubelet_root, *parts]
    if driver is CgroupDriver.CGROUPFS:
        return "/".join(parts)
    # systemd: "a-b-c.slice" lives at a.slice/a-b.slice/a-b-c.slice; "-" inside a part is escaped.
    escaped = [p.replace("-", "_") for p in parts]
    return "/".join("-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped)))


def _qos_parts(qos: QOSClass) -> list[str]:
    return ["kubepods"] if qos is QOSClass.GUARANTEED else ["kubepods", qos.value]


def qos_cgroup_path(
    qos: QOSClass | str, driver: CgroupDriver | str, kubelet_root: tuple[str, ...] = ()
) -> str:
    """The cgroup the kubelet makes a QoS class's pods in, relative to the controller root: `kubepods`
    itself for Guaranteed pods, `kubepods/burstable` and `kubepods/besteffort` (or their slices)."""
    return _kubelet_cgroup(_qos_parts(_enum(QOSClass, qos)), _enum(CgroupDriver, driver), kubelet_root)


def pod_cgroup_path(
    pod_uid: str, qos: QOSClass | str, driver: CgroupDriver | str, kubelet_root: tuple[str, ...] = ()
) -> str:
    """A pod's cgroup path relative to the controller root.

    `kubelet_root` is kubelet's `--cgroup-root` as components (usually empty).
    """
    qos, driver = _enum(QOSClass, qos), _enum(CgroupDriver, driver)
    if not _UID_RE.fullmatch(pod_uid):
        raise EnforcementError("invalid pod UID", pod_uid)
    return _kubelet_cgroup([*_qos_parts(qos), f"pod{pod_uid}"], driver, kubelet_root)


def pod_uid_of_cgroup(
    name: str, qos: QOSClass | str, driver: CgroupDriver | str, kubelet_root: tuple[str, ...] = ()
) -> str | None:
    """The UID of the pod whose cgroup is folder `name` in `qos_cgroup_path(qos, ...)`, or None when
    that folder is not a pod's (a QoS class's folder, a container's)."""
    qos, driver = _enum(QOSClass, qos), _enum(CgroupDriver, driver)
    if driver is CgroupDriver.CGROUPFS:
        uid = name[3:] if name.startswith("pod") else ""
    else:
        stem = qos_cgroup_path(qos, driver, kubelet_root).rsplit("/", 1)[-1].removesuffix(".slice")
        head, tail = f"{stem}-pod", ".slice"
        named = name.startswith(head) and name.endswith(tail)
        uid = name[len(head):-len(tail)].replace("_", "-") if named else ""
    if not _UID_RE.fullmatch(uid):
        return None
    # The one mapping, read backwards: the name must be exactly what pod_cgroup_path makes.
    if pod_cgroup_path(uid, qos, driver, kubelet_root).rsplit("/", 1)[-1] != name:
        return None
    return uid


def container_cgroup_path(
    pod_uid: str,
    qos: QOSClass | str,
    container_id: str,
    runtime: Runtime | str | None,
    driver: CgroupDriver | str,
    kubelet_root: tuple[str, ...] = (),
) -> str:
    """A container's cgroup path relative to the controller root (same for cgroup v1 and v2).

    `container_id` may carry its runtime scheme ("containerd://..."); `runtime` may then be None.
    """
    scheme_runtime, cid = split_container_id(container_id)
    if runtime is None:
        if scheme_runtime is None:
            raise EnforcementError("container runtime unknown", container_id)
        rt = scheme_runtime
    else:
        rt = _enum(Runtime, runtime)
        if scheme_runtime is not None and scheme_runtime is not rt:
            raise EnforcementError(f"container id is from {scheme_runtime}, not {rt}", container_id)
    pod = pod_cgroup_path(pod_uid, qos, driver, kubelet_root)
    if _enum(CgroupDriver, driver) is CgroupDriver.SYSTEMD:
        return f"{pod}/{_SCOPE_PREFIX[rt]}-{cid}.scope"
    return f"{pod}/crio-{cid}" if rt is Runtime.CRIO else f"{pod}/{cid}"


@dataclass(frozen=True, slots=True)
class RuntimeCgroup:
    """What a runtime's `cgroupsPath` for a kubelet pod's container says."""

    qos: QOSClass
    driver: CgroupDriver
    runtime: Runtime
    pod_uid: str  # as the path spells it (systemd: "-" escaped to "_")
    container_id: str  # bare

    def names_pod(self, uid: str) -> bool:
        """Whether the path's pod is `uid` (the systemd form escapes its "-")."""
        want = uid.replace("-", "_") if self.driver is CgroupDriver.SYSTEMD else uid
        return self.pod_uid == want


_QOS_PART = {None: QOSClass.GUARANTEED, "burstable": QOSClass.BURSTABLE, "besteffort": QOSClass.BESTEFFORT}
_CGROUPFS_RE = re.compile(r"/?kubepods(?:/(burstable|besteffort))?/pod([0-9a-fA-F][0-9a-fA-F-]{0,127})"
                          r"/(crio-)?([0-9a-f]{12,128})")
_SYSTEMD_RE = re.compile(r"kubepods(?:-(burstable|besteffort))?-pod([0-9a-fA-F][0-9a-fA-F_]{0,127})\.slice"
                         r":(cri-containerd|crio):([0-9a-f]{12,128})")
_SCOPE_RUNTIME = {prefix: runtime for runtime, prefix in _SCOPE_PREFIX.items()}


def read_runtime_cgroups_path(text: str) -> RuntimeCgroup | None:
    """The container a runtime's `cgroupsPath` names, or None when it is not a kubelet pod's container
    at the top of the hierarchy (a kubelet `--cgroup-root`, which `container_cgroup_path` callers in
    the agent do not use either, reads as None)."""
    m = _CGROUPFS_RE.fullmatch(text)
    if m is not None:
        qos, uid, crio, cid = m.groups()
        return RuntimeCgroup(_QOS_PART[qos], CgroupDriver.CGROUPFS,
                             Runtime.CRIO if crio else Runtime.CONTAINERD, uid, cid)
    m = _SYSTEMD_RE.fullmatch(text)
    if m is not None:
        qos, uid, prefix, cid = m.groups()
        return RuntimeCgroup(_QOS_PART[qos], CgroupDriver.SYSTEMD, _SCOPE_RUNTIME[prefix], uid, cid)
    return None

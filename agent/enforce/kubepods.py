"""The one place that maps a Kubernetes pod and container to its cgroup path.

Naming follows kubelet's cgroup manager and the CRI runtimes (verified against kubelet
`pkg/kubelet/cm/cgroup_manager_linux.go` and cri-o `internal/config/cgmgr`):

- kubelet names a pod's cgroup by the components `kubepods[/<qos>]/pod<uid>`; Guaranteed pods have
  no QoS component.  The cgroupfs driver joins them with "/".  The systemd driver escapes "-" to "_"
  in each component and expands them into nested slices: `kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_>.slice`.
- the runtime puts the container below the pod: with systemd, a `<prefix>-<id>.scope` unit
  (containerd: `cri-containerd`, cri-o: `crio`); with cgroupfs, `<id>` for containerd and
  `crio-<id>` for cri-o.

The relative path is the same on cgroup v1 (under the cpuset mount) and v2 (under the unified
mount); `CgroupLayout.abspath` adds the mount.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TypeVar

from agent.errors import EnforcementError

_E = TypeVar("_E", bound=StrEnum)


class QOSClass(StrEnum):
    """A pod's Kubernetes QoS class (`status.qosClass`, lower-cased)."""

    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"

    @classmethod
    def _missing_(cls, value: object) -> QOSClass | None:
        # The API spells them "Guaranteed", "Burstable", "BestEffort".
        if isinstance(value, str) and value.lower() != value:
            return cls(value.lower())
        return None


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


def pod_cgroup_path(
    pod_uid: str, qos: QOSClass | str, driver: CgroupDriver | str, kubelet_root: tuple[str, ...] = ()
) -> str:
    """A pod's cgroup path relative to the controller root.

    `kubelet_root` is kubelet's `--cgroup-root` as components (usually empty).
    """
    qos, driver = _enum(QOSClass, qos), _enum(CgroupDriver, driver)
    if not _UID_RE.fullmatch(pod_uid):
        raise EnforcementError("invalid pod UID", pod_uid)
    for part in kubelet_root:
        if not _ROOT_PART_RE.fullmatch(part):
            raise EnforcementError("invalid kubelet cgroup root component", part)
    parts = [*kubelet_root, "kubepods"]
    if qos is not QOSClass.GUARANTEED:
        parts.append(qos.value)
    parts.append(f"pod{pod_uid}")
    if driver is CgroupDriver.CGROUPFS:
        return "/".join(parts)
    # systemd: "a-b-c.slice" lives at a.slice/a-b.slice/a-b-c.slice; "-" inside a part is escaped.
    escaped = [p.replace("-", "_") for p in parts]
    return "/".join("-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped)))


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

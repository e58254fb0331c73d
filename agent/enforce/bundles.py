"""Which pod container a runtime's new container is, from the OCI bundle the runtime wrote for it.

`container_id_of_cgroup(name)` is the id a containerd container cgroup is named by;
`bundle_container(folder, container_id)` reads the CRI annotations of its `config.json` into a
`BundleContainer`, or None when the bundle is missing, too large, not JSON, or not a pod container.
The annotations carry pod-supplied text: everything is checked and bounded.
Paths and annotation names: agent/enforce/README.md, "OCI bundles".
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

DEFAULT_BUNDLES = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
CONTAINER_NAME = "io.kubernetes.cri.container-name"
_MAX_BYTES = 4 << 20  # a spec this big is not one the CRI plugin wrote
_ID = re.compile(r"[0-9a-f]{64}")  # containerd's CRI ids
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label, as container names are
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class BundleContainer:
    """The pod container a runtime container is for."""

    pod_uid: str
    name: str


def container_id_of_cgroup(name: str) -> str:
    """The containerd container id a cgroup folder's `name` carries ("" when it carries none)."""
    if name.startswith("cri-containerd-") and name.endswith(".scope"):
        name = name[len("cri-containerd-"):-len(".scope")]
    return name if _ID.fullmatch(name) else ""


def bundle_container(folder: str, container_id: str) -> BundleContainer | None:
    """The pod container behind runtime container `container_id`, from its bundle in `folder`."""
    if not folder or _ID.fullmatch(container_id) is None:
        return None
    path = os.path.join(folder, container_id, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MAX_BYTES:
        return None
    try:
        spec = json.loads(data)
    except (ValueError, RecursionError):
        return None
    annotations = spec.get("annotations") if isinstance(spec, dict) else None
    if not isinstance(annotations, dict) or annotations.get(CONTAINER_TYPE) != "container":
        return None
    uid, name = annotations.get(SANDBOX_UID), annotations.get(CONTAINER_NAME)
    if not isinstance(uid, str) or not isinstance(name, str) or _UID.fullmatch(uid) is None \
            or _NAME.fullmatch(name) is None:
        return None
    return BundleContainer(uid, name)

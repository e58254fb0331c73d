"""What the controller's stores keep of each object: the fields something reads, not the whole object.

Pure: no I/O.  `slim_object(obj)` (any kind: no managedFields, no kubectl's last-applied copy),
`slim_pod(pod)`, `slim_node(node)`, `slim_job(job)` (its pod template as `slim_pod_spec` keeps it),
`slim_pod_spec(spec)`; `CONTAINER_DROPS`, `POD_SPEC_DROPS`.  Each returns a new object and leaves its
argument as it was.  Applied where a store reads a listed or watched object and where it keeps a
write's response (agent/admission/cluster/store.py), so a tenant's large object costs the controller
only the fields it reads: a pod's 1 MB of container arguments is never held.

What is dropped is named, not what is kept: a field the controller does not know of stays (a new
field some reader starts to use is not silently missing).  The dropped fields are read nowhere in
`agent/admission` (nor in what it imports); keep it so when a reader is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# A container's fields the controller never reads (it reads name, resources, restartPolicy, and the
# status's containerStatuses): the ones a tenant can make large, and the probes and mounts.
CONTAINER_DROPS = frozenset({
    "command", "args", "env", "envFrom", "volumeMounts", "volumeDevices", "livenessProbe",
    "readinessProbe", "startupProbe", "lifecycle", "workingDir", "terminationMessagePath",
    "terminationMessagePolicy", "ports", "securityContext", "stdin", "stdinOnce", "tty",
})
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
POD_SPEC_DROPS = frozenset({"volumes", "hostAliases", "dnsConfig", "imagePullSecrets", "securityContext"})
# A container status's fields never read (the ledger and the pinning read name, containerID, state,
# resources, allocatedResources).
STATUS_DROPS = frozenset({"image", "imageID", "lastState", "volumeMounts", "user", "stopSignal"})
NODE_STATUS_DROPS = frozenset({"images", "volumesAttached", "volumesInUse", "config", "daemonEndpoints"})


def _metadata(meta: object) -> object:
    if not isinstance(meta, Mapping):
        return meta
    out = {k: v for k, v in meta.items() if k != "managedFields"}
    notes = out.get("annotations")
    if isinstance(notes, Mapping) and LAST_APPLIED in notes:
        out["annotations"] = {k: v for k, v in notes.items() if k != LAST_APPLIED}
    return out


def slim_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` without its managedFields and kubectl's last-applied copy of itself."""
    out = dict(obj)
    if "metadata" in out:
        out["metadata"] = _metadata(out["metadata"])
    return out


def _containers(items: object, drops: frozenset[str]) -> object:
    if not isinstance(items, list):
        return items
    return [{k: v for k, v in c.items() if k not in drops} if isinstance(c, Mapping) else c for c in items]


def slim_pod_spec(spec: object) -> object:
    """A pod spec without what the controller never reads (anything not a mapping: as it is)."""
    if not isinstance(spec, Mapping):
        return spec
    out = {k: v for k, v in spec.items() if k not in POD_SPEC_DROPS}
    for key in CONTAINER_LISTS:
        if key in out:
            out[key] = _containers(out[key], CONTAINER_DROPS)
    return out


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as the controller's pod store keeps it."""
    out = slim_object(pod)
    if "spec" in out:
        out["spec"] = slim_pod_spec(out["spec"])
    status = out.get("status")
    if isinstance(status, Mapping):
        status = dict(status)
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            if key in status:
                status[key] = _containers(status[key], STATUS_DROPS)
        out["status"] = status
    return out


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """A Node without its image list and volume bookkeeping."""
    out = slim_object(node)
    status = out.get("status")
    if isinstance(status, Mapping):
        out["status"] = {k: v for k, v in status.items() if k not in NODE_STATUS_DROPS}
    return out


def slim_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """A Job with its pod template's spec as `slim_pod_spec` keeps it."""
    out = slim_object(job)
    spec = out.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("template"), Mapping):
        template = dict(spec["template"])
        if "spec" in template:
            template["spec"] = slim_pod_spec(template["spec"])
        if "metadata" in template:
            template["metadata"] = _metadata(template["metadata"])
        out["spec"] = {**spec, "template": template}
    return out

"""What the controller's stores keep of each object: the fields something reads, not the whole object.

Pure: no I/O.  `slim_object(obj)` (any kind: no managedFields, no kubectl's last-applied copy),
`slim_pod(pod, sharing=None)`, `slim_nrt(nrt, sharing=None)`, `slim_node(node)`, `slim_job(job)` (its
pod template as `slim_pod_spec` keeps it), `slim_pod_spec(spec)`; `CONTAINER_DROPS`, `POD_SPEC_DROPS`,
and for pods alone `POD_ONLY_SPEC_DROPS`, `POD_STATUS_DROPS`, `POD_METADATA_DROPS`.  Each returns a new
object and leaves its argument as it was.  Applied where a store reads a listed or watched object and
where it keeps a write's response (agent/admission/cluster/store.py), so a tenant's large object costs
the controller only the fields it reads: a pod's 1 MB of container arguments is never held.  With a
`Sharing` table (agent/admission/cluster/sharing.py) the parts many objects have in common are held once.

What is dropped is named, not what is kept: a field the controller does not know of stays (a new
field some reader starts to use is not silently missing).  The dropped fields are read nowhere in
`agent/admission` (nor in what it imports); keep it so when a reader is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.admission.cluster.sharing import Own, Sharing, shared_strings

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# A container's fields the controller never reads (it reads name, resources, restartPolicy, and the
# status's containerStatuses): the ones a tenant can make large, the probes and mounts, the image.
CONTAINER_DROPS = frozenset({
    "command", "args", "env", "envFrom", "volumeMounts", "volumeDevices", "livenessProbe",
    "readinessProbe", "startupProbe", "lifecycle", "workingDir", "terminationMessagePath",
    "terminationMessagePolicy", "ports", "securityContext", "stdin", "stdinOnce", "tty", "image",
    "imagePullPolicy", "resizePolicy",
})
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
POD_SPEC_DROPS = frozenset({"volumes", "hostAliases", "dnsConfig", "imagePullSecrets", "securityContext"})
# A pod's own spec fields never read of a pod (a gang's tolerations and the rest are read from its
# template, which keeps them): what the API server's defaults add to every one of 100,000 pods.
POD_ONLY_SPEC_DROPS = frozenset({
    "tolerations", "dnsPolicy", "serviceAccountName", "serviceAccount", "automountServiceAccountToken",
    "terminationGracePeriodSeconds", "enableServiceLinks", "preemptionPolicy", "hostname", "subdomain",
    "schedulerName", "priority", "readinessGates",
})
# A pod's status fields never read (the controller reads its phase, qosClass and container statuses).
POD_STATUS_DROPS = frozenset({"conditions", "podIP", "podIPs", "hostIP", "hostIPs", "startTime",
                              "message", "reason", "nominatedNodeName"})
POD_METADATA_DROPS = frozenset({"managedFields", "generateName", "finalizers"})
_POD_SPEC_ALL_DROPS = POD_SPEC_DROPS | POD_ONLY_SPEC_DROPS
# A container status's fields never read (the ledger and the pinning read name, containerID, state,
# resources, allocatedResources).
STATUS_DROPS = frozenset({"image", "imageID", "lastState", "volumeMounts", "user", "stopSignal", "ready",
                          "restartCount", "started", "allocatedResourcesStatus"})
NODE_STATUS_DROPS = frozenset({"images", "volumesAttached", "volumesInUse", "config", "daemonEndpoints"})


def _metadata(meta: object, drops: frozenset[str] = frozenset({"managedFields"})) -> object:
    if not isinstance(meta, Mapping):
        return meta
    out = {k: v for k, v in meta.items() if k not in drops}
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


def slim_pod_spec(spec: object, drops: frozenset[str] = POD_SPEC_DROPS) -> object:
    """A pod spec without what the controller never reads, `drops` and its containers'
    `CONTAINER_DROPS` (anything not a mapping: as it is)."""
    if not isinstance(spec, Mapping):
        return spec
    out = {k: v for k, v in spec.items() if k not in drops}
    for key in CONTAINER_LISTS:
        if key in out:
            out[key] = _containers(out[key], CONTAINER_DROPS)
    return out


# The parts of a pod that are its own (its uid, name, node and container IDs are in them): rebuilt with
# their strings interned, not looked up in a `Sharing` table.
_STATUSES: Own = {key: {"*": {}} for key in ("containerStatuses", "initContainerStatuses",
                                           "ephemeralContainerStatuses")}
_OWN_PARTS: Own = {"metadata": {}, "spec": {}, "status": _STATUSES}


def slim_pod(pod: Mapping[str, Any], sharing: Sharing | None = None) -> dict[str, Any]:
    """A pod as the controller's pod store keeps it: its strings interned, and with `sharing` every
    part it has in common with other pods (containers, owner references, labels, states) the table's
    one copy, never to be changed in place (`agent.admission.cluster.sharing`)."""
    slim = _slim_pod(pod)
    if sharing is None:
        return shared_strings(slim)  # type: ignore[no-any-return]
    return sharing.tree(slim, _OWN_PARTS)  # type: ignore[no-any-return]


def _slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(pod)
    if "metadata" in out:
        out["metadata"] = _metadata(out["metadata"], POD_METADATA_DROPS)
    if "spec" in out:
        out["spec"] = slim_pod_spec(out["spec"], _POD_SPEC_ALL_DROPS)
    status = out.get("status")
    if isinstance(status, Mapping):
        status = {k: v for k, v in status.items() if k not in POD_STATUS_DROPS}
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            if key in status:
                status[key] = _containers(status[key], STATUS_DROPS)
        out["status"] = status
    return out


_NRT_OWN_PARTS: Own = {"metadata": {}, "zones": {"*": {"resources": {}}}, "attributes": {}}


def slim_nrt(nrt: Mapping[str, Any], sharing: Sharing | None = None) -> dict[str, Any]:
    """An NRT as `slim_object` keeps it, and with `sharing` every part it has in common with other
    nodes' NRTs (a zone's costs, a resource's figures, a policy attribute) the table's one copy."""
    slim = slim_object(nrt)
    return slim if sharing is None else sharing.tree(slim, _NRT_OWN_PARTS)


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

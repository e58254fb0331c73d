"""The JSON object hook that drops a pod's bulk while its response is decoded: `drop_bulk(obj)`.

A tenant can make a pod of about 1 MB of container arguments (the API server takes objects up to
1.5 MiB), and short arguments decode to about twelve times their size: a page of a hundred such pods
held decoded, even only until each is slimmed, took the controller past a GiB (bench/hostile.py).  The
JSON decoder calls an object hook on each object as soon as it is complete, innermost first, so with
`drop_bulk` at most one container's fields are ever held decoded.  It is passed only by readers of
pods and pod templates that read none of the dropped fields (`object_hook` of `KubeClient.list_paged`,
`.watch` and the `Reflector`): the controller's pod and Job stores (whose `slim` drops a superset of
them, agent/admission/cluster/slim.py) and the node's pod watch (agent/kube/pods/watch.py, reading by
agent/api/podplan.py).
"""

from __future__ import annotations

from typing import Any

# A container's fields a tenant can make large and neither half reads.
CONTAINER_BULK = frozenset({"args", "command", "env", "envFrom"})
MANAGED_FIELDS = "managedFields"  # every object's record of its field managers: no pod reader reads it


def drop_bulk(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj`, one decoded JSON object, less its `managedFields` list and, when it is named (a `name`
    string, as a container is), its `CONTAINER_BULK` lists.  Only list values go: a map of strings
    (labels, annotations, a node selector) keeps every key, whatever its name."""
    if type(obj.get(MANAGED_FIELDS)) is list:
        del obj[MANAGED_FIELDS]
    if type(obj.get("name")) is str:
        for key in CONTAINER_BULK:
            if type(obj.get(key)) is list:
                del obj[key]
    return obj

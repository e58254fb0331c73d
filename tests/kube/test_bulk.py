"""The object hook that drops a pod's bulk while it is decoded (agent/kubeapi/bulk.py): a table of JSON
objects, what its readers read left as it was (the controller's slimmed pod and Job, the node's
PodPlan), and a watch event decoded through it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.admission.cluster.slim import CONTAINER_DROPS, slim_job, slim_pod
from agent.api.podplan import plan_pod
from agent.kubeapi.bulk import CONTAINER_BULK, drop_bulk
from agent.kubeapi.client import WatchStream

MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"main"}': {"f:args": {}}}}}}]

ROWS = [
    # (why, the object as served, the object the hook returns)
    ("a container's arguments, command and environment go",
     {"name": "main", "image": "busybox", "command": ["sleep"], "args": ["ab", "cd"],
      "env": [{"name": "A", "value": "1"}], "envFrom": [{"configMapRef": {"name": "c"}}],
      "resources": {"limits": {"cpu": "2"}}},
     {"name": "main", "image": "busybox", "resources": {"limits": {"cpu": "2"}}}),
    ("a container without them is as it was",
     {"name": "main", "image": "busybox", "resources": {}},
     {"name": "main", "image": "busybox", "resources": {}}),
    ("metadata loses its managedFields",
     {"name": "p", "namespace": "ns", "uid": "u", "managedFields": MANAGED},
     {"name": "p", "namespace": "ns", "uid": "u"}),
    ("an unnamed object keeps its command (a probe's exec)",
     {"command": ["cat", "/tmp/alive"]}, {"command": ["cat", "/tmp/alive"]}),
    ("annotations named like the bulk keep them: their values are strings",
     {"name": "x", "args": "a", "command": "b", "env": "c", "envFrom": "d", "managedFields": "e"},
     {"name": "x", "args": "a", "command": "b", "env": "c", "envFrom": "d", "managedFields": "e"}),
    ("a non-string name is not a container",
     {"name": 7, "args": ["ab"]}, {"name": 7, "args": ["ab"]}),
    ("an environment variable keeps its value",
     {"name": "A", "value": "1"}, {"name": "A", "value": "1"}),
]


@pytest.mark.parametrize(("why", "served", "kept"), ROWS, ids=[r[0] for r in ROWS])
def test_drop_bulk(why: str, served: dict[str, Any], kept: dict[str, Any]) -> None:
    assert json.loads(json.dumps(served), object_hook=drop_bulk) == kept


def test_only_fields_the_controller_never_keeps_are_dropped() -> None:
    assert CONTAINER_BULK <= CONTAINER_DROPS


def pod() -> dict[str, Any]:
    """A running Guaranteed pod as the API server serves it, with its managedFields, an init container,
    a probe's exec command, a sidecar and a tenant's 1,000 arguments."""
    res = {"cpu": "2", "memory": "2Gi"}
    running = {"running": {"startedAt": "2026-01-05T10:00:00Z"}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "ns", "uid": "4f1c", "resourceVersion": "12",
                     "managedFields": MANAGED, "labels": {"app": "web"},
                     "annotations": {"args": "kept", "topolet.io/numa-policy": "single-numa-node"}},
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "init", "image": "busybox", "command": ["true"],
                                "resources": {"requests": {"cpu": "1"}}}],
            "containers": [
                {"name": "app", "image": "web", "args": ["ab"] * 1000, "env": [{"name": "A", "value": "1"}],
                 "resources": {"requests": res, "limits": res},
                 "livenessProbe": {"exec": {"command": ["cat", "/tmp/alive"]}}},
                {"name": "proxy", "image": "proxy", "command": ["proxy"],
                 "resources": {"requests": res, "limits": res}}]},
        "status": {"phase": "Running", "qosClass": "Guaranteed", "containerStatuses": [
            {"name": n, "image": n, "containerID": f"containerd://{n}", "ready": True, "state": running}
            for n in ("app", "proxy")]},
    }


def job() -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns", "uid": "9a", "resourceVersion": "3",
                         "managedFields": MANAGED, "labels": {"topolet.io/queue": "q"}},
            "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed",
                     "template": {"metadata": {"annotations": {"env": "kept"}},
                                  "spec": {"restartPolicy": "Never", "containers": [
                                      {"name": "main", "image": "busybox", "args": ["ab"] * 1000,
                                       "env": [{"name": "A", "value": "1"}],
                                       "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]}}}}


def test_what_the_readers_keep_is_the_same_decoded_with_the_hook() -> None:
    text = json.dumps(pod())
    plain, hooked = json.loads(text), json.loads(text, object_hook=drop_bulk)
    assert hooked != plain and "args" not in hooked["spec"]["containers"][0]
    assert hooked["metadata"]["annotations"]["args"] == "kept"
    assert slim_pod(hooked) == slim_pod(plain)
    assert plan_pod(hooked) == plan_pod(plain)
    text = json.dumps(job())
    assert slim_job(json.loads(text, object_hook=drop_bulk)) == slim_job(json.loads(text))


class Body:
    """A watch response's body, in chunks."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, size: int, decode_content: bool = True) -> Any:
        return iter([self.data[i:i + 1000] for i in range(0, len(self.data), 1000)])


def test_a_watch_event_is_decoded_through_the_hook() -> None:
    line = json.dumps({"type": "ADDED", "object": pod()}).encode() + b"\n"
    (plain,) = list(WatchStream(Body(line), "watch pods"))
    (event,) = list(WatchStream(Body(line), "watch pods", drop_bulk))
    assert plain is not None and event is not None and event["type"] == "ADDED"
    assert "args" in plain["object"]["spec"]["containers"][0]
    assert event["object"] == json.loads(json.dumps(plain["object"]), object_hook=drop_bulk)
    assert "managedFields" not in event["object"]["metadata"]

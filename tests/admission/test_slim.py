"""What the controller's stores keep of an object (agent/admission/cluster/slim.py): table tests, the
argument left as it was, and a tenant's 1 MB pod held as a few hundred bytes."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import pytest

from agent.admission.cluster.slim import (
    CONTAINER_DROPS,
    LAST_APPLIED,
    slim_job,
    slim_node,
    slim_object,
    slim_pod,
    slim_pod_spec,
)
from agent.admission.cluster.store import Reflector
from agent.admission.gangs.shape import job_shape
from agent.api.podplan import plan_pod

RES = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}


def container(name: str = "main", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "resources": RES, "command": ["sleep"], "args": ["3600"],
            "env": [{"name": "A", "value": "b"}], "volumeMounts": [{"name": "v", "mountPath": "/v"}],
            "livenessProbe": {"exec": {"command": ["true"]}}, **extra}


def pod(**spec_extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7", "generateName": "j-",
                     "labels": {"batch.kubernetes.io/job-name": "j"},
                     "annotations": {"topolet.io/numa-policy": "single-numa-node", LAST_APPLIED: "{...}"},
                     "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                     "ownerReferences": [{"kind": "Job", "name": "j", "uid": "ju", "controller": True}]},
        "spec": {"nodeName": "n1", "containers": [container()],
                 "initContainers": [container("sidecar", restartPolicy="Always")],
                 "volumes": [{"name": "v", "emptyDir": {}}], "schedulingGates": [{"name": "g"}],
                 "affinity": {"nodeAffinity": {}}, "tolerations": [{"operator": "Exists"}],
                 "overhead": {"cpu": "100m"}, "priorityClassName": "high", "futureField": {"x": 1},
                 **spec_extra},
        "status": {"phase": "Running", "qosClass": "Guaranteed", "podIPs": [{"ip": "10.0.0.1"}],
                   "conditions": [{"type": "Ready", "status": "True"}], "startTime": "2026-12-07T00:00:00Z",
                   "containerStatuses": [{"name": "main", "containerID": "containerd://c1",
                                          "state": {"running": {}}, "image": "busybox", "ready": True,
                                          "restartCount": 0, "imageID": "sha256:x", "lastState": {}}]},
    }


def test_a_pod_keeps_every_field_the_controller_reads() -> None:
    before = pod()
    kept = copy.deepcopy(before)
    out = slim_pod(before)
    assert before == kept  # the argument is not touched
    meta, spec, status = out["metadata"], out["spec"], out["status"]
    assert "managedFields" not in meta and LAST_APPLIED not in meta["annotations"]
    assert meta["annotations"]["topolet.io/numa-policy"] == "single-numa-node"
    assert {k: meta[k] for k in ("labels", "ownerReferences", "uid", "resourceVersion")} == \
        {k: before["metadata"][k] for k in ("labels", "ownerReferences", "uid", "resourceVersion")}
    for key in ("nodeName", "schedulingGates", "affinity", "overhead", "priorityClassName",
                "futureField"):  # a field not named as dropped stays
        assert spec[key] == before["spec"][key], key
    assert "volumes" not in spec and "tolerations" not in spec  # a pod's tolerations are never read
    assert spec["containers"] == [{"name": "main", "resources": RES}]
    assert spec["initContainers"] == [{"name": "sidecar", "resources": RES, "restartPolicy": "Always"}]
    assert status["containerStatuses"] == [{"name": "main", "containerID": "containerd://c1",
                                            "state": {"running": {}}}]
    assert status["phase"] == "Running" and status["qosClass"] == "Guaranteed"
    assert "conditions" not in status and "podIPs" not in status and "generateName" not in meta
    assert plan_pod(out) == plan_pod(before)  # what the ledger and the view read of it


@pytest.mark.parametrize("odd", [None, "text", 3, ["a"], {"containers": "not a list"},
                                 {"containers": ["not a mapping", {"name": "c", "args": ["x"]}]}])
def test_malformed_parts_are_left_as_they_are_for_their_readers_to_refuse(odd: Any) -> None:
    """The slimming never raises: a reader decides what a malformed object costs (only itself)."""
    out = slim_pod({"metadata": "not a mapping", "spec": odd, "status": odd})
    assert out["metadata"] == "not a mapping"
    if isinstance(odd, dict) and isinstance(odd["containers"], list):
        assert out["spec"]["containers"] == ["not a mapping", {"name": "c"}]
    else:
        assert out["spec"] == odd


def test_a_tenants_megabyte_of_arguments_is_never_held() -> None:
    """100 pods of about 1 MB of container arguments (the outside review's attack) hold well under a KiB
    each once slimmed."""
    big = pod()
    big["spec"]["containers"][0]["args"] = ["x" * 100] * 10_000
    assert len(json.dumps(big)) > 1_000_000
    assert len(json.dumps(slim_pod(big))) < 2_000
    assert set(CONTAINER_DROPS) >= {"args", "command", "env", "envFrom"}


def test_a_node_loses_its_image_list_and_keeps_its_figures() -> None:
    node = {"metadata": {"name": "n1", "uid": "nu", "labels": {"a": "b"}, "managedFields": [{}]},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True},
            "status": {"allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"},
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "images": [{"names": ["busybox"], "sizeBytes": 1}] * 50,
                       "volumesInUse": ["v"], "nodeInfo": {"kubeletVersion": "v1.37.2"}}}
    out = slim_node(node)
    assert out["spec"] == node["spec"] and out["metadata"]["labels"] == {"a": "b"}
    assert "managedFields" not in out["metadata"]
    assert out["status"] == {k: node["status"][k] for k in ("allocatable", "capacity", "conditions",
                                                             "nodeInfo")}
    assert "images" in node["status"]


def test_a_jobs_template_is_slimmed_and_its_shape_is_the_same() -> None:
    """The admission record's Job shape (uid, counts, each container's name and resources) is the same
    of a slimmed Job, so no record is distrusted for it."""
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "ju", "managedFields": [{}],
                        "labels": {"topolet.io/queue": "q"}},
           "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed", "suspend": True,
                    "template": {"metadata": {"annotations": {"topolet.io/numa-policy": "x"}},
                                 "spec": pod()["spec"]}}}
    out = slim_job(job)
    assert job_shape(out) == job_shape(job)
    assert out["spec"]["template"]["metadata"] == job["spec"]["template"]["metadata"]
    assert out["spec"]["template"]["spec"]["containers"] == [{"name": "main", "resources": RES}]
    assert out["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]  # read of templates
    assert out["spec"]["suspend"] is True and "managedFields" not in out["metadata"]
    assert "args" in job["spec"]["template"]["spec"]["containers"][0]  # the argument stays whole


def test_any_object_loses_only_its_managed_fields_and_last_applied_copy() -> None:
    obj = {"metadata": {"name": "x", "managedFields": [{}], "annotations": {LAST_APPLIED: "{}", "a": "b"}},
           "spec": {"containers": [container()]}}
    assert slim_object(obj) == {"metadata": {"name": "x", "annotations": {"a": "b"}},
                                "spec": obj["spec"]}
    assert slim_pod_spec("not a spec") == "not a spec"


def test_the_store_keeps_slim_objects_from_lists_watches_and_writes() -> None:
    store = Reflector(None, "/api/v1/pods", "pods", threading.Event(), slim=slim_pod)  # type: ignore[arg-type]
    store.listed([store.read(pod())])
    store.handle("MODIFIED", store.read({**pod(), "metadata": {**pod()["metadata"], "resourceVersion": "8"}}))
    newer = pod()
    newer["metadata"]["resourceVersion"] = "9"
    store.put(newer)
    (held,) = store.snapshot()
    assert held["metadata"]["resourceVersion"] == "9"
    assert "managedFields" not in held["metadata"] and "args" not in held["spec"]["containers"][0]

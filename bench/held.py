#!/usr/bin/env python3
"""Bytes the controller holds per object, whole as the API server serves it vs as its stores keep it
(`agent/admission/cluster/slim.py`).

A test cluster of its own (tests/controlplane/cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) gets what a node of a training cluster carries: Nodes with the
status a kubelet writes (capacity, conditions, addresses, node info and the image list of 50 images
a kubelet reports by default), their NRTs as the agent writes them (bench/admission_workload.py's
machines), an Indexed Job as users write one (command, args, 12 environment variables, two volume
mounts, probes, resources), the pods the Job controller makes of it (with the service-account token
volume the API server adds), and one tenant's hostile pod of about 1 MB of container arguments (the
outside review's attack, issue 37).  Each object is read back from the API server (managedFields
included) and measured as decoded JSON: every dict, list, str and number reachable from it, each
counted once (`sys.getsizeof`), whole and slimmed in the same process.

Then what one pod costs among many (`--many`, default 20,000 pods: 5,000 such Jobs of 4, each copy of a
read-back pod with its own name, uid, version, index, Job and node): the bytes the store's slimmed
objects hold per pod (tracemalloc, the objects decoded beforehand), each slimmed alone (strings
interned) and through one `Sharing` table as the controller's pod store holds them
(agent/admission/cluster/sharing.py: the parts pods have in common held once).

Last line: `held: bytes per pod W -> S, per node W -> S, per NRT W -> S, per Job W -> S; 1 MB-args pod
W -> S; among N pods S -> H shared` (W whole, S slimmed, H slimmed and shared).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission_api import _populate  # noqa: E402

from agent.admission.cluster.sharing import Sharing  # noqa: E402
from agent.admission.cluster.slim import slim_job, slim_node, slim_object, slim_pod  # noqa: E402
from agent.api.nrt import GROUP as NRT_GROUP  # noqa: E402
from agent.api.nrt import PLURAL as NRT_PLURAL  # noqa: E402
from agent.api.nrt import VERSION as NRT_VERSION  # noqa: E402
from agent.kubeapi.client import KubeClient, resource_path  # noqa: E402
from tests.controlplane.cluster import start_cluster  # noqa: E402

NAMESPACE = "held"
IMAGES = 50  # the kubelet's default --node-status-max-images


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of `obj` and everything reachable from it through dicts and lists, each object once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list):
        size += sum(deep_size(v, seen) for v in obj)
    return size


def node_status(name: str) -> dict[str, Any]:
    """What a kubelet adds to a Node's status beside its capacity: conditions, addresses, node info,
    daemon endpoints and its image list."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "conditions": [{"type": t, "status": s, "reason": f"Kubelet{t}", "message": f"kubelet says {t}",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}
                       for t, s in (("MemoryPressure", "False"), ("DiskPressure", "False"),
                                    ("PIDPressure", "False"), ("Ready", "True"))],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "0" * 32, "systemUUID": "1" * 36, "bootID": "2" * 36,
                     "kernelVersion": "6.1.0-28-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                     "containerRuntimeVersion": "containerd://2.4.2", "kubeletVersion": "v1.37.2",
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        "images": [{"names": [f"registry.example.org/team-{i}/trainer@sha256:{i:064x}",
                              f"registry.example.org/team-{i}/trainer:v{i}.3.1"],
                    "sizeBytes": 3_000_000_000 + i} for i in range(IMAGES)],
    }


def job_body(name: str) -> dict[str, Any]:
    """An Indexed Job of 4 pods as a training user writes one."""
    res = {"cpu": "8", "memory": "32Gi"}
    main = {"name": "trainer", "image": "registry.example.org/team-0/trainer:v0.3.1",
            "command": ["torchrun"], "args": ["--nnodes=4", "--nproc-per-node=8", "train.py",
                                              "--config=/etc/trainer/config.yaml", "--epochs=90"],
            "env": [{"name": f"TRAINER_SETTING_{i}", "value": f"value-{i}"} for i in range(10)]
            + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
               {"name": "RANK", "valueFrom": {"fieldRef": {
                   "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"},
                             {"name": "shm", "mountPath": "/dev/shm"}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
            "livenessProbe": {"exec": {"command": ["cat", "/tmp/alive"]}, "periodSeconds": 30},
            "ports": [{"containerPort": 29500, "name": "rendezvous"}],
            "resources": {"requests": res, "limits": res}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"team": "vision"}},
            "spec": {"completionMode": "Indexed", "parallelism": 4, "completions": 4,
                     "template": {"metadata": {"annotations": {"topolet.io/numa-policy": "single-numa-node"}},
                                  "spec": {"restartPolicy": "Never", "containers": [main],
                                           "volumes": [{"name": "data", "emptyDir": {}},
                                                       {"name": "shm", "emptyDir": {"medium": "Memory"}}]}}}}


def hostile_pod(name: str, arg_bytes: int) -> dict[str, Any]:
    """A tenant's pod of about `arg_bytes` of container arguments, in strings of 100 characters."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "command": ["sleep"],
                "args": ["x" * 100] * (arg_bytes // 104)}]}}


def measure(objs: Sequence[Mapping[str, Any]], slim: Callable[[Mapping[str, Any]], dict[str, Any]]) -> tuple[
        int, int]:
    """Mean bytes per object, (whole, slimmed)."""
    whole = sum(deep_size(o) for o in objs) // len(objs)
    slimmed = sum(deep_size(slim(o)) for o in objs) // len(objs)
    return whole, slimmed


def many_pods(pod: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """`count` decoded copies of `pod`, each with what differs between the pods of 4-pod Jobs on
    different nodes: name, uid, resourceVersion, completion index, Job name and uid, node."""
    text = json.dumps(pod)
    out = []
    for i in range(count):
        p = json.loads(text)
        meta, job, index = p["metadata"], f"train-{i // 4}", str(i % 4)
        job_uid = f"{i // 4:08x}-0000-4000-8000-{i // 4:012x}"
        meta.update(name=f"{job}-{index}-{i:05x}", uid=f"{i:08x}-1111-4111-8111-{i:012x}",
                    resourceVersion=str(100_000 + i))
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        for key in list(labels):
            if key.endswith("job-name"):
                labels[key] = job
            elif key.endswith("controller-uid"):
                labels[key] = job_uid
            elif key.endswith("job-completion-index"):
                labels[key] = index
        for key in list(notes):
            if key.endswith("job-completion-index"):
                notes[key] = index
        for ref in meta.get("ownerReferences") or []:
            ref.update(name=job, uid=job_uid)
        p.setdefault("spec", {})["nodeName"] = f"node-{i % 5000:05d}"
        out.append(p)
    return out


def held_per_pod(pods: list[dict[str, Any]], slim: Callable[[Mapping[str, Any]], dict[str, Any]]) -> int:
    """Bytes allocated per pod for the slimmed objects a store would hold (tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [slim(p) for p in pods]
        return (tracemalloc.get_traced_memory()[0] - before) // len(kept)
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4, help="Nodes (and NRTs) to measure (default 4)")
    parser.add_argument("--arg-bytes", type=int, default=1_000_000,
                        help="the hostile pod's bytes of container arguments (default 1,000,000)")
    parser.add_argument("--many", type=int, default=20_000, help="pods held together (default 20,000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="topolet-held-") as tmp:
        topos = workload.topologies(Path(tmp) / "dumps")
        objects = workload.cluster(args.nodes, topos, 42)
        objects.pods.clear()  # no fillers: the pods measured are the Job's
        cluster = start_cluster(Path(tmp) / "stage")
        try:
            api = KubeClient(cluster.plane.client())
            _populate(cluster, objects)
            for node in objects.nodes:
                name = node["metadata"]["name"]
                api.patch(f"/api/v1/nodes/{name}/status", {"status": node_status(name)},
                          "application/strategic-merge-patch+json")
            api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            api.create(resource_path("batch", "v1", "jobs", namespace=NAMESPACE), job_body("train"))
            api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", hostile_pod("hostile", args.arg_bytes))
            deadline = time.monotonic() + 60
            while True:
                pods = [p for p in api.list(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                            {"labelSelector": "job-name=train"}).get("items") or []]
                if len(pods) == 4 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if len(pods) != 4:
                raise SystemExit(f"the Job controller made {len(pods)} of 4 pods in 60 s")
            nodes = api.list("/api/v1/nodes").get("items") or []
            nrts = api.list(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL)).get("items") or []
            jobs = [api.get(resource_path("batch", "v1", "jobs", "train", namespace=NAMESPACE))]
            hostile = [api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/hostile")]
        finally:
            cluster.stop()
    rows = {"pod": measure(pods, slim_pod), "node": measure(nodes, slim_node),
            "NRT": measure(nrts, slim_object), "Job": measure(jobs, slim_job),
            "1 MB-args pod": measure(hostile, slim_pod)}
    print(f"# {len(pods)} pods of an Indexed Job, {len(nodes)} Nodes with a kubelet's status and {IMAGES} "
          f"images, {len(nrts)} NRTs, 1 Job, 1 pod of {len(json.dumps(hostile[0])):,} bytes of JSON; "
          "decoded JSON bytes (sys.getsizeof over every object reachable)")
    print(f"{'object':<14} {'whole B':>10} {'slimmed B':>10} {'kept':>6}")
    for name, (whole, slimmed) in rows.items():
        print(f"{name:<14} {whole:>10,} {slimmed:>10,} {slimmed / whole * 100:>5.1f}%")
    many = many_pods(pods[0], args.many)
    alone = held_per_pod(many, slim_pod)
    shared = held_per_pod(many, functools.partial(slim_pod, sharing=Sharing()))
    print(f"# among {len(many):,} such pods (5,000 Jobs of 4 on 5,000 nodes), bytes held per pod "
          f"(tracemalloc): slimmed {alone:,}, slimmed and shared {shared:,}")
    print("held: " + ", ".join(f"per {k} {w} -> {s}" for k, (w, s) in rows.items() if k != "1 MB-args pod")
          + "; 1 MB-args pod {} -> {}".format(*rows["1 MB-args pod"])
          + f"; among {len(many)} pods {alone} -> {shared} shared")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Visiting every node of the agents' DaemonSet to remove what the agent made there (uninstall).

`clean_nodes(kube, namespace, agents, timeout)`:
1. read the agents' DaemonSet `agents` (its pod template reaches exactly the nodes the agents ran on,
   with their host mounts and privileges);
2. delete it with foreground propagation and wait until it and its pods are gone, so no agent
   writes a cgroup or an object again;
3. run `topolet cleanup --local` on each of those nodes as the init container of a DaemonSet
   `<agents>-cleanup` made from that template (`cleanup_daemonset`, pure), and wait until every one
   of its pods is Ready (its cleanup exited 0; a failing one restarts and keeps the count short);
4. delete that DaemonSet and wait until its pods are gone.

Run again after a failure, it picks up where it stopped: with the agents' DaemonSet gone it uses the
cleanup DaemonSet still there.  Raises KubeAPIError (one line) when a wait runs out; the Node names
that did not finish are in the message.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.errors import ConfigError, KubeAPIError
from agent.kube.cleanup import absent_ok
from agent.kube.client import KubeClient, resource_path

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
CLEANUP_SUFFIX = "-cleanup"
# The agent's options `topolet cleanup --local` takes over: where it keeps what it made.
LOCAL_OPTIONS = ("--state-dir", "--features-dir", "--cgroup-root")
CLEANUP_LABELS = {"app.kubernetes.io/name": "topolet", "app.kubernetes.io/component": "cleanup"}


def _local_args(args: list[str]) -> list[str]:
    """The `LOCAL_OPTIONS` among a container's args, each as `--name=value`."""
    out: list[str] = []
    words = iter(args)
    for word in words:
        name, eq, value = word.partition("=")
        if name in LOCAL_OPTIONS:
            out.append(f"{name}={value if eq else next(words, '')}")
    return out


def cleanup_daemonset(agents: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The DaemonSet `name` that runs `topolet cleanup --local` on every node of DaemonSet `agents`:
    its pod template with the agent container as an init container running the cleanup, and one
    container that only waits, so a pod is Ready once its node is clean."""
    meta = agents.get("metadata") or {}
    template = copy.deepcopy((agents.get("spec") or {}).get("template") or {})
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    agent = next((c for c in containers if c.get("name") == "agent"), containers[0] if containers else None)
    if not isinstance(agent, dict) or not agent.get("image"):
        raise ConfigError(f"DaemonSet {meta.get('name')}: no agent container to take the image from")
    shared = {k: agent[k] for k in ("image", "imagePullPolicy", "securityContext", "env") if k in agent}
    cleanup = {**shared, "name": "cleanup",
               "command": ["topolet", "cleanup", "--local", *_local_args(list(agent.get("args") or []))],
               "volumeMounts": agent.get("volumeMounts") or []}
    waits = {**{k: v for k, v in shared.items() if k != "env"}, "name": "done",
             "command": ["sleep", "infinity"],
             "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}}}
    spec.update({"initContainers": [cleanup], "containers": [waits],
                 "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1})
    template["spec"] = spec
    template["metadata"] = {"labels": dict(CLEANUP_LABELS)}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": meta.get("namespace"), "labels": dict(CLEANUP_LABELS)},
            "spec": {"selector": {"matchLabels": dict(CLEANUP_LABELS)},
                     "updateStrategy": {"type": "OnDelete"}, "template": template}}


def _ds_path(namespace: str, name: str | None = None) -> str:
    return resource_path("apps", "v1", "daemonsets", name, namespace=namespace)


def delete_daemonset(kube: KubeClient, namespace: str, name: str, timeout: float,
                     clock: Callable[[], float] = time.monotonic) -> bool:
    """Delete DaemonSet `namespace/name` (foreground) and wait until it and its pods are gone;
    False when it was already gone.  KubeAPIError when `timeout` seconds pass first."""
    path = _ds_path(namespace, name)
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
    if absent_ok(lambda: kube.request("DELETE", path, body=body, content_type="application/json",
                                      what=f"delete DaemonSet {namespace}/{name}")) is None:
        return False
    deadline = clock() + timeout
    while absent_ok(lambda: kube.get(path, what=f"read DaemonSet {namespace}/{name}")) is not None:
        if clock() >= deadline:
            raise KubeAPIError(f"DaemonSet {namespace}/{name} and its pods not gone after {timeout:g} s "
                               "(a node that does not answer keeps its pod Terminating)")
        time.sleep(POLL_SECONDS)
    return True


def _unready_nodes(kube: KubeClient, namespace: str) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in CLEANUP_LABELS.items())
    pods = kube.list(resource_path("", "v1", "pods", namespace=namespace), {"labelSelector": selector},
                     what=f"list cleanup pods in {namespace}").get("items") or []
    out = []
    for pod in pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            where = (pod.get("spec") or {}).get("nodeName") or (pod.get("metadata") or {}).get("name")
            out.append(str(where))
    return sorted(out)


def _wait_ready(kube: KubeClient, namespace: str, name: str, timeout: float,
                clock: Callable[[], float]) -> int:
    """Wait until every pod DaemonSet `name` should run is Ready; how many."""
    path = _ds_path(namespace, name)
    deadline = clock() + timeout
    while True:
        ds = kube.get(path, what=f"read DaemonSet {namespace}/{name}")
        status = ds.get("status") or {}
        want = int(status.get("desiredNumberScheduled") or 0)
        generation = int((ds.get("metadata") or {}).get("generation") or 1)
        seen = int(status.get("observedGeneration") or 0) >= generation
        if seen and int(status.get("numberReady") or 0) >= want:
            return want
        if clock() >= deadline:
            nodes = _unready_nodes(kube, namespace)
            raise KubeAPIError(f"DaemonSet {namespace}/{name}: {status.get('numberReady') or 0} of {want} "
                               f"nodes cleaned after {timeout:g} s; not yet: {', '.join(nodes) or '?'} "
                               f"(kubectl -n {namespace} logs -c cleanup <pod>)")
        time.sleep(POLL_SECONDS)


def _read_ds(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    return absent_ok(lambda: kube.get(_ds_path(namespace, name), what=f"read DaemonSet {namespace}/{name}"))


def clean_nodes(kube: KubeClient, namespace: str, agents: str, timeout: float,
                clock: Callable[[], float] = time.monotonic) -> str:
    """Stop DaemonSet `agents` and clean each of its nodes (see the module); a one-line summary."""
    name = agents + CLEANUP_SUFFIX
    live = _read_ds(kube, namespace, agents)
    if live is not None:
        body = cleanup_daemonset(live, name)
        delete_daemonset(kube, namespace, agents, timeout, clock)
        log.info("DaemonSet %s/%s and its pods are gone", namespace, agents)
        if _read_ds(kube, namespace, name) is None:
            kube.create(_ds_path(namespace), body, what=f"create DaemonSet {namespace}/{name}")
    elif _read_ds(kube, namespace, name) is None:
        return f"DaemonSet {namespace}/{agents} absent, no node visited"
    nodes = _wait_ready(kube, namespace, name, timeout, clock)
    delete_daemonset(kube, namespace, name, timeout, clock)
    return f"DaemonSet {namespace}/{agents} deleted, {nodes} node(s) cleaned by {name}"

"""Visiting every node of the agents' DaemonSets to remove what the agent made there (uninstall).

`clean_nodes(kube, namespace, agents, steps)`: stop the agents (delete their DaemonSets, wait for
their pods), run `topolet cleanup --local` on the other nodes through a DaemonSet made from their
template (`cleanup_daemonset`, pure), then remove it; each step within its deadline
(`split_budget`).  A wait that runs out stops nobody: `NodeCleanup.left` says what was not done.
Raises KubeAPIError on an API error (README.md).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import ConfigError
from agent.kube.cleanup.sweep import absent_ok
from agent.kubeapi.client import KubeClient, resource_path

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
CLEANUP_SUFFIX = "-cleanup"
# The agent's options `topolet cleanup --local` takes over: where it keeps what it made.
LOCAL_OPTIONS = ("--state-dir", "--features-dir", "--cgroup-root")
CLEANUP_LABELS = {"app.kubernetes.io/name": "topolet", "app.kubernetes.io/component": "cleanup"}
# Which agents' DaemonSet a cleanup DaemonSet's pods stand for: one selector per pool, never overlapping.
CLEANUP_OF_LABEL = "topolet.io/cleanup-of"
# The share of the budget by which each step must be done: stopping the agents (their pods have a
# 30 s grace period), cleaning the nodes, removing the cleanup DaemonSets; the rest is the API
# objects' (no wait, a few calls per node).
STEP_SHARES = (1 / 3, 3 / 4, 11 / 12)


@dataclass(frozen=True)
class Deadlines:
    """When each step of the node cleanup gives up, and when the whole cleanup should be done
    (clock seconds)."""

    stop_agents: float
    clean: float
    remove: float
    end: float


def split_budget(start: float, budget: float) -> Deadlines:
    """One overall budget of `budget` seconds from `start`, cut into the steps' deadlines."""
    stop, clean, remove = (start + budget * share for share in STEP_SHARES)
    return Deadlines(stop, clean, remove, start + budget)


@dataclass
class NodeCleanup:
    """What `clean_nodes` did (a phrase per agents' DaemonSet) and what it left undone."""

    done: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def _local_args(args: list[str]) -> list[str]:
    """The `LOCAL_OPTIONS` among a container's args, each as `--name=value`."""
    out: list[str] = []
    words = iter(args)
    for word in words:
        name, eq, value = word.partition("=")
        if name in LOCAL_OPTIONS:
            out.append(f"{name}={value if eq else next(words, '')}")
    return out


def _skip_nodes(spec: dict[str, Any], nodes: Sequence[str]) -> None:
    """Add to pod spec `spec` a required node affinity that keeps its pods off `nodes` (ANDed with
    every term the spec already requires)."""
    required = (spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    terms = required.get("nodeSelectorTerms") or [{}]
    not_in = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), not_in]
    required["nodeSelectorTerms"] = terms


def cleanup_daemonset(agents: Mapping[str, Any], name: str, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The DaemonSet `name` that runs `topolet cleanup --local` on every node of DaemonSet `agents`
    but the nodes in `skip`: its pod template with the agent container as an init container running
    the cleanup, and one container that only waits, so a pod is Ready once its node is clean."""
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
    if skip:
        _skip_nodes(spec, skip)
    template["spec"] = spec
    labels = {**CLEANUP_LABELS, CLEANUP_OF_LABEL: str(meta.get("name") or "")}
    template["metadata"] = {"labels": dict(labels)}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": meta.get("namespace"), "labels": dict(labels)},
            "spec": {"selector": {"matchLabels": dict(labels)},
                     "updateStrategy": {"type": "OnDelete"}, "template": template}}


def _ds_path(namespace: str, name: str | None = None) -> str:
    return resource_path("apps", "v1", "daemonsets", name, namespace=namespace)


def _read_ds(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    return absent_ok(lambda: kube.get(_ds_path(namespace, name), what=f"read DaemonSet {namespace}/{name}"))


def _start_delete(kube: KubeClient, namespace: str, name: str) -> bool:
    """Delete DaemonSet `namespace/name` with foreground propagation; False when it was not there."""
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
    return absent_ok(lambda: kube.request("DELETE", _ds_path(namespace, name), body=body,
                                          content_type="application/json",
                                          what=f"delete DaemonSet {namespace}/{name}")) is not None


def _pause(deadline: float, clock: Callable[[], float]) -> None:
    time.sleep(max(0.0, min(POLL_SECONDS, deadline - clock())))


def _wait_gone(kube: KubeClient, namespace: str, names: Sequence[str], deadline: float,
               clock: Callable[[], float]) -> list[dict[str, Any]]:
    """Wait until every DaemonSet of `names` is gone, at most until `deadline`; those still there."""
    while True:
        there = [ds for ds in (_read_ds(kube, namespace, n) for n in names) if ds is not None]
        if not there or clock() >= deadline:
            return there
        _pause(deadline, clock)


def _pods_of(kube: KubeClient, namespace: str, ds: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods DaemonSet `ds` owns (its selector's labels, its uid as their controller)."""
    meta = ds.get("metadata") or {}
    match = ((ds.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    query = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(match.items()))} if match else {}
    listed = kube.list_paged(resource_path("", "v1", "pods", namespace=namespace), query,
                             what=f"list the pods of DaemonSet {namespace}/{meta.get('name')}")
    pods = listed.get("items") or []
    return [p for p in pods if any(ref.get("uid") == meta.get("uid")
                                   for ref in (p.get("metadata") or {}).get("ownerReferences") or [])]


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node a DaemonSet's pod is for: where it is bound, else the node its affinity names
    (the DaemonSet controller's `metadata.name In [node]`), else the pod's own name."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    for term in terms:
        for match in term.get("matchFields") or []:
            if match.get("key") == "metadata.name" and match.get("operator") == "In" and match.get("values"):
                return str(match["values"][0])
    return str((pod.get("metadata") or {}).get("name") or "?")


def pod_state(pod: Mapping[str, Any]) -> str:
    """Why a pod is not Ready, in a few words: a container's waiting reason (ErrImagePull,
    CrashLoopBackOff), a failed cleanup's exit code, not scheduled, being deleted, or its phase."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "being deleted"
    for kind in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(kind) or []:
            state = c.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                return f"{c.get('name')}: {state['waiting']['reason']}"
            last = (c.get("lastState") or {}).get("terminated") or state.get("terminated") or {}
            if last.get("exitCode"):
                return f"{c.get('name')}: exited {last['exitCode']}"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"not scheduled ({cond.get('reason') or 'no node fits'})"
    return str(status.get("phase") or "no status")


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _wait_ready(kube: KubeClient, namespace: str, name: str, deadline: float,
                clock: Callable[[], float]) -> tuple[int, list[str]]:
    """Wait until every pod DaemonSet `name` should run is Ready, at most until `deadline`: how many
    nodes it cleaned, and what it left (`<node> (<pod state>)`, or why no node can be named)."""
    while True:
        ds = _read_ds(kube, namespace, name)
        if ds is None:
            return 0, [f"DaemonSet {namespace}/{name} (deleted meanwhile)"]
        status = ds.get("status") or {}
        want, ready = int(status.get("desiredNumberScheduled") or 0), int(status.get("numberReady") or 0)
        generation = int((ds.get("metadata") or {}).get("generation") or 1)
        seen = int(status.get("observedGeneration") or 0) >= generation
        if seen and ready >= want:
            return want, []
        if clock() >= deadline:
            break
        _pause(deadline, clock)
    if not seen:
        return ready, [f"DaemonSet {namespace}/{name} (no DaemonSet controller took it up)"]
    pods = _pods_of(kube, namespace, ds)
    left = sorted(f"{pod_node(p)} ({pod_state(p)})" for p in pods if not _ready(p))
    if want > len(pods):
        left.append(f"{want - len(pods)} node(s) with no pod of {name} yet")
    return ready, left


def clean_nodes(kube: KubeClient, namespace: str, agents: Sequence[str], steps: Deadlines,
                clock: Callable[[], float] = time.monotonic) -> NodeCleanup:
    """Stop the agents' DaemonSets `agents` and clean each of their nodes (see the module)."""
    result = NodeCleanup()
    cleanups = {name: name + CLEANUP_SUFFIX for name in agents}
    templates: dict[str, dict[str, Any]] = {}
    for name in agents:
        live = _read_ds(kube, namespace, name)
        if live is not None:
            # Built once here only to refuse (ConfigError) a template it cannot run before the agents
            # go; step 2 builds it again with the nodes to skip, known only then.
            cleanup_daemonset(live, cleanups[name])
            templates[name] = live
            _start_delete(kube, namespace, name)
    # 1. The agents stop.
    busy: dict[str, list[str]] = {}  # agents' DaemonSet -> nodes its pods are still on
    for ds in _wait_gone(kube, namespace, list(templates), steps.stop_agents, clock):
        name = str(ds["metadata"]["name"])
        busy[name] = sorted({pod_node(p) for p in _pods_of(kube, namespace, ds)})
        result.left += [f"{node} (the agent's pod of {name} still there: not visited)" for node in busy[name]]
        if not busy[name]:
            result.left.append(f"DaemonSet {namespace}/{name} (still being deleted, no pod left)")
    if templates:
        log.info("agents' DaemonSets gone: %s; still there: %s",
                 ", ".join(n for n in templates if n not in busy) or "none", ", ".join(busy) or "none")
    # 2. Every other node of theirs is cleaned.
    running = []
    for name in agents:
        clean = cleanups[name]
        if _read_ds(kube, namespace, clean) is None:
            if name not in templates:
                result.done.append(f"DaemonSet {namespace}/{name} absent, no node visited")
                continue
            body = cleanup_daemonset(templates[name], clean, busy.get(name, ()))
            kube.create(_ds_path(namespace), body, what=f"create DaemonSet {namespace}/{clean}")
        running.append(name)
    for name in running:
        nodes, left = _wait_ready(kube, namespace, cleanups[name], steps.clean, clock)
        verb = "being deleted" if name in busy else "deleted"
        result.done.append(f"DaemonSet {namespace}/{name} {verb}, "
                           f"{nodes} node(s) cleaned by {cleanups[name]}")
        result.left += left
    # 3. The cleanup DaemonSets go, whatever step 2 found.
    for name in running:
        _start_delete(kube, namespace, cleanups[name])
    for ds in _wait_gone(kube, namespace, [cleanups[n] for n in running], steps.remove, clock):
        on = sorted({pod_node(p) for p in _pods_of(kube, namespace, ds)})
        result.left.append(f"DaemonSet {namespace}/{ds['metadata']['name']} (still being deleted"
                           f"{', pods on ' + ', '.join(on) if on else ''})")
    return result

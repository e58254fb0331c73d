"""A test cluster on the real control plane: kube-controller-manager, kube-scheduler and simulated nodes.

`Cluster` runs, next to a `ControlPlane` (etcd + kube-apiserver):

- kube-controller-manager with the controllers Jobs need (job, garbage collector, service accounts,
  namespaces, the root CA publisher) and without the node lifecycle controller, so simulated nodes
  are never tainted for a missing kubelet heartbeat;
- kube-scheduler, unchanged (default profile);
- simulated nodes: `add_node(name, fsroot)` creates a Node whose capacity and allocatable come from
  the hardware dump's topology, marks it Ready, and starts a real `topolet agent --enforcement off`
  reading that dump, which publishes the node's NodeResourceTopology;
- the kubelet's API part for those nodes (`SimulatedKubelets`): a pod bound to a simulated node
  with an agent is reported Running with container IDs (what the agent needs to pin it), and a pod
  being deleted there is finished off as a kubelet would (grace 0).

Both components use the identities and default RBAC bindings kubeadm gives them, run with
`--leader-elect=false`, and log to files under the work directory (`logs()` for failure output).
Everything started is stopped by `stop()`, and with the test process if it dies.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tests.controlplane.harness import (
    ControlPlane,
    ControlPlaneError,
    _Process,
    build_binaries,
    build_components,
    free_port,
)

READY_TIMEOUT_S = 120.0
# The client rate limits of both components: their defaults (20 and 50 requests per second) would
# make a bench of thousands of pods measure the limiter, not the components.
DEFAULT_API_QPS = 500
PLACEMENT_POLICY = "daemonset/controller/placement-policy.yaml"  # relative to the repository
CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "namespace-controller",
    "pod-garbage-collector-controller",  # deletes the pods of a removed simulated node
    "root-ca-certificate-publisher-controller",
    "statefulset-controller",  # a LeaderWorkerSet's pods and a StatefulSet's (tests/kueue/)
)
NRT_GROUP, NRT_VERSION, NRT_PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_MAX_PODS = 110  # kubelet's default maxPods


@dataclass(frozen=True)
class ClusterBinaries:
    """Paths of kube-controller-manager and kube-scheduler."""

    kube_controller_manager: Path
    kube_scheduler: Path


def build_cluster_binaries() -> ClusterBinaries:
    """Build (or find in the cache) kube-controller-manager and kube-scheduler through build.sh."""
    paths = build_components("kube-controller-manager", "kube-scheduler")
    return ClusterBinaries(paths["kube-controller-manager"], paths["kube-scheduler"])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _binary_quantity(n: int) -> str:
    """A byte count in the largest binary suffix that divides it (what kubelet reports)."""
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def node_resources(topology: Any, reserved_cpus: int = 0, pods: int = DEFAULT_MAX_PODS
                   ) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) a kubelet would report for `topology` with `reserved_cpus` set aside.

    CPUs are the online CPUs, memory the sum of the NUMA nodes' memory (hugepages counted apart, as
    kubelet does), one `hugepages-<size>` resource per page size.
    """
    hugepages: dict[int, int] = {}
    for node in topology.numa_nodes:
        for h in node.hugepages:
            hugepages[h.size_bytes] = hugepages.get(h.size_bytes, 0) + h.size_bytes * h.total
    memory = sum(n.memory_bytes for n in topology.numa_nodes) - sum(hugepages.values())
    capacity = {"cpu": str(len(topology.cpus)), "memory": _binary_quantity(memory), "pods": str(pods)}
    for size, total in sorted(hugepages.items()):
        capacity[f"hugepages-{_binary_quantity(size)}"] = _binary_quantity(total)
    allocatable = dict(capacity, cpu=str(len(topology.cpus) - reserved_cpus))
    return capacity, allocatable


def _api(plane: ControlPlane) -> Any:
    from agent.kubeapi.client import KubeClient

    return KubeClient(plane.client())


@dataclass
class SimNode:
    """A simulated node: its Node object, the dump it reads, and the real agent that serves it."""

    name: str
    fsroot: Path
    topology: Any  # agent.topology.model.Topology of the dump
    workdir: Path
    reserved_cpus: str
    agent: _Process | None = None

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    def state(self) -> Any:
        """The agent's allocation state (agent.enforce.state.State), empty before its first write."""
        from agent.enforce.state_file import StateFile

        return StateFile(str(self.state_dir)).load(missing_ok=True)

    def log_text(self) -> str:
        return self.agent.log_tail(1 << 20) if self.agent is not None else ""

    def metrics_port(self) -> int | None:
        m = re.search(r"serving /metrics and /healthz on [^:]*:(\d+)", self.log_text())
        return int(m.group(1)) if m else None

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of metric `name` (matching `labels`) on the agent's /metrics."""
        from tests.kube.kubelet_standin import metric_sum

        port = self.metrics_port()
        if port is None:
            raise AssertionError(f"agent of {self.name} serves no metrics yet")
        return metric_sum(port, name, **labels)


class SimulatedKubelets:
    """The kubelet's API part for the simulated nodes with agents, on one thread.

    A pod bound to one of them gets the status a kubelet writes once its containers run (phase
    Running, a containerd ID per container); a pod being deleted there is deleted with grace 0, as
    kubelet does once its containers are gone.
    """

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.nodes: set[str] = set()
        self._reported: set[str] = set()  # pod uids reported Running
        self._stop = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, name="simulated-kubelets", daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.shutdown()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        from agent.errors import KubeAPIError

        api = _api(self.plane)
        try:
            while not self._stop.is_set():
                try:
                    self._list_and_watch(api)
                except KubeAPIError as exc:
                    if not self._stop.is_set():
                        self.errors.append(str(exc))
                        self._stop.wait(0.5)
        finally:
            api.close()

    def _list_and_watch(self, api: Any) -> None:
        query = {"fieldSelector": "spec.nodeName!="}
        listed = api.list("/api/v1/pods", query)
        for pod in listed.get("items") or []:
            self._handle(api, pod)
        rv = listed["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            with api.watch("/api/v1/pods", {**query, "resourceVersion": rv, "timeoutSeconds": 30,
                                            "allowWatchBookmarks": True},
                           timeout=(5.0, 60.0)) as stream:
                self._stream = stream
                for event in stream:
                    if event is None or self._stop.is_set():
                        continue
                    if event.get("type") == "ERROR":
                        return  # expired: list again
                    obj = event.get("object") or {}
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._handle(api, obj)
                    elif event.get("type") == "DELETED":
                        self._reported.discard(obj.get("metadata", {}).get("uid", ""))

    def _handle(self, api: Any, pod: dict[str, Any]) -> None:
        from agent.errors import KubeAPIError
        from agent.kubeapi.client import resource_path
        from tests.kube.kubelet_standin import running_status

        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("nodeName") not in self.nodes:
            return
        path = resource_path("", "v1", "pods", meta["name"], namespace=meta["namespace"])
        try:
            if meta.get("deletionTimestamp"):
                api.request("DELETE", path, body={"gracePeriodSeconds": 0},
                            content_type="application/json")
                return
            phase = (pod.get("status") or {}).get("phase")
            if meta["uid"] in self._reported or phase in ("Running", "Succeeded", "Failed"):
                return
            api.patch(path + "/status", running_status(pod), "application/strategic-merge-patch+json")
            self._reported.add(meta["uid"])
        except KubeAPIError as exc:
            if exc.status != 404:  # gone meanwhile: nothing to do
                self.errors.append(str(exc))


@dataclass
class Cluster:
    """kube-controller-manager and kube-scheduler on `plane`, and simulated nodes with real agents."""

    plane: ControlPlane
    binaries: ClusterBinaries
    workdir: Path
    api_qps: int = DEFAULT_API_QPS
    owns_plane: bool = False  # stop() stops the control plane too
    nodes: dict[str, SimNode] = field(default_factory=dict)
    _kcm: _Process | None = None
    _scheduler: _Process | None = None
    _kubelets: SimulatedKubelets | None = None
    controllers: list[_Process] = field(default_factory=list)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start kube-controller-manager and kube-scheduler, wait until both serve, install the NRT CRD."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._kcm = self._start("kube-controller-manager", self._kcm_argv)
            self._scheduler = self._start("kube-scheduler", self._scheduler_argv)
            self._wait_default_service_account()
            self._kubelets = SimulatedKubelets(self.plane)
            self._kubelets.start()
            from tests.kube.kubelet_standin import install_nrt_crd

            with self.plane.client() as api:
                install_nrt_crd(api)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop topolet controllers, agents, kubelets, scheduler and controller manager (idempotent)."""
        self.stop_controllers()
        for node in self.nodes.values():
            if node.agent is not None:
                node.agent.stop()
        if self._kubelets is not None:
            self._kubelets.stop()
            self._kubelets = None
        for proc in (self._scheduler, self._kcm):
            if proc is not None:
                proc.stop()
        self._scheduler = self._kcm = None
        if self.owns_plane:
            self.plane.stop()

    def logs(self, chars: int = 3000) -> str:
        """The tail of every component's and agent's log, for a failing test's output."""
        parts = []
        for proc in (self._kcm, self._scheduler):
            if proc is not None:
                parts.append(f"--- {proc.name} ---\n{proc.log_tail(chars)}")
        for proc in self.controllers:
            parts.append(f"--- {proc.name} ---\n{proc.log_tail(chars)}")
        for node in self.nodes.values():
            if node.agent is not None:
                parts.append(f"--- agent {node.name} ---\n{node.agent.log_tail(chars)}")
        if self._kubelets is not None and self._kubelets.errors:
            parts.append("--- simulated kubelets ---\n" + "\n".join(self._kubelets.errors[-20:]))
        return "\n".join(parts)

    def running(self) -> bool:
        """Whether the controller manager and the scheduler are both alive."""
        return all(p is not None and p.running() for p in (self._kcm, self._scheduler))

    def _kubeconfig(self, component: str, token: str) -> Path:
        return self.plane.write_kubeconfig(self.workdir / f"{component}.kubeconfig", token, user=component)

    def _start(self, name: str, argv_of: Any) -> _Process:
        port = free_port()
        proc = _Process(name, argv_of(port), self.workdir / f"{name}.log")
        deadline = time.monotonic() + READY_TIMEOUT_S
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # a self-signed serving certificate; only /healthz is read
        last = ""
        while time.monotonic() < deadline:
            if not proc.running():
                raise ControlPlaneError(f"{name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=5, context=ctx) as r:
                    if r.status == 200:
                        return proc
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.25)
        proc.stop()
        raise ControlPlaneError(f"{name} not healthy after {READY_TIMEOUT_S:.0f} s ({last}):\n"
                                f"{proc.log_tail()}")

    def _kcm_argv(self, port: int) -> list[str]:
        kc = self._kubeconfig("kube-controller-manager", self.plane.controller_manager_token)
        return [
            str(self.binaries.kube_controller_manager),
            "--kubeconfig", str(kc),
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(self.workdir / "kube-controller-manager-certs"),
            "--leader-elect=false",
            "--controllers", ",".join(CONTROLLERS),
            # Each controller acts as its own service account, with its own RBAC role, as kubeadm sets up.
            "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(self.plane.pki / "sa.key"),
            "--root-ca-file", str(self.plane.ca_file),
            "--kube-api-qps", str(self.api_qps), "--kube-api-burst", str(2 * self.api_qps),
            "--concurrent-job-syncs", "20",
            "--profiling=false",
        ]

    def _scheduler_argv(self, port: int) -> list[str]:
        kc = self._kubeconfig("kube-scheduler", self.plane.scheduler_token)
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kc), "qps": self.api_qps, "burst": 2 * self.api_qps},
            "leaderElection": {"leaderElect": False},
        }
        path = self.workdir / "kube-scheduler.config.json"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        return [
            str(self.binaries.kube_scheduler), "--config", str(path),
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(self.workdir / "kube-scheduler-certs"),
            "--profiling=false",
        ]

    def _wait_default_service_account(self) -> None:
        """The service-account controller is working once namespace `default` has its account."""
        from agent.errors import KubeAPIError

        api = _api(self.plane)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while True:
                try:
                    api.get("/api/v1/namespaces/default/serviceaccounts/default")
                    return
                except KubeAPIError as exc:
                    if exc.status != 404 or time.monotonic() > deadline:
                        raise ControlPlaneError(f"no default service account: {exc}\n{self.logs()}") from exc
                time.sleep(0.25)
        finally:
            api.close()

    # ---- topolet controller ----------------------------------------------------------------------

    def install_placement_policy(self) -> None:
        """Install daemonset/controller/placement-policy.yaml (idempotent) and wait until the API server
        applies it: a dry-run create of a pod it should pin comes back pinned."""
        from tests.conftest import REPO

        api = _api(self.plane)
        try:
            # The label the controller puts on a gated Indexed Job's pod template: the policy's selector.
            install_mutating_policy(api, REPO / PLACEMENT_POLICY,
                                    {"schedulingGates": [{"name": "topolet.io/placement"}]},
                                    {"topolet.io/placements-by-index": "true"})
        finally:
            api.close()

    def start_controller(self, *extra: str, placement_policy: bool = True) -> _Process:
        """Start a `topolet controller` replica (admin credentials) on this cluster; stop() ends it.

        With `placement_policy` the API server pins the pods of admitted Indexed Jobs (see
        install_placement_policy); without, only as long as no earlier call installed it."""
        from tests.conftest import REPO, topolet_bin

        if placement_policy:
            self.install_placement_policy()

        n = len(self.controllers)
        kc = self.plane.write_kubeconfig(self.workdir / "topolet-controller.kubeconfig",
                                         self.plane.admin_token)
        # Metrics on a free port (later flags win): replicas and parallel sessions share this host.
        argv = [topolet_bin(), "controller", "--kubeconfig", str(kc), "--listen", "127.0.0.1:0", *extra]
        proc = _Process(f"topolet-controller-{n}", argv, self.workdir / f"topolet-controller-{n}.log",
                        env={"POD_NAMESPACE": "default", "PYTHONPATH": str(REPO)})
        self.controllers.append(proc)
        return proc

    def stop_controllers(self) -> None:
        """Stop every `topolet controller` replica started here."""
        while self.controllers:
            self.controllers.pop().stop()

    # ---- nodes -----------------------------------------------------------------------------------

    def add_node(self, name: str, fsroot: Path | str, *, labels: Mapping[str, str] | None = None,
                 taints: Sequence[Mapping[str, str]] = (), reserved_cpus: str = "",
                 pods: int = DEFAULT_MAX_PODS, agent: bool = True, agent_args: Iterable[str] = ()) -> SimNode:
        """A Ready Node shaped like the dump at `fsroot`, served by a real agent reading that dump.

        `reserved_cpus` (a cpulist) is kept from pods, as kubelet's reservedSystemCPUs: allocatable
        CPUs are the rest and the agent gets the same list. With `agent=False` only the Node exists
        (its NRT is the caller's to write) and no kubelet reports its pods.
        """
        from agent.topology.cpuset import CPUSet
        from agent.topology.discover import discover

        if name in self.nodes:
            raise ValueError(f"node {name} exists already")
        topology = discover(str(fsroot))
        reserved = CPUSet.parse(reserved_cpus) if reserved_cpus else CPUSet(())
        capacity, allocatable = node_resources(topology, len(reserved & topology.cpus), pods)
        workdir = self.workdir / "nodes" / name
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        node = SimNode(name, Path(fsroot), topology, workdir, reserved_cpus)
        self.create_node_object(name, capacity, allocatable, labels=labels, taints=taints)
        self.nodes[name] = node
        if agent:
            assert self._kubelets is not None, "start() the cluster first"
            self._kubelets.nodes.add(name)
            self.start_agent(node, *agent_args)
        return node

    def create_node_object(self, name: str, capacity: Mapping[str, str], allocatable: Mapping[str, str],
                           *, labels: Mapping[str, str] | None = None,
                           taints: Sequence[Mapping[str, str]] = (), api: Any = None) -> str:
        """Create a Ready Node with these resources (what a kubelet registers and reports); its uid.

        `api`: a KubeClient to use (a bench creating many nodes reuses one); else one of its own.
        """
        own = api is None
        api = _api(self.plane) if own else api
        try:
            made = api.create("/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name, "kubernetes.io/os": "linux",
                                                      "kubernetes.io/arch": "amd64", **(labels or {})}},
            })
            api.patch(f"/api/v1/nodes/{name}/status", {"status": {
                "capacity": dict(capacity), "allocatable": dict(allocatable),
                "conditions": [self._condition("Ready", "True", "KubeletReady")] + [
                    self._condition(kind, "False", f"KubeletHasSufficient{kind[:-8]}")
                    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": name}],
            }}, "application/merge-patch+json")
            # The API server's TaintNodesByCondition admission taints a new Node not-ready; the node
            # lifecycle controller (not run here) lifts it once the Node is Ready. Do its part.
            api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": [dict(t) for t in taints] or None}},
                      "application/merge-patch+json")
            return str(made["metadata"]["uid"])
        finally:
            if own:
                api.close()

    @staticmethod
    def _condition(kind: str, status: str, reason: str) -> dict[str, str]:
        now = _now()
        return {"type": kind, "status": status, "reason": reason, "message": reason,
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    def set_ready(self, name: str, ready: bool) -> None:
        """Set the Node's Ready condition (as a kubelet, or the node lifecycle controller, would)."""
        api = _api(self.plane)
        try:
            api.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [
                self._condition("Ready", "True" if ready else "False",
                                "KubeletReady" if ready else "KubeletNotReady")]}},
                "application/strategic-merge-patch+json")
        finally:
            api.close()

    def start_agent(self, node: SimNode, *extra: str) -> None:
        """Start (or restart) `topolet agent --enforcement off` for `node`, reading its dump."""
        from tests.conftest import REPO, topolet_bin

        if node.agent is not None:
            node.agent.stop()
        kc = self.plane.write_kubeconfig(node.workdir / "agent.kubeconfig", self.plane.admin_token)
        argv = [topolet_bin(), "agent", "--mode", "kubernetes", "--enforcement", "off",
                "--fsroot", str(node.fsroot), "--node-name", node.name, "--kubeconfig", str(kc),
                "--label-sink", "none", "--state-dir", str(node.state_dir),
                "--listen", "127.0.0.1:0", "--reconcile-seconds", "1", *extra]
        if node.reserved_cpus:
            argv += ["--reserved-cpus", node.reserved_cpus]
        env = {"POD_NAMESPACE": "default", "PYTHONPATH": str(REPO)}
        node.agent = _Process(f"agent-{node.name}", argv, node.workdir / "agent.log", env=env)

    def remove_node(self, name: str) -> None:
        """Stop the node's agent and delete its Node (the garbage collector takes its NRT)."""
        from agent.errors import KubeAPIError

        node = self.nodes.pop(name)
        if self._kubelets is not None:
            self._kubelets.nodes.discard(name)
        if node.agent is not None:
            node.agent.stop()
        api = _api(self.plane)
        try:
            with contextlib.suppress(KubeAPIError):
                api.request("DELETE", f"/api/v1/nodes/{name}")
        finally:
            api.close()

    # ---- reading ---------------------------------------------------------------------------------

    def labelled_nodes(self, prefix: str, fsroot: Path | str, count: int = 2) -> tuple[str, list[str]]:
        """`count` nodes shaped like `fsroot` with a label of their own (`test.topolet.io/<tag>`, for a
        test's objects to select), once each has published its NRT: (the label, the node names)."""
        import uuid

        from tests.kube.kubelet_standin import wait_for

        tag = uuid.uuid4().hex[:8]
        label = f"test.topolet.io/{tag}"
        names = [self.add_node(f"{prefix}-{tag}-{i}", fsroot, labels={label: "true"}).name
                 for i in range(count)]
        for name in names:
            wait_for(lambda n=name: self.nrt(n), f"the NRT of {name}")
        return label, names

    def nrt(self, name: str) -> dict[str, Any] | None:
        """The NodeResourceTopology named `name`, or None."""
        from agent.errors import KubeAPIError
        from agent.kubeapi.client import resource_path

        api = _api(self.plane)
        try:
            return dict(api.get(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL, name)))
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise
        finally:
            api.close()


def install_mutating_policy(api: Any, path: Path, canary_spec: Mapping[str, Any],
                            canary_labels: Mapping[str, str] | None = None) -> None:
    """Create the MutatingAdmissionPolicy and binding in `path` (idempotent) and wait until the API
    server applies them: a dry-run create of a canary pod (an index-0 pod with the placements
    annotation "canary-node:0", `canary_labels` and `canary_spec`) comes back with node selector
    kubernetes.io/hostname=canary-node."""
    from agent.errors import KubeAPIError

    for doc in yaml.safe_load_all(path.read_text()):
        kind = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
                "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}[doc["kind"]]
        try:
            api.create(f"/apis/admissionregistration.k8s.io/v1/{kind}", doc)
        except KubeAPIError as exc:
            if exc.status != 409:
                raise
    canary = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": "placement-canary-", "labels": dict(canary_labels or {}), "annotations": {
            "topolet.io/placements": "canary-node:0", "batch.kubernetes.io/job-completion-index": "0"}},
        "spec": {**canary_spec, "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            pod = api.request("POST", "/api/v1/namespaces/default/pods", query={"dryRun": "All"},
                              body=canary, content_type="application/json")
            if (pod["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname") == "canary-node":
                return
        except KubeAPIError as exc:
            if exc.status not in (403, 404, 429) or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{path} not applied after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.25)


def start_cluster(workdir: Path, *, api_qps: int = DEFAULT_API_QPS) -> Cluster:
    """Build what is missing, then start a control plane of its own and a cluster on it."""
    plane = ControlPlane(build_binaries(), workdir / "controlplane")
    binaries = build_cluster_binaries()
    plane.start()
    cluster = Cluster(plane, binaries, workdir / "cluster", api_qps=api_qps, owns_plane=True)
    try:
        cluster.start()
    except BaseException:
        plane.stop()
        raise
    return cluster

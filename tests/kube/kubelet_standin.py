"""A kubelet stand-in: plays the kubelet's part for pods bound to a test node.

THE ONLY STAND-IN in the Kubernetes tests besides the pod-resources gRPC server: the API server,
etcd, the cgroups, the processes and topolet are all real.  No container runtime exists on the test
machine, so this does what kubelet and containerd would do, for real:

- creates the pod's cgroup and one cgroup per container in the REAL cpuset hierarchy, at the path
  `agent.enforce.kubepods` gives for the cgroupfs driver and containerd, under a private test root
  (the agent is pointed at the same root with `--cgroup-root`), the container's cpuset copied from
  its parent as runc does;
- starts a real process (`sleep`) in each container cgroup (the process joins the cgroup before it
  execs, so it never runs outside);
- patches the pod's status through the API server's status subresource, as a kubelet would: phase
  Running, `containerStatuses` with `containerID: containerd://<64 hex>` and a running state,
  `qosClass`.

It also stops containers (process killed, cgroup removed, status terminated), restarts them (a new
container ID, as a runtime does), restarts only the process inside a container (no API needed), and
deletes pods the way kubelet finishes a graceful deletion (kill, clean up, delete with grace 0).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.api.podplan import qos_of
from agent.api.qos import QOSClass
from agent.enforce.cgroup import CgroupLayout, create_cgroup, exists, read_cpuset, read_procs, write_set
from agent.enforce.kubepods import CgroupDriver, container_cgroup_path, pod_cgroup_path
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def join_cgroup(procs_file: str) -> None:
    # In the child between fork and exec: move ourselves ("0" is the writer) into the cgroup.
    fd = os.open(procs_file, os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


_QOS_NAMES = {QOSClass.GUARANTEED: "Guaranteed", QOSClass.BURSTABLE: "Burstable",
              QOSClass.BESTEFFORT: "BestEffort"}


def new_container_id() -> str:
    """A container ID in the form containerd reports it."""
    return f"containerd://{secrets.token_hex(32)}"


def container_status(name: str, uri: str, started_at: str, exit_code: int | None = None,
                     restarts: int = 0) -> dict[str, Any]:
    """One `containerStatuses` entry as kubelet writes it: running, or terminated with `exit_code`."""
    if exit_code is None:
        state: dict[str, Any] = {"running": {"startedAt": started_at}}
    else:
        state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                "startedAt": started_at, "finishedAt": _now(), "containerID": uri}}
    return {"name": name, "containerID": uri, "state": state, "ready": exit_code is None,
            "restartCount": restarts, "image": "registry.k8s.io/pause:3.10",
            "imageID": "registry.k8s.io/pause@sha256:" + "0" * 64, "started": exit_code is None}


def pod_status(qos: QOSClass, statuses: list[dict[str, Any]], started_at: str) -> dict[str, Any]:
    """The status patch kubelet writes for a pod whose containers are `statuses` (container_status)."""
    codes = [s["state"]["terminated"]["exitCode"] for s in statuses if "terminated" in s["state"]]
    phase = "Running"
    if statuses and len(codes) == len(statuses):
        phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
    return {"status": {"phase": phase, "qosClass": _QOS_NAMES[qos], "containerStatuses": statuses,
                       "hostIP": "127.0.0.1", "podIP": "10.244.0.10", "startTime": started_at,
                       "conditions": [{"type": "Ready", "status": "True" if phase == "Running"
                                       else "False", "lastTransitionTime": _now()}]}}



def running_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The status patch kubelet writes once every container of `pod` (an API dict) runs."""
    started = _now()
    statuses = [container_status(c["name"], new_container_id(), started) for c in pod["spec"]["containers"]]
    return pod_status(qos_of(pod), statuses, started)

@dataclass
class Container:
    """One running (or stopped) container of a stand-in pod."""

    name: str
    container_id: str  # bare 64-hex id
    cgroup: str  # relative to the cpuset root of the layout
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_code: int | None = None  # set once stopped

    @property
    def uri(self) -> str:
        return f"containerd://{self.container_id}"

    @property
    def pid(self) -> int:
        assert self.process is not None, f"container {self.name} runs no process"
        return self.process.pid


@dataclass
class Pod:
    """A pod the stand-in runs: API identity, QoS and containers."""

    namespace: str
    name: str
    uid: str
    qos: QOSClass
    containers: dict[str, Container] = field(default_factory=dict)
    started_at: str = field(default_factory=_now)

    @property
    def cgroup(self) -> str:
        return pod_cgroup_path(self.uid, self.qos, CgroupDriver.CGROUPFS)


class KubeletStandIn:
    """Runs pods bound to `node_name` in real cgroups under `layout` and reports them to the API."""

    def __init__(self, api_client: Any, node_name: str, layout: CgroupLayout) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.node_name = node_name
        self.layout = layout
        self.pods: dict[str, Pod] = {}  # uid → pod

    # -- running pods ----------------------------------------------------------------------------

    def start_pod(self, namespace: str, name: str, *, report: bool = True,
                  container_ids: dict[str, str] | None = None,
                  cpusets: dict[str, CPUSet] | None = None) -> Pod:
        """Create the pod's cgroups and processes (as kubelet + runtime would) and report Running.

        `container_ids` names containers the runtime already created (an NRI test's); `cpusets` gives
        a container the cpuset its runtime's adjusted spec says (else runc copies the parent's).
        """
        obj = self._bound_pod(namespace, name)
        pod = self.make_pod_cgroup(namespace, name, obj)
        ids, given = container_ids or {}, cpusets or {}
        for c in obj["spec"]["containers"]:
            pod.containers[c["name"]] = self._run_container(pod, c["name"], ids.get(c["name"]),
                                                            given.get(c["name"]))
        if report:
            self.report(pod)
        return pod

    def _bound_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raw = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        obj: dict[str, Any] = json.loads(raw.data)
        assert obj["spec"].get("nodeName") == self.node_name, "pod is not bound to this node"
        return obj

    def make_pod_cgroup(self, namespace: str, name: str, obj: dict[str, Any] | None = None) -> Pod:
        """Make the pod's cgroup (and its QoS folders), as the kubelet does before the runtime makes
        any container: each new cgroup gets its parent's cpuset, as libcontainer copies it on v1.  A
        pod cgroup made before is left as it is."""
        obj = obj or self._bound_pod(namespace, name)
        uid = obj["metadata"]["uid"]
        pod = self.pods.get(uid) or Pod(namespace, name, uid, qos_of(obj))
        self.pods[uid] = pod
        parts = pod.cgroup.split("/")
        for i in range(1, len(parts) + 1):
            rel, up = "/".join(parts[:i]), "/".join(parts[:i - 1])
            if exists(self.layout, rel):
                continue
            create_cgroup(self.layout, rel, mems=read_cpuset(self.layout, up)[1])
            for attempt in range(20):  # a watcher may narrow the parent between our read and write
                try:
                    write_set(self.layout, rel, "cpus", read_cpuset(self.layout, up)[0])
                    break
                except EnforcementError:
                    if attempt == 19:
                        raise
                    time.sleep(0.01)
        return pod

    def _run_container(self, pod: Pod, name: str, cid: str | None = None,
                       cpus: CPUSet | None = None) -> Container:
        cid = cid or secrets.token_hex(32)
        rel = container_cgroup_path(pod.uid, pod.qos, f"containerd://{cid}", None, CgroupDriver.CGROUPFS)
        # runc copies the parent's, unless the runtime's spec says otherwise (an NRI adjustment).
        create_cgroup(self.layout, rel, mems=read_cpuset(self.layout, pod.cgroup)[1])
        for attempt in range(20):  # a watcher may narrow the pod cgroup between our read and write
            try:
                write_set(self.layout, rel, "cpus", cpus or read_cpuset(self.layout, pod.cgroup)[0])
                break
            except EnforcementError:
                if attempt == 19:
                    raise
                time.sleep(0.01)
        c = Container(name, cid, rel)
        self._spawn(c)
        return c

    def _spawn(self, c: Container) -> None:
        procs = os.path.join(self.layout.abspath(c.cgroup), "cgroup.procs")
        c.process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL,
                                     preexec_fn=lambda: join_cgroup(procs))
        c.exit_code = None

    def status_body(self, pod: Pod) -> dict[str, Any]:
        """The status kubelet would write for `pod` now."""
        return pod_status(pod.qos, [container_status(c.name, c.uri, pod.started_at, c.exit_code, c.restarts)
                                    for c in pod.containers.values()], pod.started_at)

    def report(self, pod: Pod) -> None:
        """Patch the pod's status through the API (status subresource)."""
        self.core.patch_namespaced_pod_status(pod.name, pod.namespace, self.status_body(pod))

    # -- container life --------------------------------------------------------------------------

    def _kill(self, c: Container) -> None:
        if c.process is not None and c.process.poll() is None:
            c.process.send_signal(signal.SIGKILL)
        if c.process is not None:
            c.process.wait()

    def _remove_cgroup(self, rel: str) -> None:
        for _ in range(200):
            if not exists(self.layout, rel):
                return
            try:
                os.rmdir(self.layout.abspath(rel))
                return
            except OSError:
                time.sleep(0.01)  # an exiting process lingers in its cgroup for a moment
        raise AssertionError(f"cannot remove {rel}: {read_procs(self.layout, rel)}")

    def stop_container(self, pod: Pod, name: str, exit_code: int = 0, *, report: bool = True) -> None:
        """The container's process exits; the runtime removes its cgroup; kubelet reports it."""
        c = pod.containers[name]
        self._kill(c)
        self._remove_cgroup(c.cgroup)
        c.exit_code = exit_code
        if report:
            self.report(pod)

    def restart_container(self, pod: Pod, name: str) -> Container:
        """Stop a container and start it again as the runtime does: a new ID, a new cgroup."""
        old = pod.containers[name]
        self._kill(old)
        self._remove_cgroup(old.cgroup)
        new = self._run_container(pod, name)
        new.restarts = old.restarts + 1
        pod.containers[name] = new
        self.report(pod)
        return new

    def restart_process(self, pod: Pod, name: str) -> Container:
        """The process inside a container exits and a new one starts in the same cgroup (no API)."""
        c = pod.containers[name]
        self._kill(c)
        self._spawn(c)
        return c

    def delete_pod(self, pod: Pod) -> None:
        """Finish the pod's deletion as kubelet does: stop everything, clean up, delete with grace 0."""
        self.stop_pod_locally(pod)
        self.core.delete_namespaced_pod(pod.name, pod.namespace, grace_period_seconds=0)

    def stop_pod_locally(self, pod: Pod) -> None:
        """Kill the pod's processes and remove its cgroups (nothing sent to the API)."""
        for c in pod.containers.values():
            self._kill(c)
            self._remove_cgroup(c.cgroup)
        self._remove_cgroup(pod.cgroup)
        self.pods.pop(pod.uid, None)

    def close(self) -> None:
        """Kill every process this stand-in started and remove its cgroups."""
        for pod in list(self.pods.values()):
            self.stop_pod_locally(pod)


# -- the test node: a private cgroup root, a Node object, a namespace, the agent as a real process ----

@dataclass
class KubeNode:
    """One test's node: its cpuset root (passed to the agent as --cgroup-root), API objects, agent."""

    root: str  # absolute path of the private cgroup
    layout: CgroupLayout  # the agent's view: cpuset root `root`, parent "topolet"
    name: str  # the Node's name
    namespace: str
    api: Any  # admin ApiClient
    kubelet: KubeletStandIn
    tmp: Any  # pathlib.Path
    agent: subprocess.Popen[bytes] | None = None
    agent_log: Any = None

    @property
    def state_dir(self) -> str:
        return str(self.tmp / "state")

    def start_agent(self, *extra: str, reconcile_seconds: float = 1.0) -> subprocess.Popen[bytes]:
        """`topolet agent` in Kubernetes mode against this node (admin credentials)."""
        from tests.conftest import REPO, topolet_bin

        kubeconfig = self.tmp / "agent.kubeconfig"
        log = self.tmp / f"agent-{time.monotonic_ns()}.log"
        self.agent_log = log
        argv = [topolet_bin(), "agent", "--mode", "kubernetes", "--kubeconfig", str(kubeconfig),
                "--node-name", self.name, "--state-dir", self.state_dir,
                "--features-dir", str(self.tmp / "features.d"), "--cgroup-root", self.root,
                "--listen", "127.0.0.1:0", "--label-sink", "file",
                "--reconcile-seconds", str(reconcile_seconds), *extra]
        env = {**os.environ, "PYTHONPATH": str(REPO), "POD_NAMESPACE": self.namespace}
        with open(log, "wb") as out:
            self.agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return self.agent

    def log_text(self) -> str:
        return self.agent_log.read_text(errors="replace") if self.agent_log else ""

    def metrics_port(self) -> int | None:
        import re

        m = re.search(r"serving /metrics and /healthz on [^:]*:(\d+)", self.log_text())
        return int(m.group(1)) if m else None

    def metric(self, name: str) -> float:
        """The sum of every sample of metric `name` from the agent's /metrics (0 when absent)."""
        port = self.metrics_port()
        assert port is not None, "agent serves no metrics yet"
        return metric_sum(port, name)

    def healthz(self) -> int:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port()}/healthz", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def stop_agent(self) -> None:
        stop_process(self.agent)

    def create_pod(self, name: str, *, cpu: str | None = None, memory: str | None = None,
                   limits: bool = True, annotations: dict[str, str] | None = None,
                   containers: int = 1, extended: dict[str, str] | None = None) -> str:
        """Create a pod bound to this node through the API; returns its uid.

        `extended` adds extended resources (e.g. {"nvidia.com/gpu": "1"}) to requests and limits.
        """
        resources: dict[str, dict[str, str]] = {}
        if cpu is not None or memory is not None or extended:
            req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
            req.update(extended or {})
            resources = {"requests": req, **({"limits": dict(req)} if limits else {})}
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"nodeName": self.name, "automountServiceAccountToken": False,
                     "containers": [{"name": f"c{i}", "image": "registry.k8s.io/pause:3.10",
                                     "resources": resources} for i in range(containers)]},
        }
        made = k8s.CoreV1Api(self.api).create_namespaced_pod(self.namespace, body)
        return str(made.metadata.uid)

    def run_pod(self, name: str, **kw: Any) -> Pod:
        """Create a pod and have the stand-in start it (cgroups, processes, status Running)."""
        self.create_pod(name, **kw)
        return self.kubelet.start_pod(self.namespace, name)

    def nrt(self) -> dict[str, Any] | None:
        """This node's NodeResourceTopology, or None."""
        return node_nrt(self.api, self.name)

    def nrt_available_cpus(self) -> int | None:
        obj = self.nrt()
        if obj is None:
            return None
        total = 0
        for zone in obj.get("zones") or []:
            for res in zone.get("resources") or []:
                if res["name"] == "cpu":
                    total += int(res["available"])
        return total

    def events(self, uid: str) -> list[Any]:
        """Events recorded on the pod with `uid`."""
        out = k8s.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.uid={uid}")
        return list(out.items)


def metric_sum(port: int, name: str, **labels: str) -> float:
    """The sum of the samples of metric `name` whose labels include `labels`, from 127.0.0.1:port/metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def proc_cpus(pid: int) -> str | None:
    """`Cpus_allowed_list` of a process as the kernel reports it (None once gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    except FileNotFoundError:
        return None
    return None


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 20.0) -> None:
    """SIGTERM `proc` if it still runs, SIGKILL it after `timeout` seconds, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def node_nrt(api: Any, node: str) -> dict[str, Any] | None:
    """The NodeResourceTopology named after `node`, or None while there is none."""
    from kubernetes.client.rest import ApiException

    try:
        obj: dict[str, Any] = k8s.CustomObjectsApi(api).get_cluster_custom_object(
            "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", node)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


def wait_for(check: Any, what: str, timeout: float = 90.0, interval: float = 0.05) -> Any:
    """Poll `check` until truthy; raise AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def install_nrt_crd(api: Any) -> None:
    """Apply daemonset/crds/noderesourcetopologies.yaml (idempotent) and wait until it is served."""
    import yaml
    from kubernetes.client.rest import ApiException

    from tests.conftest import REPO

    body = yaml.safe_load((REPO / "daemonset" / "crds" / "noderesourcetopologies.yaml").read_text())
    ext = k8s.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def served() -> bool:
        try:
            k8s.CustomObjectsApi(api).list_cluster_custom_object(
                "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
            return True
        except ApiException:
            return False

    wait_for(served, "the NodeResourceTopology CRD to be served", timeout=60)


def _remove_tree(root: str) -> None:
    """Remove a private cgroup tree bottom-up, killing what still runs in it (only ours runs there)."""
    for dirpath, dirnames, _ in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
        del dirnames
        for _ in range(200):
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)


@contextmanager
def node_on(plane: Any, system: CgroupLayout, work: Path, prefix: str) -> Iterator[KubeNode]:
    """A node on `plane`: a private cpuset root under `system` with every allowed CPU and memory node,
    a Node, a namespace with its default service account, the NRT CRD, an admin kubeconfig for the
    agent in `work`, and the kubelet stand-in; all removed afterwards."""
    cpus, mems = read_cpuset(system, "", effective=True)
    tag = uuid.uuid4().hex[:8]
    rel = f"{prefix}-{os.getpid()}-{tag}"
    create_cgroup(system, rel, cpus=cpus, mems=mems)
    root = system.abspath(rel)
    api = plane.client()
    core = k8s.CoreV1Api(api)
    node_name, namespace = f"node-{tag}", f"t-{tag}"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}})
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    install_nrt_crd(api)
    plane.write_kubeconfig(work / "agent.kubeconfig", plane.admin_token)
    layout = CgroupLayout(system.version, root)
    node = KubeNode(root, layout, node_name, namespace, api, KubeletStandIn(api, node_name, layout), work)
    try:
        yield node
    finally:
        node.stop_agent()
        node.kubelet.close()
        _remove_tree(root)
        try:
            core.delete_node(node_name)
        except Exception:  # noqa: BLE001 - the API server may be stopped by a failed test
            pass
        api.close()


@pytest.fixture
def kube_node(control_plane: Any, tmp_path: Path) -> Iterator[KubeNode]:
    """A node for one test: private cpuset root, a Node and a namespace in the API, the stand-in."""
    from tests.conftest import require, writable_cpuset_hierarchy

    system = writable_cpuset_hierarchy()
    require(len(read_cpuset(system, "", effective=True)[0]) >= 2, "needs at least 2 CPUs")
    with node_on(control_plane, system, tmp_path, "topolet-kube") as node:
        yield node

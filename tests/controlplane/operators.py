"""Real training operators on Kueue's test cluster: JobSet v0.11.1, Kubeflow Trainer v2.2.0 (TrainJob),
the MPI operator v0.8.0 (MPIJob v2beta1), LeaderWorkerSet v0.8.0; `start_operators(cluster, workdir)`.

Each is built by build.sh from its module dir (`tests/controlplane/<name>/`) and runs as a process with
the cluster's admin kubeconfig. Kueue installs `operator_crds()` (from each module's own manifests)
before it starts, so it sets up their integrations (`FRAMEWORKS`). `Operators.start()` adds each
webhook's Service + EndpointSlice on this host (`webhooks.py`), a serving certificate of our CA (their
own cert management is off: two write to a fixed /tmp path), the webhook configurations trusting it
and the test `ClusterTrainingRuntime`; `stop()` removes the webhook configurations again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tests.controlplane.harness import HERE, ControlPlaneError, _Process, build_components, free_port
from tests.controlplane.webhooks import (
    CRD_PATH,
    create_or_keep,
    install_webhook_endpoint,
    manifests,
    serving_certificate,
    webhook_address,
    webhook_ca,
    with_ca_bundle,
)

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 5.0
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's framework names for the operators' kinds (its pkg/controller/jobs/*/..._controller.go).
FRAMEWORKS = ("jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob", "kubeflow.org/mpijob",
              "leaderworkerset.x-k8s.io/leaderworkerset")
TEST_RUNTIME = "topolet-test-torch"
IMAGE = "busybox"  # never pulled: the test cluster's nodes run no kubelet
# The MPI operator serves /healthz on this fixed port on every interface (cmd/mpi-operator/app): two test
# sessions on one machine take turns through this lock, held while it runs.
MPI_HEALTH_PORT = 8080
MPI_LOCK = Path("/tmp/topolet-mpi-operator.lock")
MPI_LOCK_WAIT_S = 1800.0


@dataclass(frozen=True)
class OperatorSpec:
    """Where an operator's manifests are in its module and how its webhooks are named and served."""

    name: str  # build.sh component and module dir
    module: str
    namespace: str
    crd_dir: str  # a kustomization whose CustomResourceDefinitions are the operator's
    webhook_dir: str | None = None  # a kustomization with its webhook configurations
    name_prefix: str = ""  # what upstream's default overlay prefixes the configurations' names with
    service: str = ""  # its webhook Service


SPECS = (
    OperatorSpec("jobset", "sigs.k8s.io/jobset", "jobset-system", "config/components/crd",
                 "config/components/webhook", "jobset-", "jobset-webhook-service"),
    OperatorSpec("trainer", "github.com/kubeflow/trainer/v2", "kubeflow-system", "manifests/base/crds",
                 "manifests/base/webhook", "", "kubeflow-trainer-controller-manager"),
    OperatorSpec("mpi-operator", "github.com/kubeflow/mpi-operator", "mpi-operator", "manifests/base"),
    OperatorSpec("lws", "sigs.k8s.io/lws", "lws-system", "config/crd", "config/webhook", "lws-",
                 "lws-webhook-service"),
)
NAMES = tuple(s.name for s in SPECS)


def build_operators(names: Sequence[str] = NAMES) -> dict[str, Path]:
    """Build (or find in the cache) the operators through build.sh; name -> binary."""
    return build_components(*names)


@cache
def module_source(name: str) -> Path:
    """The module cache directory of operator `name`'s module, as its module dir's go.mod requires it."""
    spec = next(s for s in SPECS if s.name == name)
    if shutil.which("go") is None:
        raise ControlPlaneError("the Go toolchain (`go`) is not on PATH; the operators' manifests come "
                                "from their modules")
    env = {**os.environ, "GOFLAGS": "-mod=readonly"}
    for argv in (["go", "list", "-m", "-f", "{{.Dir}}", spec.module],
                 ["go", "mod", "download", "-json", spec.module]):
        done = subprocess.run(argv, cwd=HERE / name, capture_output=True, text=True, timeout=600,
                              check=False, env=env)
        out = done.stdout.strip()
        path = Path(json.loads(out).get("Dir", "") if out.startswith("{") else out)
        if done.returncode == 0 and out and (path / spec.crd_dir).is_dir():
            return path
    raise ControlPlaneError(f"no {spec.module} source in the module cache ({done.stderr.strip()[-500:]})")


def operator_crds(names: Sequence[str] = NAMES) -> list[dict[str, Any]]:
    """The operators' CRDs from their modules' manifests (single-version: no conversion webhooks)."""
    out = []
    for spec in SPECS:
        if spec.name in names:
            for doc in manifests(module_source(spec.name) / spec.crd_dir):
                if doc.get("kind") == "CustomResourceDefinition":
                    doc["spec"].pop("conversion", None)
                    out.append(doc)
    return out


def webhook_configurations(spec: OperatorSpec, ca_crt: Path) -> list[dict[str, Any]]:
    """The operator's webhook configurations, named as upstream's default overlay names them, calling
    its Service in its namespace and trusting `ca_crt`."""
    if spec.webhook_dir is None:
        return []
    out = []
    for doc in manifests(module_source(spec.name) / spec.webhook_dir):
        if doc.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            doc["metadata"] = {"name": spec.name_prefix + doc["metadata"]["name"]}
            out.append(with_ca_bundle(doc, ca_crt, spec.namespace, spec.service))
    return out


def _require_free_port(port: int, who: str) -> None:
    """Fail with a clear reason when `port`, which `who` binds on every interface, is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            raise ControlPlaneError(f"{who} binds port {port} on every interface, which is taken: {exc} "
                                    "(another test session running it?)") from exc


def _take_turn(lock: Path, wait_s: float, who: str) -> int:
    """An fd holding the exclusive flock on `lock`, waiting up to `wait_s` for another session's turn."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise ControlPlaneError(f"{who}: another test session held {lock} for {wait_s:.0f} s"
                                        ) from None
            time.sleep(1.0)


def _webhook_plural(kind: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}s"


@dataclass
class Operators:
    """The training operators on `cluster` (admin credentials), webhooks at `address`."""

    cluster: Any  # tests/controlplane/cluster.py Cluster
    binaries: Mapping[str, Path]
    workdir: Path
    address: str = field(default_factory=webhook_address)
    ready_seconds: dict[str, float] = field(default_factory=dict)
    _processes: dict[str, _Process] = field(default_factory=dict)
    _ports: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (webhook, health)
    _mpi_lock: int | None = None  # the fd holding MPI_LOCK while the MPI operator runs

    @property
    def specs(self) -> list[OperatorSpec]:
        return [s for s in SPECS if s.name in self.binaries]

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Install what the operators need, start each, and wait until each answers through the API server."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if "mpi-operator" in self.binaries and self._mpi_lock is None:
                # Another session's turn is waited out before the clock of `timeout_s` starts.
                self._mpi_lock = _take_turn(MPI_LOCK, MPI_LOCK_WAIT_S, "mpi-operator")
            started = time.monotonic()
            self.install()
            for spec in self.specs:
                if not self.running(spec.name):
                    self._processes[spec.name] = self._launch(spec)
            for spec in self.specs:
                self._wait_ready(spec, started + timeout_s)
                self.ready_seconds.setdefault(spec.name, time.monotonic() - started)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every operator and remove their webhook configurations (their CRDs and objects stay)."""
        from agent.errors import KubeAPIError

        for proc in self._processes.values():
            proc.stop(STOP_TIMEOUT_S)
        self._processes.clear()
        if self._mpi_lock is not None:
            os.close(self._mpi_lock)  # releases the lock
            self._mpi_lock = None
        if not self.ca_crt.exists():  # install() never got as far as the webhooks
            return
        api = self._api()
        try:
            for spec in self.specs:
                for doc in webhook_configurations(spec, self.ca_crt):
                    with contextlib.suppress(KubeAPIError):
                        api.request("DELETE", f"{_webhook_plural(doc['kind'])}/{doc['metadata']['name']}")
        finally:
            api.close()

    def running(self, name: str) -> bool:
        """Whether operator `name`'s process is alive."""
        proc = self._processes.get(name)
        return proc is not None and proc.running()

    def log_tail(self, name: str, chars: int = 4000) -> str:
        """The end of operator `name`'s log."""
        try:
            return (self.workdir / name / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def logs(self, chars: int = 3000) -> str:
        """Every operator's log tail, for a failing test's output."""
        return "\n".join(f"--- {s.name} ---\n{self.log_tail(s.name, chars)}" for s in self.specs)

    @property
    def ca_crt(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    def _api(self) -> Any:
        from agent.kubeapi.client import KubeClient

        return KubeClient(self.cluster.plane.client())

    # ---- what they are given ---------------------------------------------------------------------

    def install(self) -> None:
        """CRDs (kept if Kueue made them), namespaces, webhook endpoints, certificates and configurations."""
        webhook_ca(self.workdir / "pki")
        api = self._api()
        try:
            for crd in operator_crds([s.name for s in self.specs]):
                create_or_keep(api, CRD_PATH, crd)
            for spec in self.specs:
                create_or_keep(api, "/api/v1/namespaces", {"metadata": {"name": spec.namespace}})
                if spec.webhook_dir is None:
                    continue
                webhook_port, _ = self._ports.setdefault(spec.name, (free_port(), free_port()))
                install_webhook_endpoint(api, spec.namespace, spec.service, self.address, webhook_port)
                serving_certificate(self.ca_crt, self._cert_dir(spec),
                                    f"{spec.service}.{spec.namespace}.svc")
                for doc in webhook_configurations(spec, self.ca_crt):
                    create_or_keep(api, _webhook_plural(doc["kind"]), doc)
        finally:
            api.close()

    def _cert_dir(self, spec: OperatorSpec) -> Path:
        if spec.name == "trainer":
            # Trainer's webhook server takes controller-runtime's default, under $TMPDIR.
            return self.workdir / spec.name / "tmp" / "k8s-webhook-server" / "serving-certs"
        return self.workdir / spec.name / "serving-certs"

    def _configuration(self, spec: OperatorSpec) -> dict[str, Any]:
        """The --config file of a controller-runtime operator: webhooks here, metrics off, probes on
        loopback, no leader election, no cert management of its own."""
        webhook_port, health_port = self._ports[spec.name]
        group = {"jobset": "config.jobset.x-k8s.io", "lws": "config.lws.x-k8s.io",
                 "trainer": "config.trainer.kubeflow.org"}[spec.name]
        config: dict[str, Any] = {
            "apiVersion": f"{group}/v1alpha1", "kind": "Configuration",
            "webhook": {"port": webhook_port, "host": self.address},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "leaderElection": {"leaderElect": False},
        }
        if spec.name == "trainer":
            config["health"].update(readinessEndpointName="readyz", livenessEndpointName="healthz")
            config["certManagement"] = {"enable": False, "webhookServiceName": spec.service,
                                        "webhookSecretName": "kubeflow-trainer-webhook-cert"}
        else:
            config["webhook"]["certDir"] = str(self._cert_dir(spec))
            config["internalCertManagement"] = {"enable": False}
        return config

    def _launch(self, spec: OperatorSpec) -> _Process:
        workdir = self.workdir / spec.name
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = str(self.cluster.plane.kubeconfig)
        binary = str(self.binaries[spec.name])
        env = {"KUBECONFIG": kubeconfig, "TMPDIR": str(workdir / "tmp")}
        (workdir / "tmp").mkdir(exist_ok=True)
        if spec.name == "mpi-operator":
            if self._mpi_lock is None:
                self._mpi_lock = _take_turn(MPI_LOCK, MPI_LOCK_WAIT_S, spec.name)
            _require_free_port(MPI_HEALTH_PORT, spec.name)
            argv = [binary, "--kubeConfig", kubeconfig, "--lock-namespace", spec.namespace,
                    "--kube-api-qps", "50", "--kube-api-burst", "100"]
        else:
            config = workdir / "config.json"
            config.write_text(json.dumps(self._configuration(spec), indent=1))  # JSON is YAML
            argv = [binary, "--config", str(config), "--kubeconfig", kubeconfig]
            if spec.name == "lws":
                argv.append("--leader-elect=false")  # the flag's default (true) wins over the file's
        return _Process(spec.name, argv, workdir / f"{spec.name}.log", env=env)

    # ---- readiness -------------------------------------------------------------------------------

    def _wait_ready(self, spec: OperatorSpec, deadline: float) -> None:
        """Its probe passes and an object of its kind goes through its webhooks (the runtime is created
        for Trainer; a dry run for JobSet and LWS); the MPI operator holds its Lease."""
        from agent.errors import KubeAPIError

        probe = self._readiness_probe(spec)
        last = ""
        api = self._api()
        try:
            while time.monotonic() < deadline:
                if not self.running(spec.name):
                    raise ControlPlaneError(f"{spec.name} exited with "
                                            f"{self._processes[spec.name].popen.returncode}:\n"
                                            f"{self.log_tail(spec.name)}")
                try:
                    if probe(api):
                        return
                    last = "not ready"
                except (OSError, urllib.error.URLError) as exc:
                    last = f"probe: {exc}"
                except KubeAPIError as exc:
                    last = str(exc)
                time.sleep(0.2)
        finally:
            api.close()
        raise ControlPlaneError(f"{spec.name} not ready in time ({last}):\n{self.log_tail(spec.name)}")

    def _readiness_probe(self, spec: OperatorSpec) -> Callable[[Any], bool]:
        if spec.name == "mpi-operator":
            def leader(api: Any) -> bool:
                leases = f"/apis/coordination.k8s.io/v1/namespaces/{spec.namespace}/leases"
                lease = api.get(f"{leases}/mpi-operator")
                return bool((lease.get("spec") or {}).get("holderIdentity"))
            return leader
        _, health_port = self._ports[spec.name]

        def answers(api: Any) -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=5) as resp:
                    if resp.status != 200:
                        return False
            except urllib.error.HTTPError:
                return False
            if spec.name == "trainer":
                create_or_keep(api, runtime_path(), cluster_training_runtime())
                return True
            canary = jobset if spec.name == "jobset" else leaderworkerset
            body = canary("ready-canary", None)
            api.request("POST", collection_path(body["kind"], "default"), query={"dryRun": "All"}, body=body,
                        content_type="application/json")
            return True
        return answers


def start_operators(cluster: Any, workdir: Path, names: Sequence[str] = NAMES) -> Operators:
    """Build what is missing and start the operators `names` on `cluster` (stop() ends them)."""
    operators = Operators(cluster, build_operators(names), workdir)
    operators.start()
    return operators


# ---- object bodies -------------------------------------------------------------------------------

_API = {"JobSet": ("jobset.x-k8s.io/v1alpha2", "jobsets"),
        "TrainJob": ("trainer.kubeflow.org/v1alpha1", "trainjobs"),
        "ClusterTrainingRuntime": ("trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes"),
        "MPIJob": ("kubeflow.org/v2beta1", "mpijobs"),
        "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkersets")}


def collection_path(kind: str, namespace: str | None) -> str:
    """The URL path of the collection of `kind` (one of the operators' kinds) in `namespace`."""
    api_version, plural = _API[kind]
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{api_version}{scope}/{plural}"


def runtime_path() -> str:
    return collection_path("ClusterTrainingRuntime", None)


def _meta(name: str, queue: str | None) -> dict[str, Any]:
    return {"name": name, "labels": {QUEUE_LABEL: queue} if queue else {}}


def _pod_spec(container: str, requests: Mapping[str, str], restart: str = "Never") -> dict[str, Any]:
    res = dict(requests)
    return {"restartPolicy": restart, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": container, "image": IMAGE, "command": ["sleep", "3600"],
                            "resources": {"requests": res, "limits": res}}]}


DEFAULT_REQUESTS = {"cpu": "100m", "memory": "32Mi"}


def jobset(name: str, queue: str | None, *, replicas: int = 2, pods: int = 3,
           requests: Mapping[str, str] = DEFAULT_REQUESTS) -> dict[str, Any]:
    """A JobSet of one replicatedJob: `replicas` Indexed Jobs of `pods` pods each."""
    job = {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 0,
           "template": {"spec": _pod_spec("main", requests)}}
    return {"apiVersion": _API["JobSet"][0], "kind": "JobSet", "metadata": _meta(name, queue),
            "spec": {"suspend": queue is not None,
                     "replicatedJobs": [{"name": "workers", "replicas": replicas,
                                         "template": {"spec": job}}]}}


def cluster_training_runtime(name: str = TEST_RUNTIME) -> dict[str, Any]:
    """The tests' ClusterTrainingRuntime: torch-distributed-like, one replicatedJob `node` (a JobSet of
    one Job whose pods are the TrainJob's nodes)."""
    node_job = {"template": {"spec": {"containers": [{"name": "node", "image": IMAGE,
                                                      "command": ["sleep", "3600"]}]}}}
    return {"apiVersion": _API["ClusterTrainingRuntime"][0], "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                     "template": {"spec": {"replicatedJobs": [{
                         "name": "node",
                         "template": {"metadata": {"labels": {
                             "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                             "spec": node_job}}]}}}}


def trainjob(name: str, queue: str | None, *, nodes: int = 6, runtime: str = TEST_RUNTIME,
             requests: Mapping[str, str] = DEFAULT_REQUESTS) -> dict[str, Any]:
    """A TrainJob of `nodes` nodes on ClusterTrainingRuntime `runtime`."""
    return {"apiVersion": _API["TrainJob"][0], "kind": "TrainJob", "metadata": _meta(name, queue),
            "spec": {"suspend": queue is not None,
                     "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                    "name": runtime},
                     "trainer": {"numNodes": nodes, "resourcesPerNode": {"requests": dict(requests)}}}}


def mpijob(name: str, queue: str | None, *, workers: int = 6,
           requests: Mapping[str, str] = DEFAULT_REQUESTS) -> dict[str, Any]:
    """An MPIJob (v2beta1) of one launcher and `workers` workers, one slot each."""
    def replica(count: int, container: str) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "Never",
                "template": {"spec": _pod_spec(container, requests)}}
    return {"apiVersion": _API["MPIJob"][0], "kind": "MPIJob", "metadata": _meta(name, queue),
            "spec": {"slotsPerWorker": 1,
                     "runPolicy": {"cleanPodPolicy": "Running", "suspend": queue is not None},
                     "mpiReplicaSpecs": {"Launcher": replica(1, "launcher"),
                                         "Worker": replica(workers, "worker")}}}


def leaderworkerset(name: str, queue: str | None, *, replicas: int = 2, size: int = 3,
                    requests: Mapping[str, str] = DEFAULT_REQUESTS) -> dict[str, Any]:
    """A LeaderWorkerSet of `replicas` groups of `size` pods (a leader and size-1 workers)."""
    return {"apiVersion": _API["LeaderWorkerSet"][0], "kind": "LeaderWorkerSet",
            "metadata": _meta(name, queue),
            "spec": {"replicas": replicas,
                     "leaderWorkerTemplate": {"size": size,
                                              "workerTemplate": {"spec": _pod_spec("main", requests,
                                                                                   "Always")}}}}


def annotate_pods(body: dict[str, Any], annotations: Mapping[str, str],
                  labels: Mapping[str, str] | None = None, *, runtime_job: str = "node",
                  manager: str = "tests.topolet.io/pods") -> dict[str, Any]:
    """`body` (a batch/v1 Job or one of the operators' kinds, changed in place) with `annotations` and
    `labels` on every pod it makes: on each pod template it holds; a TrainJob's pods come from its
    runtime's template, so there through the tenant's own runtime patch (`manager`) of the runtime's
    replicated job `runtime_job`."""
    meta = {"annotations": dict(annotations), **({"labels": dict(labels)} if labels else {})}
    spec = body["spec"]
    if body["kind"] == "TrainJob":
        spec.setdefault("runtimePatches", []).append({"manager": manager, "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": runtime_job, "template": {"spec": {
                "template": {"metadata": meta}}}}]}}}})
        return body
    if body["kind"] == "Job":
        templates = [spec["template"]]
    elif body["kind"] == "JobSet":
        templates = [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    elif body["kind"] == "MPIJob":
        templates = [r["template"] for r in spec["mpiReplicaSpecs"].values()]
    elif body["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        templates = [lwt[k] for k in ("leaderTemplate", "workerTemplate") if k in lwt]
    else:
        raise ValueError(f"no pod templates known in a {body['kind']}")
    for template in templates:
        mine = template.setdefault("metadata", {})
        for key, values in meta.items():
            mine[key] = {**(mine.get(key) or {}), **values}
    return body

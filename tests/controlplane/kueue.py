"""Real Kueue (its manager, `sigs.k8s.io/kueue/cmd/kueue` v0.17.0) as a process on a test `Cluster`.

For Kueue's tests (`tests/kueue/`), the topology-fit check's tests and `bench/kueue.py`:

    kueue = start_kueue(workdir)              # a control plane, cluster and Kueue of its own
    kueue.cluster                             # tests/controlplane/cluster.py: nodes, logs, the plane
    kueue.ready_seconds                       # process start -> its webhooks answer through the API server
    kueue.log_tail(), kueue.running(), kueue.restart(), kueue.stop(), kueue.stop_all()
    kueue.metrics_text()                      # Kueue's own /metrics (Prometheus text)

    Kueue(cluster, build_kueue(), workdir).start()   # on a cluster you started (installs what it needs)

`KueueObjects(api)` creates ResourceFlavors, ClusterQueues, LocalQueues and AdmissionChecks
(`kueue.x-k8s.io/v1beta2`), sets a check's Active condition, finds a Job's Workload, and deletes
everything it created with `delete_created()`; `cluster_queue()`, `local_queue()` and the other
builders return the bodies alone.

What `Kueue.start()` puts on the cluster (idempotent, so a restart reuses it):

- Kueue's CRDs from the fetched module's `config/components/crd/bases`, with the conversion webhooks
  `config/components/crd/kustomization.yaml` patches in, pointed at Kueue's webhook Service, and
  the training operators' CRDs (`operators.py`);
- Kueue's own RBAC (`manager_rbac()`): what upstream's `config/components/rbac` ships, named and
  namespaced as its `config/default` renders it, so the manager runs as the service account
  `kueue-system/kueue-controller-manager` with its ClusterRole `kueue-manager-role` and its Roles in
  `kueue-system` (leader election, its webhook Secret), as a cluster installed from Kueue's release
  manifests runs it. Policies that name Kueue's manager (the kueue component's exemption in
  `topolet-admission-fields`) see that identity here, not an administrator's;
- namespace `kueue-system`, the empty Secret `kueue-webhook-server-cert` that Kueue's internal cert
  management fills, and the Service `kueue-webhook-service` without a selector, plus an EndpointSlice
  for it on a non-loopback address of this host (`webhook_address()`). The API server runs with
  `--enable-aggregator-routing=true` (harness.py), so it calls webhooks at the EndpointSlice's address;
  the Service's ClusterIP is never dialled (with no kube-proxy it leads nowhere near Kueue), and loopback
  addresses are refused in endpoints;
- the webhook configurations of `config/components/webhook/manifests.yaml` with that component's
  kustomization patches, named and pointed as upstream's `config/default` names them
  (`kueue-mutating-webhook-configuration`, `kueue-validating-webhook-configuration`). Kueue injects
  its CA into them and into the CRDs at start.

Kueue's internal cert management writes its CA and serving cert into that Secret and then waits for a
kubelet to mount it at its cert dir; `SecretVolume` (a thread of the test process) plays that part.
The webhook route was proven both ways: without `--enable-aggregator-routing` the API server dials the
Service's ClusterIP, which nothing here serves, and Kueue never becomes ready.

Kueue runs with the `batch/job`, `statefulset` and `pod` integrations (plain pod groups) and those of
the training operators (`operators.py`: JobSet, Trainer's TrainJob, MPIJob, LeaderWorkerSet), whose
CRDs it installs before it starts; its webhooks on the address above, leader election off unless
asked (then on a Lease in `kueue-system`), the visibility API server off, metrics and probes on free
loopback ports, and in its kubeconfig a token of its service account (with `as_admin`, the admin's:
system:masters, which every policy skips).
Its client limit is `api_qps` (burst twice that) and its reconcilers per kind upstream's manager
config's, unless `concurrency` raises them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.controlplane.cluster import Cluster, start_cluster
from tests.controlplane.harness import HERE, ControlPlaneError, _Process, build_components, free_port
from tests.controlplane.operators import FRAMEWORKS, operator_crds
from tests.controlplane.webhooks import (
    SecretVolume,
    create_or_keep,
    install_webhook_endpoint,
    load_yaml_docs,
    wait_crds_established,
    webhook_address,
)

MODULE = "sigs.k8s.io/kueue"
MODULE_DIR = HERE / "kueue"  # the Go module that pins Kueue's version
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
# Upstream's config/default prefixes every object name with this (its kustomization's namePrefix)
# and puts the namespaced ones in NAMESPACE (config/components/rbac writes them in "system").
NAME_PREFIX = "kueue-"
UPSTREAM_NAMESPACE = "system"
# The manager's service account (config/components/rbac/service_account.yaml, so named by config/default).
SERVICE_ACCOUNT = NAME_PREFIX + "controller-manager"
MANAGER_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
# The manager's token outlives any session or bench here (the API server sets no maximum).
TOKEN_SECONDS = 24 * 3600
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CHECK_CONTROLLER = "topolet.io/topology-fit"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 5.0
# Kueue's manager reads a Configuration of this version (v1beta1 is still read too).
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
# Upstream's manager config (config/components/manager/controller_manager_config.yaml) sets these.
GROUP_KIND_CONCURRENCY = {
    "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 5, "LocalQueue.kueue.x-k8s.io": 1,
    "Cohort.kueue.x-k8s.io": 1, "ClusterQueue.kueue.x-k8s.io": 1, "ResourceFlavor.kueue.x-k8s.io": 1,
}
# A bench queues thousands of Jobs; Kueue's default client limit (20/s) would measure the limiter.
DEFAULT_API_QPS = 500


def build_kueue() -> Path:
    """Build (or find in the cache) Kueue's manager through build.sh; the binary's path."""
    return build_components("kueue")["kueue"]


@cache
def module_dir() -> Path:
    """Where the Go module cache holds the Kueue source that MODULE_DIR's go.mod requires."""
    if shutil.which("go") is None:
        raise ControlPlaneError("the Go toolchain (`go`) is not on PATH; Kueue's manifests come from "
                                "its module")
    done = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", MODULE], cwd=MODULE_DIR,
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "GOFLAGS": "-mod=readonly"})
    path = Path(done.stdout.strip())
    if done.returncode != 0 or not (path / "config" / "components").is_dir():
        raise ControlPlaneError(f"no {MODULE} source in the module cache ({done.stderr.strip()[-500:]}); "
                                "run tests/controlplane/build.sh kueue")
    return path


def crds(source: Path) -> list[dict[str, Any]]:
    """Kueue's CRDs from `source`'s config, with the conversion webhooks upstream's kustomization adds."""
    crd_dir = source / "config" / "components" / "crd"
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    conversion: dict[str, dict[str, Any]] = {}
    for patch in kustomization.get("patches") or []:
        for doc in load_yaml_docs(crd_dir / patch["path"]):
            spec = doc.get("spec", {}).get("conversion")
            if spec and spec.get("strategy") == "Webhook":
                conversion[doc["metadata"]["name"]] = spec
    out = []
    for resource in kustomization["resources"]:
        for doc in load_yaml_docs(crd_dir / resource):
            spec = conversion.get(doc["metadata"]["name"])
            if spec is not None:
                spec = json.loads(json.dumps(spec))
                spec["webhook"]["clientConfig"]["service"].update(namespace=NAMESPACE, name=WEBHOOK_SERVICE)
                doc["spec"]["conversion"] = spec
            out.append(doc)
    return out


def webhook_configurations(source: Path) -> list[dict[str, Any]]:
    """Kueue's mutating and validating webhook configurations as upstream's config/default renders them."""
    hook_dir = source / "config" / "components" / "webhook"
    kustomization = yaml.safe_load((hook_dir / "kustomization.yaml").read_text())
    # The component's inline patches set fields (namespaceSelector) of webhooks matched by name.
    fields_of: dict[tuple[str, str], dict[str, Any]] = {}
    for patch in kustomization.get("patches") or []:
        doc = yaml.safe_load(patch["patch"])
        for hook in doc.get("webhooks") or []:
            fields_of[(doc["kind"], hook["name"])] = {k: v for k, v in hook.items() if k != "name"}
    out = []
    for doc in load_yaml_docs(hook_dir / "manifests.yaml"):
        doc["metadata"] = {"name": NAME_PREFIX + doc["metadata"]["name"]}
        for hook in doc["webhooks"]:
            hook.update(fields_of.get((doc["kind"], hook["name"]), {}))
            hook["clientConfig"]["service"].update(namespace=NAMESPACE, name=WEBHOOK_SERVICE)
        out.append(doc)
    return out


def manager_rbac(source: Path) -> list[dict[str, Any]]:
    """Kueue's RBAC from `source`'s config/components/rbac (its kustomization's resources) as upstream's
    config/default renders it: every name prefixed with NAME_PREFIX (role references and service
    account subjects too), the namespaced objects and their subjects in NAMESPACE."""
    rbac_dir = source / "config" / "components" / "rbac"
    kustomization = yaml.safe_load((rbac_dir / "kustomization.yaml").read_text())
    out = []
    for resource in kustomization["resources"]:
        for doc in load_yaml_docs(rbac_dir / resource):
            meta = doc["metadata"]
            meta["name"] = NAME_PREFIX + meta["name"]
            if "namespace" in meta:
                meta["namespace"] = NAMESPACE
            if "roleRef" in doc:
                doc["roleRef"]["name"] = NAME_PREFIX + doc["roleRef"]["name"]
            for subject in doc.get("subjects") or []:
                if subject["kind"] == "ServiceAccount" and subject.get("namespace") == UPSTREAM_NAMESPACE:
                    subject.update(name=NAME_PREFIX + subject["name"], namespace=NAMESPACE)
            out.append(doc)
    return out


def _rbac_path(doc: Mapping[str, Any]) -> str:
    """The collection a ServiceAccount or an rbac.authorization.k8s.io object is created in."""
    from agent.kubeapi.client import resource_path

    kind, namespace = doc["kind"], doc["metadata"].get("namespace")
    if kind == "ServiceAccount":
        return resource_path("", "v1", "serviceaccounts", namespace=namespace)
    return resource_path("rbac.authorization.k8s.io", "v1", kind.lower() + "s", namespace=namespace)


@dataclass
class Kueue:
    """Kueue's manager on `cluster`, serving its webhooks at `address`:`webhook_port`."""

    cluster: Cluster
    binary: Path
    workdir: Path
    leader_elect: bool = False
    api_qps: int = DEFAULT_API_QPS
    # The admin's token (system:masters) instead of Kueue's own service account and RBAC.
    as_admin: bool = False
    # Reconcilers run at once per kind, over upstream's GROUP_KIND_CONCURRENCY (see start_kueue).
    concurrency: Mapping[str, int] = field(default_factory=dict)
    owns_cluster: bool = False  # stop_all() stops the cluster (and its control plane) too
    address: str = field(default_factory=webhook_address)
    webhook_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    ready_seconds: float | None = None  # the last start's: process start to webhooks answering
    _process: _Process | None = None
    _volume: SecretVolume | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Install what Kueue needs, start its manager and wait until the API server reaches its webhooks."""
        if self.running():
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.install()
        config = self.workdir / "kueue-config.json"
        config.write_text(json.dumps(self.configuration(), indent=1))  # JSON is YAML
        plane = self.cluster.plane
        token = (plane.admin_token if self.as_admin
                 else plane.mint_token(NAMESPACE, SERVICE_ACCOUNT, expiration_seconds=TOKEN_SECONDS))
        kubeconfig = plane.write_kubeconfig(self.workdir / "kueue.kubeconfig", token, user="kueue")
        argv = [str(self.binary), "--config", str(config), "--kubeconfig", str(kubeconfig)]
        started = time.monotonic()
        self._volume = SecretVolume(self.cluster.plane, NAMESPACE, WEBHOOK_SECRET, self.cert_dir)
        self._volume.start()
        self._process = _Process("kueue", argv, self.workdir / "kueue.log")
        try:
            self._wait_ready(started + timeout_s)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Stop Kueue's manager (idempotent); what it installed stays on the cluster."""
        if self._process is not None:
            # Kueue drains for up to 30 s on SIGTERM; nothing here needs its Lease released or work finished.
            self._process.stop(STOP_TIMEOUT_S)
            self._process = None
        if self._volume is not None:
            self._volume.stop()
            self._volume = None

    def restart(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Stop and start Kueue's manager on the same ports and cluster."""
        self.stop()
        self.start(timeout_s)

    def stop_all(self) -> None:
        """Stop Kueue, and the cluster when this Kueue started it (start_kueue)."""
        self.stop()
        if self.owns_cluster:
            self.cluster.stop()

    def running(self) -> bool:
        """Whether Kueue's manager process is alive."""
        return self._process is not None and self._process.running()

    def log_tail(self, chars: int = 6000) -> str:
        """The end of Kueue's log (all its starts, appended)."""
        log = self.workdir / "kueue.log"
        try:
            return log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    @property
    def cert_dir(self) -> Path:
        """Where Kueue reads its webhook serving cert (the Secret's files, see SecretVolume)."""
        return self.workdir / "serving-certs"

    def _api(self) -> Any:
        from agent.kubeapi.client import KubeClient

        return KubeClient(self.cluster.plane.client())

    def metrics_text(self) -> str:
        """Kueue's Prometheus metrics (/metrics over HTTPS behind token review; the admin's token)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # controller-runtime's self-signed metrics certificate
        req = urllib.request.Request(f"https://127.0.0.1:{self.metrics_port}/metrics",
                                     headers={"Authorization": f"Bearer {self.cluster.plane.admin_token}"})
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return str(resp.read().decode())

    # ---- what it is given ------------------------------------------------------------------------

    def configuration(self) -> dict[str, Any]:
        """The Configuration file Kueue's manager reads (--config)."""
        election: dict[str, Any] = {"leaderElect": False}
        if self.leader_elect:
            election = {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io",
                        "resourceNamespace": NAMESPACE, "resourceLock": "leases"}
        return {
            "apiVersion": CONFIG_API_VERSION, "kind": "Configuration",
            "namespace": NAMESPACE,
            "manageJobsWithoutQueueName": False,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}",
                       "readinessEndpointName": "/readyz", "livenessEndpointName": "/healthz"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": self.address, "port": self.webhook_port,
                        "certDir": str(self.cert_dir)},
            "leaderElection": election,
            "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                       "webhookSecretName": WEBHOOK_SECRET},
            "clientConnection": {"qps": self.api_qps, "burst": 2 * self.api_qps},
            "controller": {"groupKindConcurrency": {**GROUP_KIND_CONCURRENCY, **self.concurrency}},
            # StatefulSets and plain pod groups too: the StatefulSet's and the LeaderWorkerSet's bring the
            # pod integration only for their own pods (Kueue skips a pod without a parent unless `pod`
            # is listed).
            "integrations": {"frameworks": ["batch/job", "statefulset", "pod", *FRAMEWORKS]},
            # The on-demand visibility API is an aggregated API server of its own: nothing here reads it.
            "featureGates": {"VisibilityOnDemand": False},
        }

    def install(self) -> None:
        """Install Kueue's CRDs, namespace, RBAC, Secret, webhook Service + EndpointSlice and webhooks."""
        from agent.kubeapi.client import resource_path

        source = module_dir()
        api = self._api()
        try:
            crd_path = resource_path("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            # The training operators' CRDs too: Kueue sets up an integration only for a kind it finds
            # served when it starts (operators.py starts the operators themselves).
            every_crd = crds(source) + operator_crds()
            for crd in every_crd:
                create_or_keep(api, crd_path, crd)
            create_or_keep(api, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            for doc in manager_rbac(source):
                create_or_keep(api, _rbac_path(doc), doc)
            create_or_keep(api, resource_path("", "v1", "secrets", namespace=NAMESPACE),
                            {"metadata": {"name": WEBHOOK_SECRET}})
            self._install_webhook_endpoint(api)
            for doc in webhook_configurations(source):
                plural = doc["kind"].lower() + "s"
                create_or_keep(api, resource_path("admissionregistration.k8s.io", "v1", plural), doc)
            wait_crds_established(api, [c["metadata"]["name"] for c in every_crd], READY_TIMEOUT_S)
        finally:
            api.close()

    def _install_webhook_endpoint(self, api: Any) -> None:
        """The webhook Service (no selector) and its EndpointSlice at address:webhook_port (replaced)."""
        install_webhook_endpoint(api, NAMESPACE, WEBHOOK_SERVICE, self.address, self.webhook_port)

    # ---- readiness -------------------------------------------------------------------------------

    def _wait_ready(self, deadline: float) -> None:
        """Kueue's /readyz says its certs are in place and its webhook server listens; then a dry-run Job
        through the API server comes back suspended by Kueue's Job webhook (the whole path works)."""
        from agent.errors import KubeAPIError

        proc = self._process
        assert proc is not None
        last = ""
        api = self._api()
        try:
            while time.monotonic() < deadline:
                if not proc.running():
                    raise ControlPlaneError(f"kueue exited with {proc.popen.returncode}:\n{self.log_tail()}")
                try:
                    if not self._probe_ready():
                        last = "/readyz: not ready"
                    elif self._job_webhook_answers(api):
                        return
                    else:
                        last = "the Job webhook did not suspend a queued Job"
                except (OSError, urllib.error.URLError) as exc:
                    last = f"/readyz: {exc}"
                except KubeAPIError as exc:
                    last = str(exc)
                time.sleep(0.2)
        finally:
            api.close()
        volume = self._volume.errors[-3:] if self._volume is not None else []
        raise ControlPlaneError(f"kueue not ready in time ({last}); secret volume errors {volume}:\n"
                                f"{self.log_tail()}")

    def _probe_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False

    @staticmethod
    def _job_webhook_answers(api: Any) -> bool:
        canary = job("kueue-canary", "kueue-canary-queue", suspend=False)
        out = api.request("POST", "/apis/batch/v1/namespaces/default/jobs", query={"dryRun": "All"},
                          body=canary, content_type="application/json")
        return bool(out["spec"].get("suspend"))


def start_kueue(workdir: Path, *, leader_elect: bool = False, api_qps: int = DEFAULT_API_QPS,
                concurrency: Mapping[str, int] | None = None, as_admin: bool = False) -> Kueue:
    """Build what is missing, then start a control plane, cluster and Kueue of their own (stop_all()).

    `concurrency` overrides upstream's reconcilers per kind (`controller.groupKindConcurrency`, e.g.
    {"Workload.kueue.x-k8s.io": 20}): each reconcile that writes waits a round trip through the API
    server and Kueue's own webhook, so a kind's writes per second are at most its workers over that.
    `as_admin` runs the manager with the admin's token rather than its own service account's."""
    binary = build_kueue()
    cluster = start_cluster(workdir / "cluster", api_qps=api_qps)
    kueue = Kueue(cluster, binary, workdir / "kueue", leader_elect=leader_elect, api_qps=api_qps,
                  concurrency=dict(concurrency or {}), owns_cluster=True, as_admin=as_admin)
    try:
        kueue.start()
    except BaseException:
        cluster.stop()
        raise
    return kueue


# ---- object bodies -------------------------------------------------------------------------------


def _kueue_object(kind: str, name: str, spec: Mapping[str, Any], namespace: str | None = None
                  ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": meta, "spec": dict(spec)}


def resource_flavor(name: str, node_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ResourceFlavor, optionally for the nodes with `node_labels`."""
    return _kueue_object("ResourceFlavor", name, {"nodeLabels": dict(node_labels)} if node_labels else {})


def cluster_queue(name: str, flavor: str, quota: Mapping[str, str], *,
                  admission_checks: Sequence[str] = (), namespace_selector: Mapping[str, Any] | None = None,
                  queueing_strategy: str = "BestEffortFIFO") -> dict[str, Any]:
    """A ClusterQueue with `quota` (resource -> nominal quantity) of one flavor, for every namespace
    unless a selector is given, with `admission_checks` (AdmissionCheck names) on every flavor."""
    spec: dict[str, Any] = {
        "namespaceSelector": dict(namespace_selector or {}),
        "queueingStrategy": queueing_strategy,
        "resourceGroups": [{
            "coveredResources": list(quota),
            "flavors": [{"name": flavor, "resources": [
                {"name": r, "nominalQuota": q} for r, q in quota.items()]}],
        }],
    }
    if admission_checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in admission_checks]}
    return _kueue_object("ClusterQueue", name, spec)


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    """A LocalQueue in `namespace` feeding `cluster_queue_name`."""
    return _kueue_object("LocalQueue", name, {"clusterQueue": cluster_queue_name}, namespace)


def admission_check(name: str, controller_name: str = CHECK_CONTROLLER) -> dict[str, Any]:
    """An AdmissionCheck handled by `controller_name` (topolet's topology-fit check by default)."""
    return _kueue_object("AdmissionCheck", name, {"controllerName": controller_name})


def job(name: str, queue: str, *, parallelism: int = 1, completions: int | None = None,
        requests: Mapping[str, str] | None = None, suspend: bool = True, indexed: bool = False,
        annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A batch/v1 Job for LocalQueue `queue` (label kueue.x-k8s.io/queue-name); one pause container."""
    res = dict(requests or {"cpu": "1", "memory": "64Mi"})
    template: dict[str, Any] = {
        "metadata": {"annotations": dict(annotations or {})},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"requests": res, "limits": res}}]},
    }
    spec: dict[str, Any] = {"parallelism": parallelism, "completions": completions or parallelism,
                            "suspend": suspend, "template": template}
    if indexed:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}}, "spec": spec}


# ---- a test's objects ----------------------------------------------------------------------------


def kueue_path(plural: str, name: str | None = None, *, namespace: str | None = None,
               subresource: str | None = None) -> str:
    """The URL path of a kueue.x-k8s.io/v1beta2 collection or object."""
    from agent.kubeapi.client import resource_path

    return resource_path(GROUP, VERSION, plural, name, namespace=namespace, subresource=subresource)


_PLURAL = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
           "AdmissionCheck": "admissionchecks", "Topology": "topologies"}


class KueueObjects:
    """Creates Kueue objects (and namespaces) through a KubeClient and deletes what it created."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._created: list[str] = []  # object paths, deleted newest first

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a kueue.x-k8s.io/v1beta2 object from one of the builders above; the created object."""
        meta = body["metadata"]
        namespace = meta.get("namespace")
        plural = _PLURAL[body["kind"]]
        made: dict[str, Any] = self.api.create(kueue_path(plural, namespace=namespace), body)
        self._created.append(kueue_path(plural, meta["name"], namespace=namespace))
        return made

    def namespace(self, prefix: str = "kq") -> str:
        """A fresh namespace, deleted (with its Jobs, Workloads and LocalQueues) by delete_created()."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.api.create("/api/v1/namespaces", {"metadata": {"name": name}})
        self._created.append(f"/api/v1/namespaces/{name}")
        return name

    def resource_flavor(self, name: str, node_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Create a ResourceFlavor (see resource_flavor())."""
        return self.create(resource_flavor(name, node_labels))

    def cluster_queue(self, name: str, flavor: str, quota: Mapping[str, str],
                      **kwargs: Any) -> dict[str, Any]:
        """Create a ClusterQueue (see cluster_queue())."""
        return self.create(cluster_queue(name, flavor, quota, **kwargs))

    def local_queue(self, namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
        """Create a LocalQueue (see local_queue())."""
        return self.create(local_queue(namespace, name, cluster_queue_name))

    def admission_check(self, name: str, controller_name: str = CHECK_CONTROLLER) -> dict[str, Any]:
        """Create an AdmissionCheck (see admission_check())."""
        return self.create(admission_check(name, controller_name))

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Job (see job()) in `namespace`; it goes with the namespace."""
        made: dict[str, Any] = self.api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", body)
        return made

    def set_check_active(self, name: str, active: bool = True, *, field_manager: str = "tests.topolet.io"
                         ) -> dict[str, Any]:
        """Set AdmissionCheck `name`'s Active condition (what its controller does) by a status apply."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AdmissionCheck", "metadata": {"name": name},
                "status": {"conditions": [{
                    "type": "Active", "status": "True" if active else "False",
                    "reason": "Active" if active else "Inactive",
                    "message": "set by the test" if active else "unset by the test",
                    "lastTransitionTime": now}]}}
        out: dict[str, Any] = self.api.apply(kueue_path("admissionchecks", name, subresource="status"),
                                             body, field_manager)
        return out

    def get(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A Kueue object by plural and name."""
        out: dict[str, Any] = self.api.get(kueue_path(plural, name, namespace=namespace))
        return out

    def workload_of(self, namespace: str, job_uid: str) -> dict[str, Any] | None:
        """The Workload Kueue made for the Job with `job_uid`, or None (yet)."""
        listed = self.api.list(kueue_path("workloads", namespace=namespace),
                               {"labelSelector": f"kueue.x-k8s.io/job-uid={job_uid}"})
        items = listed.get("items") or []
        return dict(items[0]) if items else None

    def delete_created(self) -> None:
        """Delete every object and namespace created here, newest first, without waiting for them."""
        from agent.errors import KubeAPIError

        while self._created:
            path = self._created.pop()
            with contextlib.suppress(KubeAPIError):
                self.api.request("DELETE", path, body={"propagationPolicy": "Background"},
                                 content_type="application/json")


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type `kind` of an API object, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def wait_for(what: str, probe: Any, timeout_s: float = 60.0, interval_s: float = 0.2,
             context: Any = None) -> Any:
    """Call `probe()` until it returns something truthy and return it; AssertionError after timeout_s.

    `context()` (optional) is appended to the failure message (for example Kueue's log tail)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    extra = f"\n{context()}" if context is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r}){extra}")


def iter_pods(api: Any, namespace: str, job_name: str) -> Iterator[dict[str, Any]]:
    """The pods of Job `job_name` in `namespace`."""
    listed = api.list(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": f"job-name={job_name}"})
    yield from listed.get("items") or []


class KueueScope(KueueObjects):
    """One test's use of a running Kueue: the Kueue, its cluster, an admin KubeClient (`api`), the object
    helpers, and the nodes it added; close() deletes what the test made through it."""

    def __init__(self, kueue: Kueue) -> None:
        from agent.kubeapi.client import KubeClient

        super().__init__(KubeClient(kueue.cluster.plane.client()))
        self.kueue = kueue
        self.cluster = kueue.cluster
        self._nodes: list[str] = []

    def add_node(self, name: str, cpu: str = "8", memory: str = "16Gi", pods: str = "110",
                 labels: Mapping[str, str] | None = None) -> str:
        """A Ready Node of this size with no agent (pods bound there stay Pending); removed by close()."""
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        uid = self.cluster.create_node_object(name, resources, resources, labels=labels, api=self.api)
        self._nodes.append(name)
        return uid

    def logs(self) -> str:
        """Kueue's log tail and the cluster's components' logs, for a failing test's output."""
        return f"--- kueue ---\n{self.kueue.log_tail()}\n{self.cluster.logs()}"

    def close(self) -> None:
        """Delete the test's Kueue objects, namespaces and nodes, and close the client."""
        from agent.errors import KubeAPIError

        self.delete_created()
        for name in self._nodes:
            with contextlib.suppress(KubeAPIError):
                self.api.request("DELETE", f"/api/v1/nodes/{name}")
        self.api.close()

"""The NUMA-aware peer arm of bench/admission_api.py: kube-scheduler with scheduler-plugins'
NodeResourceTopologyMatch and Coscheduling (`third_party/scheduler-plugins-nrt/`), on the same cluster
objects as topolet's controller and the plain scheduler.

What an operator deploys for it, set up here the same way on the test cluster:

- the binary, built from source by `third_party/build.sh` (cached by its inputs; `build_peer()`);
- the PodGroup CRD (`scheduling.x-k8s.io/v1alpha1`) it ships; the NodeResourceTopology CRD is the one
  the cluster already serves (the same `topology.node.k8s.io/v1alpha2` schema);
- its own identity: the ServiceAccount `kube-system/topo-aware-scheduler` (upstream manifests' name)
  acting through a TokenRequest token, bound to the built-in `system:kube-scheduler` and
  `system:volume-scheduler` roles, to `extension-apiserver-authentication-reader`, and to a role that
  reads NRTs (the rule of the peer's `manifests/noderesourcetopology/cluster-role.yaml`; that file's
  write access to RBAC is left out, the scheduler never uses it) and PodGroups (Coscheduling's cached
  reader lists and watches them);
- one scheduler profile, `topo-aware-scheduler`, from the peer's sample `scheduler-config.yaml`
  (Coscheduling as queue sort, NodeResourceTopologyMatch with `LeastAllocated` and the reserve cache
  on), with the client rate limits of the cluster's own scheduler;
- per gang a PodGroup whose `minMember` is the gang's pod count, and the Job's pods labelled into it
  (`scheduling.x-k8s.io/pod-group`) with `schedulerName: topo-aware-scheduler` (`peer_objects`).

NRTs: the bench's stand-in agents (`bench/admission_agents.py`) republish a node's NRT, with the pod
fingerprint of its Running pods, about a second after a pod starts there, as in the other two arms.
The peer's reserve cache ("overreserve") takes the NRTs it lists when it starts (so they are created
first: an NRT that appears later is not filtered on until a resync matches its pod fingerprint) and
counts every pod it reserves on a node against *every* zone of that node, since it cannot know which
zone the kubelet will pick, until a resync (every `cacheResyncPeriodSeconds`, 5 s in its sample
config) finds the node's NRT fingerprint equal to that of the Running pods it sees there.  Without
republished NRTs that never happens and the peer starves on its own reservations.
The filler pods that the NRTs already count carry the profile's schedulerName (`FILLER_SCHEDULER`):
as if the peer had placed them and its agents had published since, so they are not "foreign pods" (a
node with a pod unknown to the profile is left out until its NRT's fingerprint shows the pod).
`SCOPES`: the NRTs' topologyManagerScope (`pod` or `container`); each gang pod has one container, so
both ask the plugin the same question.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
PEER_DIR = REPO / "third_party" / "scheduler-plugins-nrt"
BUILD = REPO / "third_party" / "build.sh"
BUILD_TIMEOUT_S = 3600.0  # a cold Go build cache compiles all of Kubernetes' scheduler: long on 2 cores
PROFILE = "topo-aware-scheduler"
FILLER_SCHEDULER = PROFILE
SERVICE_ACCOUNT = ("kube-system", "topo-aware-scheduler")
READER_ROLE = "topolet-bench:nrt-peer"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PG_GROUP, PG_VERSION, PG_PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
SCOPES = ("pod", "container")
LABEL = "NRT-plugin scheduler"  # its name in the CPU-seconds and peak-RSS lines
TOKEN_SECONDS = 24 * 3600


def build_peer(timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The peer scheduler's binary (its CRDs beside it), built by third_party/build.sh unless cached.
    Raises RuntimeError with the build's output when it fails."""
    done = subprocess.run([str(BUILD), "scheduler-plugins-nrt"], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    for line in done.stdout.splitlines():
        name, _, path = line.partition("=")
        if name == "scheduler-plugins-nrt" and done.returncode == 0:
            return Path(path)
    raise RuntimeError(f"{BUILD} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def rbac() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) of the peer's identity and its permissions (see the module docstring)."""
    ns, sa = SERVICE_ACCOUNT
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    rbac_api = "/apis/rbac.authorization.k8s.io/v1"
    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
              "metadata": {"name": READER_ROLE},
              "rules": [{"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"],
                         "verbs": ["get", "list", "watch"]},
                        {"apiGroups": [PG_GROUP], "resources": [PG_PLURAL],
                         "verbs": ["get", "list", "watch"]}]}

    def binding(kind: str, role_kind: str, role: str, namespace: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"topo-aware-scheduler:{role}"}
        if namespace:
            meta["namespace"] = namespace
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}}

    return [
        (f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": sa}}),
        (f"{rbac_api}/clusterroles", reader),
        *((f"{rbac_api}/clusterrolebindings", binding("ClusterRoleBinding", "ClusterRole", role))
          for role in ("system:kube-scheduler", "system:volume-scheduler", READER_ROLE)),
        (f"{rbac_api}/namespaces/{ns}/rolebindings",
         binding("RoleBinding", "Role", "extension-apiserver-authentication-reader", ns)),
    ]


def scheduler_config(kubeconfig: Path, qps: int) -> dict[str, Any]:
    """The peer's sample KubeSchedulerConfiguration with this cluster's kubeconfig, client rate limits
    (those of the cluster's own scheduler) and the profile named PROFILE."""
    config: dict[str, Any] = yaml.safe_load((PEER_DIR / "scheduler-config.yaml").read_text())
    config["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": qps, "burst": 2 * qps}
    (profile,) = config["profiles"]
    profile["schedulerName"] = PROFILE
    return config


def pod_group(name: str, min_member: int) -> dict[str, Any]:
    """A PodGroup: no pod of the gang binds until `min_member` of them can."""
    return {"apiVersion": f"{PG_GROUP}/{PG_VERSION}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": min_member}}


def peer_objects(job: dict[str, Any], namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) to create, in order, for a gang whose unsuspended Job is `job`: its
    PodGroup, then the Job with its pods labelled into the group and handed to the peer's profile."""
    job = copy.deepcopy(job)
    name, spec = job["metadata"]["name"], job["spec"]
    template = spec["template"]
    template["metadata"].setdefault("labels", {})[POD_GROUP_LABEL] = name
    template["spec"]["schedulerName"] = PROFILE
    return [(f"/apis/{PG_GROUP}/{PG_VERSION}/namespaces/{namespace}/{PG_PLURAL}",
             pod_group(name, spec["parallelism"])),
            (f"/apis/batch/v1/namespaces/{namespace}/jobs", job)]


def scope_list(text: str) -> tuple[str, ...]:
    """`--scopes`: comma-separated NRT topologyManagerScopes, one peer run each ("" or "none": no peer)."""
    scopes = tuple(s for s in text.split(",") if s and s != "none")
    for s in scopes:
        if s not in SCOPES:
            raise argparse.ArgumentTypeError(f"unknown scope {s!r} (one of {', '.join(SCOPES)})")
    return scopes


def _wait_served(api: Any, path: str, timeout_s: float = 60.0) -> None:
    from agent.errors import KubeAPIError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            api.list(path)
            return
        except KubeAPIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class PeerScheduler:
    """The peer scheduler on a test cluster (tests/controlplane/cluster.py's Cluster); `stop()` ends it.

    `start()` installs the PodGroup CRD and the RBAC (idempotent), then starts the binary as its own
    service account and waits until it serves /healthz."""

    cluster: Any
    binary: Path
    verbosity: int = 0  # its klog --v (2: every reserve, unreserve and cache flush is logged)
    process: Any = None
    labels: dict[str, str] = field(default_factory=dict)  # binary path -> LABEL, for the CPU lines

    def start(self) -> None:
        from agent.errors import KubeAPIError
        from agent.kubeapi.client import KubeClient

        plane = self.cluster.plane
        api = KubeClient(plane.client())
        try:
            crd = yaml.safe_load((self.binary.parent / "crd-podgroups.yaml").read_text())
            for path, body in [("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd), *rbac()]:
                try:
                    api.create(path, body)
                except KubeAPIError as exc:
                    if exc.status != 409:
                        raise
            _wait_served(api, f"/apis/{PG_GROUP}/{PG_VERSION}/{PG_PLURAL}")
        finally:
            api.close()
        token = plane.mint_token(*SERVICE_ACCOUNT, expiration_seconds=TOKEN_SECONDS)
        workdir = self.cluster.workdir
        kubeconfig = plane.write_kubeconfig(workdir / "nrt-scheduler.kubeconfig", token, user=PROFILE)
        config = workdir / "nrt-scheduler.config.json"
        config.write_text(json.dumps(scheduler_config(kubeconfig, self.cluster.api_qps), indent=1))

        def argv(port: int) -> list[str]:
            return [str(self.binary), "--config", str(config),
                    "--bind-address", "127.0.0.1", "--secure-port", str(port),
                    "--cert-dir", str(workdir / "nrt-scheduler-certs"), "--profiling=false",
                    f"--v={self.verbosity}"]

        # The cluster's start-and-wait-for-/healthz, shared with its own scheduler.
        self.process = self.cluster._start("nrt-scheduler", argv)  # noqa: SLF001
        self.labels[str(self.binary)] = LABEL

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def log_tail(self, chars: int = 3000) -> str:
        return "" if self.process is None else f"--- {LABEL} ---\n{self.process.log_tail(chars)}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers (the binary may not end on the first SIGTERM)."""
        if self.process is not None:
            self.process.stop(timeout_s=10.0)
            self.process = None

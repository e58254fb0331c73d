"""The daemonset/ kustomize base: what it renders, the limits it promises, and that an API server takes it.

The base holds two workloads: the agent (DaemonSet topolet-agent) and the admission controller
(daemonset/controller/: Deployment topolet-controller). Each has its own service account and RBAC.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.enforce.bundles import DEFAULT_BUNDLES
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import (
    BASE,
    CRDS,
    Kubectl,
    api_request,
    base_with_components,
    build_kubectl,
    kustomize_build,
)
from tests.controlplane.kubectl import applied_base as applied_base  # noqa: F401 - fixture
from tests.controlplane.kubectl import kubectl as kubectl  # noqa: F401 - fixture

try:
    from kubernetes import client as k8s
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

NAMESPACE = "topolet-system"
AGENT_SA = "topolet-agent"
CONTROLLER = "topolet-controller"  # the Deployment, its service account, roles and Lease share the name
CONTROLLER_PORT = 9471
CONTROLLER_POLICY = "topolet-controller-writes"
PLACEMENT_POLICY = "topolet-placement"  # the MutatingAdmissionPolicy that pins admitted pods
FIELDS_POLICY = "topolet-admission-fields"  # admission's fields written by the controller alone
# Each workload's service account, the admission policy that narrows its writes, and the writes RBAC
# grants it that the policy leaves alone (none: Events too are confined to the node that writes them).
CONFINED = [(AGENT_SA, "topolet-agent-own-node", set()),
            (CONTROLLER, CONTROLLER_POLICY, set())]
# What issue 8 lists for the controller, and nothing else: (namespace, or "*" for every namespace and
# cluster-scoped objects; API group; resource; verb; resource name, "" for any).
_READ = ("get", "list", "watch")
CONTROLLER_GRANTS: frozenset[tuple[str, str, str, str, str]] = frozenset({
    *(("*", "batch", "jobs", v, "") for v in (*_READ, "patch")),
    # A Job queued again after its node was gone: its status.startTime cleared (admission-policy.yaml).
    ("*", "batch", "jobs/status", "patch", ""),
    # Queued JobSets and TrainJobs: admitted by one patch (admission-policy.yaml narrows it to the
    # decision's fields).
    *(("*", "jobset.x-k8s.io", "jobsets", v, "") for v in (*_READ, "patch")),
    *(("*", "trainer.kubeflow.org", "trainjobs", v, "") for v in (*_READ, "patch")),
    *(("*", "", "pods", v, "") for v in (*_READ, "patch")),
    *(("*", "", "nodes", v, "") for v in _READ),
    *(("*", "topology.node.k8s.io", "noderesourcetopologies", v, "") for v in _READ),
    *(("*", "scheduling.k8s.io", "priorityclasses", v, "") for v in _READ),
    # Gangs sized with their namespace's LimitRange container defaults: list and watch only.
    *(("*", "", "limitranges", v, "") for v in ("list", "watch")),
    # Events on Jobs: core/v1, each posted new (agent/admission/report/events.py never patches one).
    ("*", "", "events", "create", ""),
    # Leader election: create a Lease (RBAC cannot name a create's object), then only its own Lease.
    (NAMESPACE, "coordination.k8s.io", "leases", "create", ""),
    *((NAMESPACE, "coordination.k8s.io", "leases", v, CONTROLLER) for v in ("get", "update")),
})
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# Verbs that hand out more than the rule names: granting roles, acting as someone else, minting tokens.
POWER_VERBS = {"escalate", "bind", "impersonate", "approve", "sign", "*"}
# Objects a compromised agent must never reach: credentials, other workloads' shells and tokens.
FORBIDDEN_RESOURCES = {"secrets", "serviceaccounts/token", "pods/exec", "pods/attach", "pods/portforward",
                       "nodes/proxy", "certificatesigningrequests", "tokenreviews", "subjectaccessreviews"}


# ---- the rendered base ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    """Every object `kubectl kustomize daemonset/` renders."""
    return [d for d in yaml.safe_load_all(kustomize_build(build_kubectl())) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent's pod template spec."""
    spec: dict[str, Any] = one(docs, "DaemonSet", "topolet-agent")["spec"]["template"]["spec"]
    return spec


def controller_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The admission controller's pod template spec."""
    spec: dict[str, Any] = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]
    return spec


# Every workload of the base, by the kind and name of its object.
WORKLOADS = [("DaemonSet", "topolet-agent"), ("Deployment", CONTROLLER)]


def workload_spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The containers of every workload in the base."""
    specs = [workload_spec(docs, kind, name) for kind, name in WORKLOADS]
    return [c for spec in specs for c in (*spec.get("initContainers", []), *spec["containers"])]


@pytest.mark.parametrize(("kind", "name"), [
    ("Namespace", NAMESPACE),
    ("ServiceAccount", AGENT_SA),
    ("ClusterRole", AGENT_SA),
    ("ClusterRoleBinding", AGENT_SA),
    ("Role", AGENT_SA),
    ("RoleBinding", AGENT_SA),
    ("DaemonSet", "topolet-agent"),
    ("ServiceAccount", CONTROLLER),
    ("ClusterRole", CONTROLLER),
    ("ClusterRoleBinding", CONTROLLER),
    ("Role", CONTROLLER),
    ("RoleBinding", CONTROLLER),
    ("Deployment", CONTROLLER),
    ("PodDisruptionBudget", CONTROLLER),
    ("ValidatingAdmissionPolicy", "topolet-agent-own-node"),
    ("ValidatingAdmissionPolicyBinding", "topolet-agent-own-node"),
    ("NetworkPolicy", "topolet-agent-metrics"),
    ("ValidatingAdmissionPolicy", CONTROLLER_POLICY),
    ("ValidatingAdmissionPolicyBinding", CONTROLLER_POLICY),
    ("ValidatingAdmissionPolicy", FIELDS_POLICY),
    ("ValidatingAdmissionPolicyBinding", FIELDS_POLICY),
    ("MutatingAdmissionPolicy", PLACEMENT_POLICY),
    ("MutatingAdmissionPolicyBinding", PLACEMENT_POLICY),
    ("ConfigMap", "topolet-dashboards"),
    *(("CustomResourceDefinition", crd) for crd in CRDS),
])
def test_base_renders(docs: list[dict[str, Any]], kind: str, name: str) -> None:
    obj = one(docs, kind, name)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                      "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    if kind not in cluster_scoped:
        assert obj["metadata"]["namespace"] == NAMESPACE


def test_agent_runs_the_agent_on_its_node(docs: list[dict[str, Any]]) -> None:
    (agent,) = pod_spec(docs)["containers"]
    assert agent["command"] == ["topolet", "agent"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert pod_spec(docs)["serviceAccountName"] == AGENT_SA
    assert pod_spec(docs)["priorityClassName"] == "system-node-critical"


def test_agent_command_line_is_one_the_cli_accepts(docs: list[dict[str, Any]]) -> None:
    from agent.cli import build_parser

    (agent,) = pod_spec(docs)["containers"]
    assert agent["command"][0] == "topolet"
    args = build_parser().parse_args([*agent["command"][1:], *agent["args"]])
    assert args.mode == "kubernetes"
    mounted = {m["mountPath"] for m in agent["volumeMounts"]}
    # Every path the agent is told to use lies on a mount (the root file system is read-only).
    for path in (args.state_dir, args.features_dir, args.pod_resources_socket, args.nri_socket):
        assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounted), path


def test_every_container_has_requests_limits_and_probes(docs: list[dict[str, Any]]) -> None:
    for c in containers(docs):
        res = c.get("resources", {})
        assert {"cpu", "memory"} <= set(res.get("requests", {})), c["name"]
        assert "memory" in res.get("limits", {}), c["name"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe in c, f"{c['name']} has no {probe}"


def test_probes_reach_the_port_the_agent_listens_on(docs: list[dict[str, Any]]) -> None:
    """The probes go to the pod IP, so the agent must listen beyond loopback, on the probed port."""
    (agent,) = pod_spec(docs)["containers"]
    listen = [a.split("=", 1)[1] for a in agent["args"] if a.startswith("--listen=")]
    assert len(listen) == 1
    host, _, port = listen[0].rpartition(":")
    assert host not in ("127.0.0.1", "localhost", "[::1]")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = agent[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert ports.get(get["port"], get["port"]) == int(port)


@pytest.mark.parametrize(("kind", "name"), WORKLOADS)
def test_security_context_is_narrow(docs: list[dict[str, Any]], kind: str, name: str) -> None:
    spec = workload_spec(docs, kind, name)
    for host_ns in ("hostPID", "hostIPC", "hostNetwork"):
        assert not spec.get(host_ns, False), host_ns
    pod_sc = spec.get("securityContext", {})
    for c in (*spec.get("initContainers", []), *spec["containers"]):
        sc = c.get("securityContext", {})
        assert sc.get("privileged", False) is False
        assert sc.get("allowPrivilegeEscalation") is False
        assert sc.get("readOnlyRootFilesystem") is True
        assert sc.get("capabilities", {}).get("drop") == ["ALL"]
        assert not sc.get("capabilities", {}).get("add")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        assert seccomp.get("type") == "RuntimeDefault"


def test_host_paths_are_the_listed_ones_and_only_three_are_writable(docs: list[dict[str, Any]]) -> None:
    spec = pod_spec(docs)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host.values()) == {
        *SYSFS_SUBTREES, "/sys/fs/cgroup", "/var/lib/topolet",
        "/etc/kubernetes/node-feature-discovery/features.d", "/var/lib/kubelet/pod-resources", "/var/run/nri",
        DEFAULT_BUNDLES,
    }
    writable = {host[m["name"]] for c in containers(docs) for m in c.get("volumeMounts", [])
                if m["name"] in host and not m.get("readOnly", False)}
    assert writable == {"/sys/fs/cgroup", "/var/lib/topolet",
                        "/etc/kubernetes/node-feature-discovery/features.d"}


# The sysfs subtrees the agent mounts, each at its host path, read-only.
SYSFS_SUBTREES = {"/sys/devices", "/sys/bus/pci/devices"}
# Where kernels and distributions mount other file systems below /sys. Under a read-only bind of /sys
# they stay writable unless the runtime applies recursiveReadOnly.
FILE_SYSTEMS_UNDER_SYS = ("/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security", "/sys/fs/bpf",
                          "/sys/kernel/config", "/sys/firmware/efi/efivars", "/sys/fs/pstore",
                          "/sys/fs/fuse/connections", "/sys/fs/selinux", "/sys/fs/cgroup")


def under(path: str, top: str) -> bool:
    """Whether `path` is `top` or lies below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def agent_mounts(docs: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The agent's host-path mounts: mount path -> (host path, the volumeMount)."""
    spec = pod_spec(docs)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    (agent,) = spec["containers"]
    return {m["mountPath"]: (host[m["name"]], m) for m in agent["volumeMounts"] if m["name"] in host}


def test_sysfs_is_mounted_by_subtree_read_only_with_nothing_mounted_below(docs: list[dict[str, Any]]) -> None:
    """Not /sys whole: its debugfs, tracefs, securityfs and bpffs would be writable wherever the
    runtime cannot apply recursiveReadOnly."""
    mounts = agent_mounts(docs)
    sysfs = {path: m for path, (host, m) in mounts.items()
             if under(host, "/sys") and not under(host, "/sys/fs/cgroup")}
    assert set(sysfs) == SYSFS_SUBTREES
    for path, m in sysfs.items():
        assert mounts[path][0] == path, "mounted where the host has it: the PCI links are relative"
        assert m.get("readOnly") is True, path
        assert "recursiveReadOnly" not in m, path
        for fs in FILE_SYSTEMS_UNDER_SYS:
            assert not under(fs, path) and not under(path, fs), (path, fs)
    # The same on the machine running this test: nothing is mounted below the subtrees.
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in points:
        assert not any(under(point, path) and point != path for path in SYSFS_SUBTREES), point


def sysfs_paths_the_scanner_reads() -> set[str]:
    """Every sysfs folder csrc/ opens from an fs root ("sys/devices/system/cpu", ...), as an absolute path."""
    found: set[str] = set()
    for source in (BASE.parent / "csrc").glob("*.[ch]"):
        for literal in re.findall(r'"(sys/[^"%]*)', source.read_text()):
            found.add("/" + literal.rstrip("/"))
    return found


def test_every_sysfs_path_the_scanner_reads_lies_in_a_mounted_subtree() -> None:
    paths = sysfs_paths_the_scanner_reads()
    assert {"/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/bus/pci/devices"} <= paths
    for path in paths:
        assert any(under(path, top) for top in SYSFS_SUBTREES), path


def only_mounted(root: Path, dest: Path, subtrees: set[str]) -> Path:
    """A copy of dump `root` holding only `subtrees` of its sysfs (and its /proc, which the container
    has of its own), links kept as links."""
    for top in (*subtrees, "/proc"):
        src = root / top.lstrip("/")
        if src.exists():
            shutil.copytree(src, dest / top.lstrip("/"), symlinks=True)
    return dest


@pytest.mark.slow  # real machines unpacked and copied (CONTRIBUTING.md, Test tiers)
@pytest.mark.parametrize("dump", ["32em64t-2n8c+dax+nvme+mic+dimms", "nvidiagpunumanodes",
                                  "40intel64-2g2n4c+pcilocality"])
def test_discovery_through_the_mounted_subtrees_sees_the_whole_machine(
        dump: str, dump_root: Any, tmp_path: Path) -> None:
    from agent.gpu.discover import gpus_from_topology
    from agent.topology.discover import discover

    full_root = dump_root(dump)
    full = discover(str(full_root))
    assert full.pci_devices and full.numa_nodes
    mounted = only_mounted(full_root, tmp_path / "mounted", SYSFS_SUBTREES)
    seen = discover(str(mounted))
    assert seen == full
    assert gpus_from_topology(seen, mounted) == gpus_from_topology(full, full_root)
    # The comparison can fail: without the PCI links, the devices are gone.
    short = only_mounted(full_root, tmp_path / "short", {"/sys/devices"})
    assert not discover(str(short)).pci_devices


def test_cgroup_v1_component_mounts_only_the_cpuset_hierarchy(docs: list[dict[str, Any]],
                                                              tmp_path: Path) -> None:
    from agent.enforce.cgroup import detect_layout

    narrowed = base_with_components(tmp_path, "cgroup-v1-cpuset")
    mounts, before = agent_mounts(narrowed), agent_mounts(docs)
    assert mounts["/sys/fs/cgroup"][0] == "/sys/fs/cgroup/cpuset"
    assert {p: m for p, m in mounts.items() if p != "/sys/fs/cgroup"} == \
        {p: m for p, m in before.items() if p != "/sys/fs/cgroup"}
    # In the pod the host's cpuset hierarchy is then the cgroup v1 mount at /sys/fs/cgroup, which is
    # where the agent looks for it.
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "900 800 0:60 / / ro,relatime - overlay overlay rw\n"
        "950 900 0:31 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpuset\n")
    layout = detect_layout(mountinfo=str(mountinfo))
    assert (layout.version, layout.root) == (1, "/sys/fs/cgroup")


def test_agent_chooses_its_route_and_sees_the_nri_socket_folder(docs: list[dict[str, Any]]) -> None:
    """--route auto with the default NRI socket, through a read-only mount of the socket's directory
    (a runtime restart makes a new socket there) that a node without NRI creates empty, not refuses."""
    from agent.cli import build_parser
    from agent.kube.pods.route import DEFAULT_NRI_SOCKET

    (agent,) = pod_spec(docs)["containers"]
    args = build_parser().parse_args([*agent["command"][1:], *agent["args"]])
    assert (args.route, args.nri_socket) == ("auto", DEFAULT_NRI_SOCKET)
    folder = os.path.dirname(args.nri_socket)
    host, mount = agent_mounts(docs)[folder]
    assert host == folder
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    # The index the README's reserved-CPUs patch names stays that of --reserved-cpus.
    assert agent["args"][6].startswith("--reserved-cpus=")


def test_agent_reads_containerds_bundles_read_only_at_their_host_path(docs: list[dict[str, Any]]) -> None:
    """--runtime-bundles (its default) is mounted read-only at the same path, created where missing."""
    from agent.cli import build_parser

    (agent,) = pod_spec(docs)["containers"]
    args = build_parser().parse_args([*agent["command"][1:], *agent["args"]])
    assert args.runtime_bundles == DEFAULT_BUNDLES
    host, mount = agent_mounts(docs)[DEFAULT_BUNDLES]
    assert host == DEFAULT_BUNDLES and mount.get("readOnly") is True
    (volume,) = [v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"


def test_nri_required_component_insists_on_nri_and_lets_the_agent_start_without_itself(
        docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """With topolet in containerd's required_plugins the agent must never settle on the pod-cgroup
    route, and its own pod must tolerate topolet's absence, or it could never start again."""
    from agent.cli import build_parser

    required = base_with_components(tmp_path, "nri-required")
    (agent,) = pod_spec(required)["containers"]
    args = build_parser().parse_args([*agent["command"][1:], *agent["args"]])
    assert args.route == "nri"
    ds = one(required, "DaemonSet", "topolet-agent")
    assert ds["spec"]["template"]["metadata"]["annotations"]["tolerate-missing-plugins.nri.io"] == "true"
    (before,) = pod_spec(docs)["containers"]
    assert [a for a in agent["args"] if not a.startswith("--route=")] == \
        [a for a in before["args"] if not a.startswith("--route=")]
    assert agent_mounts(required) == agent_mounts(docs)


def test_the_readmes_overlay_for_older_api_servers_drops_only_the_placement_policy(
        docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """daemonset/README.md's overlay for API servers before 1.36, taken from the README itself."""
    readme = (BASE / "README.md").read_text()
    block = re.search(r"```yaml\n(resources: \[\.\./daemonset\]\npatches:\n(?:(?!```).)*?\$patch: delete"
                      r"(?:(?!```).)*)```", readme, re.S)
    assert block is not None, "the README's overlay is gone"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    text = block.group(1).replace("../daemonset", os.path.relpath(BASE, overlay))
    (overlay / "kustomization.yaml").write_text(text)
    kept = [d for d in yaml.safe_load_all(kustomize_build(build_kubectl(), overlay)) if d]
    dropped = {(d["kind"], d["metadata"]["name"]) for d in docs} - {(d["kind"], d["metadata"]["name"])
                                                                      for d in kept}
    assert dropped == {("MutatingAdmissionPolicy", PLACEMENT_POLICY),
                       ("MutatingAdmissionPolicyBinding", PLACEMENT_POLICY)}


def test_only_prometheus_reaches_the_agents_port(docs: list[dict[str, Any]]) -> None:
    policy = one(docs, "NetworkPolicy", "topolet-agent-metrics")["spec"]
    agent_labels = one(docs, "DaemonSet", "topolet-agent")["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["podSelector"], agent_labels)
    assert not selects(policy["podSelector"], controller_pod_labels(docs))
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    # Both selectors in one peer: Prometheus pods in the monitoring namespace, not either alone.
    assert selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": "monitoring"})
    assert not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": NAMESPACE})
    assert peer["podSelector"]["matchLabels"]
    assert not selects(peer["podSelector"], agent_labels)
    (agent,) = pod_spec(docs)["containers"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    (port,) = rule["ports"]
    assert port["port"] in ports and port["protocol"] == "TCP"
    listen = [a.split("=", 1)[1] for a in agent["args"] if a.startswith("--listen=")]
    assert [int(a.rpartition(":")[2]) for a in listen] == [ports[port["port"]]]


def test_agent_reserves_cpus_by_default(docs: list[dict[str, Any]]) -> None:
    """Exclusive allocations must never take every CPU but the last shared one."""
    from agent.cli import build_parser
    from agent.topology.cpuset import CPUSet

    (agent,) = pod_spec(docs)["containers"]
    args = build_parser().parse_args([*agent["command"][1:], *agent["args"]])
    reserved = CPUSet.parse(args.reserved_cpus)
    assert 0 in reserved  # CPU 0 is on every node; a list of CPUs some node lacks would reserve less


def test_tolerates_every_taint_and_rolls_ten_percent_at_a_time(docs: list[dict[str, Any]]) -> None:
    ds = one(docs, "DaemonSet", "topolet-agent")
    assert {"operator": "Exists"} in pod_spec(docs)["tolerations"]
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == "10%"
    assert strategy["rollingUpdate"].get("maxSurge", 0) == 0


# ---- the admission controller ----------------------------------------------------------------------


def controller_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = controller_spec(docs)["containers"]
    assert isinstance(container, dict)
    return container


def controller_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector with matchLabels only (what the base uses) selects `labels`."""
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_controller_runs_two_replicas_with_leader_election(docs: list[dict[str, Any]]) -> None:
    deployment = one(docs, "Deployment", CONTROLLER)
    assert deployment["spec"]["replicas"] == 2
    assert selects(deployment["spec"]["selector"], controller_pod_labels(docs))
    # The agents' DaemonSet must not adopt the controller's pods, nor the Deployment the agents'.
    daemonset = one(docs, "DaemonSet", "topolet-agent")
    assert not selects(deployment["spec"]["selector"], daemonset["spec"]["template"]["metadata"]["labels"])
    assert not selects(daemonset["spec"]["selector"], controller_pod_labels(docs))
    container = controller_container(docs)
    assert container["command"] == ["topolet", "controller"]
    assert "--leader-elect" in container["args"]
    # The Lease lives in the pod's own namespace, the only one where RBAC lets it hold one.
    assert "--namespace=$(POD_NAMESPACE)" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert controller_spec(docs)["serviceAccountName"] == CONTROLLER


def test_controller_uses_the_agents_image(docs: list[dict[str, Any]]) -> None:
    (agent,) = pod_spec(docs)["containers"]
    assert controller_container(docs)["image"] == agent["image"]


def test_controller_command_line_is_one_the_cli_accepts(docs: list[dict[str, Any]]) -> None:
    from agent.cli import build_parser

    container = controller_container(docs)
    # The kubelet expands $(POD_NAMESPACE) before the process sees it.
    args = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in container["args"]]
    parsed = build_parser().parse_args([*container["command"][1:], *args])
    assert parsed.leader_elect is True
    assert parsed.namespace == NAMESPACE
    assert parsed.listen == f"0.0.0.0:{CONTROLLER_PORT}"


def test_controller_probes_and_metrics_reach_its_port(docs: list[dict[str, Any]]) -> None:
    container = controller_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": CONTROLLER_PORT}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert ports.get(get["port"], get["port"]) == CONTROLLER_PORT
    annotations = one(docs, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["annotations"]
    agent_annotations = one(docs, "DaemonSet", "topolet-agent")["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == set(agent_annotations)
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(CONTROLLER_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_controller_runs_as_non_root_with_only_tmp_writable(docs: list[dict[str, Any]]) -> None:
    spec = controller_spec(docs)
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] != 0 and pod_sc["runAsGroup"] != 0
    assert all("hostPath" not in v for v in spec.get("volumes", []))
    container = controller_container(docs)
    assert container["securityContext"].get("runAsUser", pod_sc["runAsUser"]) != 0
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]


def test_controller_replicas_prefer_different_nodes(docs: list[dict[str, Any]]) -> None:
    anti = controller_spec(docs)["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"], controller_pod_labels(docs))
    # Preferred, not required: one node still runs both replicas.
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti


def test_controller_rollouts_and_drains_keep_a_replica(docs: list[dict[str, Any]]) -> None:
    rolling = one(docs, "Deployment", CONTROLLER)["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0 and rolling["maxSurge"] >= 1
    pdb = one(docs, "PodDisruptionBudget", CONTROLLER)["spec"]
    assert selects(pdb["selector"], controller_pod_labels(docs))
    assert pdb["maxUnavailable"] == 1
    assert "minAvailable" not in pdb


def rbac_rules(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{d['kind']}/{d['metadata']['name']}", rule)
            for d in docs if d["kind"] in ("ClusterRole", "Role") for rule in d.get("rules", [])]


def test_rbac_grants_no_secrets_no_wildcards_no_power_verbs(docs: list[dict[str, Any]]) -> None:
    rules = rbac_rules(docs)
    assert rules
    for where, rule in rules:
        assert "nonResourceURLs" not in rule, where
        for field in ("apiGroups", "resources", "verbs"):
            assert not any("*" in item for item in rule[field]), f"{where}: wildcard in {field}"
        assert not set(rule["resources"]) & FORBIDDEN_RESOURCES, f"{where}: {rule['resources']}"
        assert not set(rule["verbs"]) & (POWER_VERBS | {"deletecollection"}), where
        # One delete: the agent's own NodeFeature, when --label-sink auto moves its labels to the Node
        # (the admission policy confines it to topolet-<its node>, as every NodeFeature write).
        if "delete" in rule["verbs"]:
            assert (where, rule["apiGroups"], rule["resources"]) == (
                f"Role/{AGENT_SA}", ["nfd.k8s-sigs.io"], ["nodefeatures"]), where


def test_bindings_grant_each_role_to_its_own_service_account_only(docs: list[dict[str, Any]]) -> None:
    bindings = find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
    assert {b["metadata"]["name"] for b in bindings} == {AGENT_SA, CONTROLLER}
    for b in bindings:
        name = b["metadata"]["name"]
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
        role_kind = "ClusterRole" if b["kind"] == "ClusterRoleBinding" else "Role"
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) == (role_kind, name)


def granted_to(docs: list[dict[str, Any]], service_account: str) -> set[tuple[str, str, str, str, str]]:
    """What the base's bindings give `service_account`, flattened as in CONTROLLER_GRANTS."""
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE}
    granted: set[tuple[str, str, str, str, str]] = set()
    for b in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        if subject not in b["subjects"]:
            continue
        scope = "*" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        role_kind = b["roleRef"]["kind"]
        if role_kind == "Role":
            roles = [r for r in find(docs, "Role", b["roleRef"]["name"])
                     if r["metadata"]["namespace"] == b["metadata"]["namespace"]]
        else:
            roles = find(docs, "ClusterRole", b["roleRef"]["name"])
        (role,) = roles
        for rule in role.get("rules", []):
            assert "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            granted.add((scope, group, resource, verb, name))
    return granted


def test_controller_rbac_is_exactly_what_the_issue_lists(docs: list[dict[str, Any]]) -> None:
    granted = granted_to(docs, CONTROLLER)
    assert granted == CONTROLLER_GRANTS, {"extra": granted - CONTROLLER_GRANTS,
                                          "missing": CONTROLLER_GRANTS - granted}


@pytest.mark.parametrize(("account", "policy_name", "unconfined"), CONFINED)
def test_every_granted_write_is_confined_by_an_admission_policy(
        docs: list[dict[str, Any]], account: str, policy_name: str, unconfined: set[tuple[str, str]]) -> None:
    """RBAC cannot say "my node" or "this field"; each write it grants must fall under the policy that can."""
    policy = one(docs, "ValidatingAdmissionPolicy", policy_name)["spec"]
    covered: set[tuple[str, str, str]] = set()
    for rule in policy["matchConstraints"]["resourceRules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for op in rule["operations"]:
                    covered.add((group, resource, op))
    verb_to_op = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
    roles = {f"{kind}/{account}" for kind in ("ClusterRole", "Role")}
    writes = 0
    for where, rule in rbac_rules(docs):
        if where not in roles:
            continue
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if (group, resource) in unconfined:
                    continue
                for verb in set(rule["verbs"]) & WRITE_VERBS:
                    # Server-side apply reaches admission as CREATE when the object is new.
                    ops = {verb_to_op[verb], "CREATE"} if verb == "patch" else {verb_to_op[verb]}
                    for op in ops:
                        writes += 1
                        assert (group, resource, op) in covered, f"{where}: {verb} {group}/{resource}"
    assert writes
    assert policy["failurePolicy"] == "Fail"
    binding = one(docs, "ValidatingAdmissionPolicyBinding", policy_name)["spec"]
    assert binding["policyName"] == policy_name
    assert binding["validationActions"] == ["Deny"]


def test_placement_policy_only_pins_pods_as_they_are_created(docs: list[dict[str, Any]]) -> None:
    """The mutating policy touches pod CREATE only, and a failure leaves the pod gated for the
    controller (Ignore) instead of refusing every pod of the cluster."""
    policy = one(docs, "MutatingAdmissionPolicy", PLACEMENT_POLICY)["spec"]
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    assert policy["failurePolicy"] == "Ignore"
    assert policy["reinvocationPolicy"] == "Never"
    conditions = " ".join(c["expression"] for c in policy["matchConditions"])
    assert "topolet.io/placement'" in conditions and "topolet.io/placements'" in conditions
    binding = one(docs, "MutatingAdmissionPolicyBinding", PLACEMENT_POLICY)["spec"]
    assert binding == {"policyName": PLACEMENT_POLICY}


@pytest.mark.parametrize(("account", "policy_name", "unconfined"), CONFINED)
def test_admission_policy_names_its_service_accounts_user(
        docs: list[dict[str, Any]], account: str, policy_name: str, unconfined: set[tuple[str, str]]) -> None:
    """A policy matches by user name, which kustomize's namespace does not rewrite: keep them in step."""
    sa = one(docs, "ServiceAccount", account)
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    conditions = one(docs, "ValidatingAdmissionPolicy", policy_name)["spec"]["matchConditions"]
    assert [c["expression"] for c in conditions] == [f"request.userInfo.username == '{user}'"]


# ---- the dashboards (their lint and queries: tests/kube/test_dashboards.py) -----------------------


def test_dashboards_ship_as_a_sidecar_configmap(docs: list[dict[str, Any]]) -> None:
    """Every dashboard file ships, as it is in the tree, in the ConfigMap Grafana's sidecar loads."""
    cm = one(docs, "ConfigMap", "topolet-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: json.loads(p.read_text()) for p in (BASE / "dashboards").glob("*.json")}
    assert len(files) >= 3
    assert {name: json.loads(text) for name, text in cm["data"].items()} == files


# ---- against the API server ----------------------------------------------------------------------


def test_base_applies_and_the_api_server_stores_it(
    control_plane: ControlPlane, kubectl: Kubectl,  # noqa: F811 - fixture
    applied_base: subprocess.CompletedProcess[str],  # noqa: F811 - fixture
    docs: list[dict[str, Any]],
) -> None:
    for name in CRDS:
        status, crd = api_request(control_plane, "GET",
                                  f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert status == 200, crd
        assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}.get("Established") == "True"
    status, policy = api_request(control_plane, "GET", "/apis/admissionregistration.k8s.io/v1/"
                                 "validatingadmissionpolicies/topolet-agent-own-node")
    assert status == 200, policy
    status, stored = api_request(control_plane, "GET",
                                 f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/topolet-agent")
    assert status == 200, stored
    built = pod_spec(docs)["containers"][0]
    (agent,) = stored["spec"]["template"]["spec"]["containers"]
    for key in ("image", "command", "args", "securityContext", "resources"):
        assert agent[key] == built[key], key
    # No kubelet or controller here: the object is stored and nothing is scheduled.
    assert not stored.get("status", {}).get("desiredNumberScheduled")


def test_applying_twice_changes_nothing(
    kubectl: Kubectl, applied_base: subprocess.CompletedProcess[str],  # noqa: F811 - fixture
) -> None:
    before = stored_versions(kubectl)
    again = kubectl.run("apply", "-k", str(BASE))
    lines = [line for line in again.stdout.splitlines() if line.strip()]
    assert len(lines) == len(before), again.stdout
    # kubectl reports a PodDisruptionBudget "configured" on every apply: its selector's patch strategy
    # is "replace", so the selector is always in the patch. The server stores nothing new, which is
    # what this test is about.
    assert all(line.endswith((" unchanged", " configured")) for line in lines), again.stdout
    assert stored_versions(kubectl) == before


def stored_versions(kubectl: Kubectl) -> dict[str, str]:
    """Every object of the base as stored: its generation where it has one (status updates by a
    controller do not change it), else its resourceVersion."""
    listed = json.loads(kubectl.run("get", "-k", str(BASE), "-o", "json").stdout)
    return {f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}":
            str(o["metadata"].get("generation") or o["metadata"]["resourceVersion"]) for o in listed["items"]}


@pytest.fixture
def scratch_namespace(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """A namespace enforcing Pod Security "restricted" and one enforcing "baseline" (names)."""
    names = (f"psa-r-{uuid.uuid4().hex[:8]}", f"psa-b-{uuid.uuid4().hex[:8]}")
    with control_plane.client() as api:
        core = k8s.CoreV1Api(api)
        for name, level in zip(names, ("restricted", "baseline"), strict=True):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
                name=name, labels={"pod-security.kubernetes.io/enforce": level})))
            for account in (AGENT_SA, CONTROLLER):
                core.create_namespaced_service_account(name, k8s.V1ServiceAccount(
                    metadata=k8s.V1ObjectMeta(name=account)))
    yield names
    with control_plane.client() as api:
        for name in names:
            k8s.CoreV1Api(api).delete_namespace(name)


def pod_security_violations(control_plane: ControlPlane, namespace: str, spec: dict[str, Any]) -> set[str]:
    """The Pod Security checks a pod with `spec` fails in `namespace` (dry run; empty when admitted)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
           "spec": {**spec, "nodeName": "nowhere"}}
    status, body = api_request(control_plane, "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All",
                               body=pod)
    if status == 201:
        return set()
    assert status == 403, body
    # '... violates PodSecurity "restricted:latest": hostPath volumes (volumes "a", "b"), runAsUser=0 (...)'
    found = re.search(r'violates PodSecurity "[^"]+": (.*)$', body["message"], re.S)
    assert found, body["message"]
    parts = re.split(r",\s*(?![^()]*\))", found.group(1))
    return {re.sub(r"\s*\(.*", "", part, flags=re.S).strip() for part in parts}


def test_only_host_paths_and_root_keep_the_pod_from_stricter_pod_security(
    control_plane: ControlPlane, applied_base: subprocess.CompletedProcess[str],  # noqa: F811 - fixture
    docs: list[dict[str, Any]], scratch_namespace: tuple[str, str],
) -> None:
    """The pod template, as a pod, against the API server's own Pod Security admission."""
    restricted, baseline = scratch_namespace
    spec = pod_spec(docs)
    assert pod_security_violations(control_plane, baseline, spec) == {"hostPath volumes"}
    # "restricted" names hostPath under its volume-type check; root is the only other thing it objects to.
    violations = pod_security_violations(control_plane, restricted, spec)
    assert "restricted volume types" in violations
    assert violations <= {"restricted volume types", "runAsNonRoot != true", "runAsUser=0"}, violations
    assert pod_security_violations(control_plane, NAMESPACE, spec) == set()


def test_controller_meets_pod_security_restricted(
    control_plane: ControlPlane, applied_base: subprocess.CompletedProcess[str],  # noqa: F811 - fixture
    docs: list[dict[str, Any]], scratch_namespace: tuple[str, str],
) -> None:
    """The controller needs nothing from the host: the strictest level admits its pod as it is."""
    restricted, _ = scratch_namespace
    assert pod_security_violations(control_plane, restricted, controller_spec(docs)) == set()
    # The check can fail: the same spec running as root is refused.
    as_root = {**controller_spec(docs), "securityContext": {**controller_spec(docs)["securityContext"],
                                                            "runAsUser": 0, "runAsNonRoot": False}}
    assert pod_security_violations(control_plane, restricted, as_root)


def test_the_api_server_stores_the_controller_as_built(
    control_plane: ControlPlane, applied_base: subprocess.CompletedProcess[str],  # noqa: F811 - fixture
    docs: list[dict[str, Any]],
) -> None:
    status, stored = api_request(control_plane, "GET",
                                 f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER}")
    assert status == 200, stored
    assert stored["spec"]["replicas"] == 2
    (container,) = stored["spec"]["template"]["spec"]["containers"]
    built = controller_container(docs)
    for key in ("image", "command", "args", "securityContext", "resources"):
        assert container[key] == built[key], key
    status, pdb = api_request(control_plane, "GET",
                              f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/{CONTROLLER}")
    assert status == 200, pdb
    assert pdb["spec"]["maxUnavailable"] == 1


def test_namespace_of_the_base_allows_the_agent(docs: list[dict[str, Any]]) -> None:
    labels = one(docs, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"

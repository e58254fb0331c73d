"""The daemonset/ kustomize base: what it renders, the limits it promises, and that an API server takes it."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import BASE, CRDS, Kubectl, api_request, build_kubectl, kustomize_build
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
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# Verbs that hand out more than the rule names: granting roles, acting as someone else, minting tokens.
POWER_VERBS = {"escalate", "bind", "impersonate", "approve", "sign", "*"}
# Objects a compromised agent must never reach: credentials, other workloads' shells and tokens.
FORBIDDEN_RESOURCES = {"secrets", "serviceaccounts/token", "pods/exec", "pods/attach", "pods/portforward",
                       "nodes/proxy", "certificatesigningrequests", "tokenreviews", "subjectaccessreviews"}
# The one write the admission policy leaves alone: an Event names the object it is about but changes none.
UNCONFINED_WRITES = {("", "events")}


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
    spec: dict[str, Any] = one(docs, "DaemonSet", "topolet-agent")["spec"]["template"]["spec"]
    return spec


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = pod_spec(docs)
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize(("kind", "name"), [
    ("Namespace", NAMESPACE),
    ("ServiceAccount", AGENT_SA),
    ("ClusterRole", AGENT_SA),
    ("ClusterRoleBinding", AGENT_SA),
    ("Role", AGENT_SA),
    ("RoleBinding", AGENT_SA),
    ("DaemonSet", "topolet-agent"),
    ("ValidatingAdmissionPolicy", "topolet-agent-own-node"),
    ("ValidatingAdmissionPolicyBinding", "topolet-agent-own-node"),
    ("ConfigMap", "topolet-dashboards"),
    *(("CustomResourceDefinition", crd) for crd in CRDS),
])
def test_base_renders(docs: list[dict[str, Any]], kind: str, name: str) -> None:
    obj = one(docs, kind, name)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
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
    for path in (args.state_dir, args.features_dir, args.pod_resources_socket):
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


def test_security_context_is_narrow(docs: list[dict[str, Any]]) -> None:
    spec = pod_spec(docs)
    for host_ns in ("hostPID", "hostIPC", "hostNetwork"):
        assert not spec.get(host_ns, False), host_ns
    pod_sc = spec.get("securityContext", {})
    for c in containers(docs):
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
        "/sys", "/sys/fs/cgroup", "/var/lib/topolet",
        "/etc/kubernetes/node-feature-discovery/features.d", "/var/lib/kubelet/pod-resources",
    }
    writable = {host[m["name"]] for c in containers(docs) for m in c.get("volumeMounts", [])
                if m["name"] in host and not m.get("readOnly", False)}
    assert writable == {"/sys/fs/cgroup", "/var/lib/topolet",
                        "/etc/kubernetes/node-feature-discovery/features.d"}


def test_tolerates_every_taint_and_rolls_ten_percent_at_a_time(docs: list[dict[str, Any]]) -> None:
    ds = one(docs, "DaemonSet", "topolet-agent")
    assert {"operator": "Exists"} in pod_spec(docs)["tolerations"]
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == "10%"
    assert strategy["rollingUpdate"].get("maxSurge", 0) == 0


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
        assert not set(rule["verbs"]) & (POWER_VERBS | {"delete", "deletecollection"}), where


def test_bindings_grant_only_the_agent(docs: list[dict[str, Any]]) -> None:
    bindings = find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
    assert bindings
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": AGENT_SA, "namespace": NAMESPACE}]
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) in {("ClusterRole", AGENT_SA), ("Role", AGENT_SA)}


def test_every_granted_write_is_confined_by_the_admission_policy(docs: list[dict[str, Any]]) -> None:
    """RBAC cannot say "my node"; each write it grants must fall under the policy that can."""
    policy = one(docs, "ValidatingAdmissionPolicy", "topolet-agent-own-node")["spec"]
    covered: set[tuple[str, str, str]] = set()
    for rule in policy["matchConstraints"]["resourceRules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for op in rule["operations"]:
                    covered.add((group, resource, op))
    verb_to_op = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
    for where, rule in rbac_rules(docs):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if (group, resource) in UNCONFINED_WRITES:
                    continue
                for verb in set(rule["verbs"]) & WRITE_VERBS:
                    # Server-side apply reaches admission as CREATE when the object is new.
                    ops = {verb_to_op[verb], "CREATE"} if verb == "patch" else {verb_to_op[verb]}
                    for op in ops:
                        assert (group, resource, op) in covered, f"{where}: {verb} {group}/{resource}"
    assert policy["failurePolicy"] == "Fail"
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "topolet-agent-own-node")["spec"]
    assert binding["policyName"] == "topolet-agent-own-node"
    assert binding["validationActions"] == ["Deny"]


def test_admission_policy_names_the_agents_user(docs: list[dict[str, Any]]) -> None:
    """The policy matches by user name, which kustomize's namespace does not rewrite: keep them in step."""
    sa = one(docs, "ServiceAccount", AGENT_SA)
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    conditions = one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert [c["expression"] for c in conditions] == [f"request.userInfo.username == '{user}'"]


# ---- the dashboard -------------------------------------------------------------------------------


def exported_series() -> set[str]:
    """The series names the agent's registry exposes (counters with _total, histograms' buckets...)."""
    from agent.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",),
                "gauge": ("",), "summary": ("", "_sum", "_count")}
    return {f.name + s for f in Metrics().registry.collect() for s in suffixes[f.type]}


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_ships_as_a_sidecar_configmap(docs: list[dict[str, Any]]) -> None:
    cm = one(docs, "ConfigMap", "topolet-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((BASE / "dashboards" / "topolet.json").read_text())
    assert json.loads(cm["data"]["topolet.json"]) == shipped


def test_dashboard_queries_only_series_the_agent_exports() -> None:
    dashboard = json.loads((BASE / "dashboards" / "topolet.json").read_text())
    exprs = dashboard_exprs(dashboard)
    used = {m for e in exprs for m in re.findall(r"\btopolet_[a-z0-9_]+", e)}
    assert used <= exported_series(), used - exported_series()
    wanted = {"topolet_cpus", "topolet_allocations_total", "topolet_pin_latency_seconds_bucket",
              "topolet_cgroup_drift_total", "topolet_state_writes_total", "topolet_info"}
    assert wanted <= used, wanted - used
    assert any("histogram_quantile(0.99" in e and "topolet_pin_latency_seconds_bucket" in e for e in exprs)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


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
    again = kubectl.run("apply", "-k", str(BASE))
    lines = [line for line in again.stdout.splitlines() if line.strip()]
    assert lines and all(line.endswith(" unchanged") for line in lines), again.stdout


@pytest.fixture
def scratch_namespace(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """A namespace enforcing Pod Security "restricted" and one enforcing "baseline" (names)."""
    names = (f"psa-r-{uuid.uuid4().hex[:8]}", f"psa-b-{uuid.uuid4().hex[:8]}")
    with control_plane.client() as api:
        core = k8s.CoreV1Api(api)
        for name, level in zip(names, ("restricted", "baseline"), strict=True):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
                name=name, labels={"pod-security.kubernetes.io/enforce": level})))
            core.create_namespaced_service_account(name, k8s.V1ServiceAccount(
                metadata=k8s.V1ObjectMeta(name=AGENT_SA)))
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


def test_namespace_of_the_base_allows_the_agent(docs: list[dict[str, Any]]) -> None:
    labels = one(docs, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"

"""charts/topolet without a cluster: `helm lint`, `helm template` with several value sets, the schema, and
the same objects as the kustomize base (`kubectl kustomize daemonset/`, with its components) for the
same settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import (
    AS_BASE,
    CHART,
    IMAGE,
    MAP_API,
    NAMESPACE,
    Helm,
    compare_with_base,
    find,
    render,
    set_args,
)
from tests.controlplane.kubectl import base_with_components, build_kubectl, kustomize_build
from tests.monitoring.prometheus_rule import RUNBOOK_PLACEHOLDER

MAP_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}

# Value sets every test below renders (and `helm lint --strict` checks).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "agent-only": {"controller.enabled": False},
    "controller-only": {"agent.enabled": False},
    "two-pools": {"agent.pools": [
        {"name": "cpu", "nodeSelector": {"pool": "cpu"}, "reservedCpus": "0"},
        {"name": "gpu", "nodeSelector": {"nvidia.com/gpu.present": "true"},
         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
         "reservedCpus": "0-1,72-73", "enforcement": "off"},
    ]},
    "monitoring": {"monitoring.podMonitors.enabled": True, "monitoring.prometheusRule.enabled": True,
                   "monitoring.podMonitors.labels": {"release": "kube-prometheus-stack"},
                   "monitoring.prometheusRule.labels": {"release": "kube-prometheus-stack"},
                   "monitoring.dashboards.namespace": "monitoring",
                   "monitoring.dashboards.labels": {"grafana_dashboard": "topolet"},
                   "monitoring.dashboards.annotations": {"grafana_folder": "topolet"}},
    "kueue": {"kueue.enabled": True},
    "image-by-digest": {"image.repository": "registry.example.com/topolet",
                        "image.digest": "sha256:" + "ab" * 32, "image.pullSecrets": ["regcred"]},
    "no-crds-no-policies": {"crds.install": False, "networkPolicy.enabled": False,
                            "monitoring.dashboards.enabled": False},
}


def kinds_names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def agent_args(ds: dict[str, Any]) -> list[str]:
    args: list[str] = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean(helm: Helm, name: str) -> None:
    done = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                    *set_args({**IMAGE, **VALUE_SETS[name]}))
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def test_defaults_render_the_base(helm: Helm) -> None:
    """Default values on an API server serving MutatingAdmissionPolicy: the objects of `kubectl
    kustomize daemonset/`, field for field, less the chart's deliberate additions."""
    base = [d for d in yaml.safe_load_all(kustomize_build(build_kubectl())) if d]
    assert compare_with_base(render(helm, AS_BASE), base) == []


def test_components_render_as_values(helm: Helm, tmp_path: Path) -> None:
    """The base with the kueue and prometheus-operator components, and the chart with their values."""
    base = base_with_components(tmp_path, "kueue", "prometheus-operator")
    # The base's runbook placeholder (the chart's default, empty, drops runbook_url instead).
    chart = render(helm, {**AS_BASE, "kueue.enabled": True, "monitoring.podMonitors.enabled": True,
                          "monitoring.prometheusRule.enabled": True,
                          "monitoring.runbookBaseURL": RUNBOOK_PLACEHOLDER})
    assert compare_with_base(chart, base) == []


def test_agent_only_component_renders_as_controller_disabled(helm: Helm, tmp_path: Path) -> None:
    """components/agent-only, which drops the controller and its policies, and `controller.enabled: false`."""
    base = base_with_components(tmp_path, "agent-only")
    assert not [d for d in base if "controller" in d["metadata"]["name"]
                or d["metadata"]["name"] in ("topolet-placement", "topolet-admission-fields")]
    assert compare_with_base(render(helm, {**AS_BASE, **VALUE_SETS["agent-only"]}), base) == []


def test_no_crds_component_renders_as_crds_not_installed(helm: Helm, tmp_path: Path) -> None:
    """components/no-crds (so that `kubectl delete -k` never deletes a CRD) and `crds.install: false`."""
    base = base_with_components(tmp_path, "no-crds")
    assert not [d for d in base if d["kind"] == "CustomResourceDefinition"]
    assert compare_with_base(render(helm, {**AS_BASE, "crds.install": False}), base) == []


def test_node_pool_components_render_as_pool_values(helm: Helm, tmp_path: Path) -> None:
    """cgroup-v1-cpuset and nri-required, which patch the agent, as a pool's values."""
    base = base_with_components(tmp_path, "cgroup-v1-cpuset", "nri-required")
    chart = render(helm, {**AS_BASE, "agent.pools": [{"name": "default",
                                                      "tolerations": [{"operator": "Exists"}],
                                           "reservedCpus": "0", "cgroupV1Cpuset": True,
                                           "nriRequired": True}]})
    assert compare_with_base(chart, base) == []


def test_placement_policies_only_where_the_api_server_serves_them(helm: Helm) -> None:
    served = kinds_names(render(helm, {"kueue.enabled": True}))
    assert {("MutatingAdmissionPolicy", "topolet-placement"),
            ("MutatingAdmissionPolicy", "topolet-kueue-placement")} <= served
    older = render(helm, {"kueue.enabled": True}, api_versions=())
    assert not [d for d in older if d["kind"] in MAP_KINDS]
    forced = render(helm, {"controller.placementPolicy": True}, api_versions=())
    assert ("MutatingAdmissionPolicy", "topolet-placement") in kinds_names(forced)
    never = render(helm, {"controller.placementPolicy": False})
    assert not [d for d in never if d["kind"] in MAP_KINDS]


def test_agent_only_has_nothing_of_the_controller(helm: Helm) -> None:
    docs = render(helm, {**AS_BASE, **VALUE_SETS["agent-only"]})
    assert not [k for k, n in kinds_names(docs) if "controller" in n or "admission-fields" in n
                or "placement" in n], kinds_names(docs)
    assert ("DaemonSet", "topolet-agent") in kinds_names(docs)
    assert ("NetworkPolicy", "topolet-agent-metrics") in kinds_names(docs)


def test_controller_only_has_nothing_of_the_agent(helm: Helm) -> None:
    docs = render(helm, VALUE_SETS["controller-only"])
    assert not [n for _, n in kinds_names(docs) if n.startswith("topolet-agent")], kinds_names(docs)
    assert ("Deployment", "topolet-controller") in kinds_names(docs)


def test_two_pools_are_two_daemonsets(helm: Helm) -> None:
    docs = render(helm, VALUE_SETS["two-pools"])
    daemonsets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    assert set(daemonsets) == {"topolet-agent-cpu", "topolet-agent-gpu"}
    cpu, gpu = daemonsets["topolet-agent-cpu"], daemonsets["topolet-agent-gpu"]
    for ds, pool in ((cpu, "cpu"), (gpu, "gpu")):
        selector = ds["spec"]["selector"]["matchLabels"]
        assert selector["topolet.io/node-pool"] == pool
        assert ds["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    assert cpu["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu", "kubernetes.io/os": "linux"}
    assert gpu["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}
    # A pool without tolerations tolerates nothing; the GPU pool its own taint only.
    assert "tolerations" not in cpu["spec"]["template"]["spec"]
    assert gpu["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "--reserved-cpus=0" in agent_args(cpu)
    assert "--reserved-cpus=0-1,72-73" in agent_args(gpu)
    assert not [a for a in agent_args(cpu) if a.startswith("--enforcement")]
    assert "--enforcement=off" in agent_args(gpu)


def test_pool_names_are_unique(helm: Helm) -> None:
    pools = [{"name": "a", "reservedCpus": "0"}, {"name": "a", "reservedCpus": "1"}]
    done = helm.run("template", "topolet", str(CHART), *set_args({**IMAGE, "agent.pools": pools}),
                    check=False)
    assert done.returncode != 0
    assert 'the name "a" is used twice' in done.stderr


@pytest.mark.parametrize(("value", "flag"), [("on", "--enforcement=on"), ("off", "--enforcement=off"),
                                            (True, "--enforcement=on"), (False, "--enforcement=off"),
                                            ("auto", None)])
def test_enforcement_maps_to_the_agent_flag(helm: Helm, value: object, flag: str | None) -> None:
    from agent.cli import build_parser

    ds = find(render(helm, {"agent.enforcement": value}), "DaemonSet", "topolet-agent")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    given = [a for a in agent_args(ds) if a.startswith("--enforcement")]
    assert given == ([flag] if flag else [])
    # The agent's own parser accepts the whole command line.
    build_parser().parse_args([*container["command"][1:], *container["args"]])


def test_label_sink_and_route(helm: Helm) -> None:
    docs = render(helm, {"agent.labelSink": "node", "agent.route": "pod-cgroup"})
    ds = find(docs, "DaemonSet", "topolet-agent")
    assert "--label-sink=node" in agent_args(ds)
    assert "--route=pod-cgroup" in agent_args(ds)
    assert "--numa-scope=container" in agent_args(ds)  # the kubelet's default, as the base has it


def test_numa_scope(helm: Helm) -> None:
    ds = find(render(helm, {"agent.numaScope": "pod"}), "DaemonSet", "topolet-agent")
    assert [a for a in agent_args(ds) if a.startswith("--numa-scope")] == ["--numa-scope=pod"]


def test_monitoring_objects_and_dashboards(helm: Helm) -> None:
    docs = render(helm, VALUE_SETS["monitoring"])
    for name in ("topolet-agent", "topolet-controller"):
        assert find(docs, "PodMonitor", name)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert find(docs, "PrometheusRule", "topolet")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboards = find(docs, "ConfigMap", "topolet-dashboards")
    assert dashboards["metadata"]["namespace"] == "monitoring"
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "topolet"
    assert dashboards["metadata"]["annotations"] == {"grafana_folder": "topolet"}
    base = CHART.parents[1] / "daemonset" / "dashboards"
    assert dashboards["data"] == {p.name: p.read_text() for p in base.glob("*.json")}
    # An agent-only install scrapes no controller.
    agent_only = render(helm, {**VALUE_SETS["monitoring"], "controller.enabled": False})
    assert [d["metadata"]["name"] for d in agent_only if d["kind"] == "PodMonitor"] == ["topolet-agent"]


def test_image_by_digest_with_pull_secrets(helm: Helm) -> None:
    docs = render(helm, VALUE_SETS["image-by-digest"])
    for kind, name in (("DaemonSet", "topolet-agent"), ("Deployment", "topolet-controller")):
        spec = find(docs, kind, name)["spec"]["template"]["spec"]
        assert spec["containers"][0]["image"] == "registry.example.com/topolet@sha256:" + "ab" * 32
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    tagged = find(render(helm, {"image.tag": "0.2.0"}), "DaemonSet", "topolet-agent")
    assert tagged["spec"]["template"]["spec"]["containers"][0]["image"] == "topolet:0.2.0"


def test_switches_leave_objects_out(helm: Helm) -> None:
    left = kinds_names(render(helm, VALUE_SETS["no-crds-no-policies"])) - {("ConfigMap", "topolet-crds")}
    assert not {k for k, _ in left} & {"CustomResourceDefinition", "NetworkPolicy", "ConfigMap"}


def test_other_namespace_moves_the_policies_user_names(helm: Helm) -> None:
    """The admission policies match the agent and the controller by their service accounts' user names."""
    done = helm.run("template", "t", str(CHART), "--namespace", "elsewhere", "--api-versions", MAP_API,
                    *set_args(IMAGE))
    assert "system:serviceaccount:topolet-system:" not in done.stdout
    assert "system:serviceaccount:elsewhere:topolet-agent" in done.stdout
    assert "system:serviceaccount:elsewhere:topolet-controller" in done.stdout
    for d in yaml.safe_load_all(done.stdout):
        for subject in (d or {}).get("subjects", []):
            assert subject["namespace"] == "elsewhere"


@pytest.mark.parametrize(("values", "message"), [
    ({"agent.enforcement": "sometimes"}, "/agent/enforcement"),
    ({"agent.pools": [{"name": "gpu", "reservedCpus": "zero"}]}, "/agent/pools/0/reservedCpus"),
    ({"agent.pools": [{"name": "Bad_Name", "reservedCpus": "0"}]}, "/agent/pools/0/name"),
    ({"crds.install": "maybe"}, "/crds/install"),
    ({"image.digest": "latest"}, "/image/digest"),
    ({"agent.labelSink": "nfd"}, "/agent/labelSink"),
    ({"agent.numaScope": "node"}, "/agent/numaScope"),
    ({"controller.replicas": 0}, "/controller/replicas"),
    ({"agent.resoures": {}}, "resoures"),
    ({"cleanup.timeoutSeconds": 0}, "/cleanup/timeoutSeconds"),
    ({"cleanup.timeoutSeconds": 241}, "/cleanup/timeoutSeconds"),  # the hook past Helm's default timeout
    ({"monitoring.runbookBaseURL": "daemonset/"}, "/monitoring/runbookBaseURL"),
    ({"monitoring.runbookBaseURL": "https://wiki.example.com/t"}, "/monitoring/runbookBaseURL"),
])
def test_schema_rejects_bad_values(helm: Helm, values: dict[str, Any], message: str) -> None:
    for command in ("lint", "template"):
        args = [command, *(["topolet"] if command == "template" else []), str(CHART),
                *set_args({**IMAGE, **values})]
        done = helm.run(*args, check=False)
        assert done.returncode != 0, f"helm {command} accepted {values}"
        output = done.stderr + done.stdout
        assert "schema" in output and message in output, output


def test_kueue_needs_the_controller(helm: Helm) -> None:
    done = helm.run("template", "topolet", str(CHART), *set_args({**IMAGE, "kueue.enabled": True,
                                                                 "controller.enabled": False}), check=False)
    assert done.returncode != 0 and "kueue.enabled needs controller.enabled" in done.stderr



def test_uninstall_hook_cleans_every_pools_nodes_and_never_a_crd(helm: Helm) -> None:
    """The pre-delete hook Job runs `topolet cleanup` over every pool's DaemonSet (tests/realnode/
    test_uninstall.py runs that command against a real node's agent); its RBAC reaches no CRD."""
    docs = render(helm, VALUE_SETS["two-pools"])
    hooks = [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert {(d["kind"], d["metadata"]["name"]) for d in hooks} == {
        (kind, "topolet-cleanup") for kind in
        ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job")}
    for d in hooks:
        assert d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
        # Gone whatever the outcome: a failed hook leaves nothing to orphan (test_uninstall_hook.py).
        policy = d["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert policy == "before-hook-creation,hook-succeeded,hook-failed"
    job = find(docs, "Job", "topolet-cleanup")
    # The RBAC first (weight -10), then the Job.
    assert int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) > max(
        int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hooks if d["kind"] != "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["topolet", "cleanup"]
    assert container["args"] == ["--objects", "--all-nodes", "--namespace=topolet-system",
                                 "--daemonset=topolet-agent-cpu", "--daemonset=topolet-agent-gpu",
                                 "--timeout-seconds=180"]
    # The command's budget, then 30 s for its pod to start: inside Helm's default --timeout (300 s).
    assert job["spec"]["activeDeadlineSeconds"] == 210
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-succeeded,hook-failed"
    longest = find(render(helm, {"cleanup.timeoutSeconds": 240}), "Job", "topolet-cleanup")
    assert longest["spec"]["activeDeadlineSeconds"] == 270 < 300
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "topolet-cleanup"
    for role in (d for d in hooks if d["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert "apiextensions.k8s.io" not in rule["apiGroups"] and "*" not in rule["verbs"], rule
    off = render(helm, {"cleanup.enabled": False})
    assert not [d for d in off if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert not [d for d in render(helm, VALUE_SETS["controller-only"]) if d["kind"] == "Job"]


def test_runbook_urls_only_under_a_base_that_is_set(helm: Helm) -> None:
    """By default (monitoring.runbookBaseURL empty) no alert has a runbook_url, and nothing else of it
    changes; set, every alert's runbook_url is the base, then its section of daemonset/README.md (the
    kustomize overlay's generator entry does the same: tests/monitoring/test_component.py)."""
    values = {"monitoring.prometheusRule.enabled": True}
    unset = find(render(helm, values), "PrometheusRule", "topolet")
    moved = find(render(helm, {**values, "monitoring.runbookBaseURL": "https://wiki.example.com/t/"}),
                 "PrometheusRule", "topolet")
    pairs = [(a, b) for ga, gb in zip(unset["spec"]["groups"], moved["spec"]["groups"], strict=True)
             for a, b in zip(ga["rules"], gb["rules"], strict=True) if "alert" in a]
    assert pairs
    for without, with_base in pairs:
        assert "runbook_url" not in without["annotations"], without["alert"]
        url = with_base["annotations"].pop("runbook_url")
        assert url == f"https://wiki.example.com/t/daemonset/README.md#{with_base['alert'].lower()}"
        assert with_base == without


@pytest.mark.parametrize(("values", "says"), [
    ({"monitoring.prometheusRule.enabled": True}, True),
    ({"monitoring.prometheusRule.enabled": True, "monitoring.runbookBaseURL": "https://wiki.example.com/t/"},
     False),
    ({}, False),  # no PrometheusRule, no alerts to link
])
def test_notes_say_the_alerts_have_no_runbook_links(helm: Helm, values: dict[str, Any], says: bool) -> None:
    done = helm.run("install", "topolet", str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
                    *set_args({**IMAGE, **values}))
    notes = done.stdout.partition("NOTES:")[2]
    assert "Monitoring:" in notes
    line = ("The alerts have no runbook links until monitoring.runbookBaseURL points at where you serve "
            "topolet's runbooks")
    assert (line in notes) == says, notes


# The kinds the base and its components render that the API server keeps without a namespace.
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
                  "MutatingAdmissionPolicyBinding", "AdmissionCheck"}
COMPONENTS = ("kueue", "prometheus-operator", "cgroup-v1-cpuset", "nri-required", "local-image")


def test_kustomize_gives_only_namespaced_objects_a_namespace(tmp_path: Path) -> None:
    """The base (and its components) name topolet-system on every namespaced object and on nothing
    cluster-scoped: kustomize's `namespace:` transform, left out, would stamp it on the admission
    policies and their bindings too (kinds its schema does not know), and on nothing else."""
    docs = base_with_components(tmp_path, *COMPONENTS)
    kinds = {d["kind"] for d in docs}
    assert {"ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "AdmissionCheck"} <= kinds
    for d in docs:
        namespace = d["metadata"].get("namespace")
        where = f"{d['kind']}/{d['metadata']['name']}"
        assert namespace == (None if d["kind"] in CLUSTER_SCOPED else NAMESPACE), where
        for subject in d.get("subjects", []):
            assert subject.get("namespace") == NAMESPACE, where


@pytest.mark.parametrize("values", [{}, {"image.tag": "0.2.0"}, {"agent.enabled": False}])
def test_an_image_nobody_named_is_refused_in_one_line(helm: Helm, values: dict[str, Any]) -> None:
    """No default image: the placeholder would install "successfully" and never pull. (`helm lint`
    reports a template's `fail` as information only; install and template stop.)"""
    done = helm.run("template", "topolet", str(CHART), *set_args(values), check=False)
    assert done.returncode != 0, "helm template accepted no image"
    assert "image.repository is not set" in done.stderr and "make image-push" in done.stderr, done.stderr


def test_nfds_crd_is_never_rendered(helm: Helm) -> None:
    """`helm template` sees no cluster (GitOps): the NRT CRD and the release's record of the CRDs it
    rendered (always there, empty or not: its absence marks a release older than the record), never
    NFD's NodeFeature CRD, whatever crds.install says."""
    for mode in ("auto", True, False):
        docs = render(helm, {"crds.install": mode})
        crds = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
        assert crds == ([] if mode is False else ["noderesourcetopologies.topology.node.k8s.io"])
        assert find(docs, "ConfigMap", "topolet-crds")["data"] == {"crds": ",".join(crds)}


def test_network_policies_are_off_by_default_and_never_open_to_all(helm: Helm) -> None:
    """The chart cannot know where Prometheus runs: no NetworkPolicy unless asked, and one asked for
    must name a peer (an empty `from`, or an empty peer, would admit everyone)."""
    assert not [d for d in render(helm) if d["kind"] == "NetworkPolicy"]
    for bad in ([], [{}]):
        done = helm.run("template", "topolet", str(CHART), *set_args(
            {**IMAGE, "networkPolicy.enabled": True, "networkPolicy.from": bad}), check=False)
        assert done.returncode != 0 and "/networkPolicy" in done.stderr, done.stderr
    docs = render(helm, AS_BASE)
    for name in ("topolet-agent-metrics", "topolet-controller-metrics"):
        ingress = find(docs, "NetworkPolicy", name)["spec"]["ingress"][0]
        assert ingress["from"] == AS_BASE["networkPolicy.from"]


@pytest.mark.parametrize(("values", "groups"), [
    ({}, ["topolet-agent.records", "topolet-agent.alerts", "topolet-controller"]),
    ({"controller.enabled": False}, ["topolet-agent.records", "topolet-agent.alerts"]),
    ({"agent.enabled": False}, ["topolet-controller"]),
])
def test_rules_only_for_the_parts_installed(helm: Helm, values: dict[str, Any], groups: list[str]) -> None:
    """An agent-only install has no TopoletControllerDown to fire for ever, and the reverse."""
    docs = render(helm, {**values, "monitoring.prometheusRule.enabled": True})
    rule = find(docs, "PrometheusRule", "topolet")
    assert [g["name"] for g in rule["spec"]["groups"]] == groups

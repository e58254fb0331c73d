"""The chart's settings for the agent's and the controller's flags, pods and rollouts (issue 33, item 6):
each value renders what it says, a flag at its command's own default is not passed (the defaults render
the kustomize base: test_render.py), and what would break the release is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import CHART, IMAGE, NAMESPACE, Helm, find, render, set_args

AGENT = ("DaemonSet", "topolet-agent")
CONTROLLER = ("Deployment", "topolet-controller")
CLEANUP = ("Job", "topolet-cleanup")


def container(obj: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return first


def added_args(helm: Helm, kind: str, name: str, values: dict[str, Any]) -> list[str]:
    """The args `values` add to the defaults' (in order), after checking the command's own parser
    takes the whole command line."""
    from agent.cli import build_parser

    default = container(find(render(helm), kind, name))["args"]
    ours = container(find(render(helm, values), kind, name))
    # As the kubelet expands $(VAR) from the container's env.
    expanded = [arg.replace("$(POD_NAMESPACE)", NAMESPACE) for arg in ours["args"]]
    build_parser().parse_args([*ours["command"][1:], *expanded])
    assert ours["args"][:len(default)] == default
    added: list[str] = ours["args"][len(default):]
    return added


def refused(helm: Helm, values: dict[str, Any]) -> str:
    """helm template's error output for `values`, which it must refuse."""
    done = helm.run("template", "topolet", str(CHART), "--namespace", NAMESPACE,
                    *set_args({**IMAGE, **values}), check=False)
    assert done.returncode != 0, f"helm template accepted {values}"
    return done.stderr + done.stdout


def test_defaults_are_the_commands_own() -> None:
    """A value at its default is not passed: the chart's defaults must be the commands' own."""
    from agent.cli import build_parser

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    parser = build_parser()
    agent, controller, cleanup = (parser.parse_args([c]) for c in ("agent", "controller", "cleanup"))
    assert values["agent"]["logLevel"] == agent.log_level
    assert values["agent"]["reconcileSeconds"] == agent.reconcile_seconds
    assert values["agent"]["migConfig"] == agent.mig_config
    assert values["agent"]["gfdCompat"] is agent.gfd_compat
    assert values["controller"]["logLevel"] == controller.log_level
    assert values["controller"]["kueue"] == controller.kueue
    assert values["controller"]["queues"] == {} and controller.queue == []
    assert values["cleanup"]["logLevel"] == cleanup.log_level


@pytest.mark.parametrize(("values", "added"), [
    ({"controller.queues": {"gpu-team": "StrictFIFO"}}, ["--queue=gpu-team=StrictFIFO"]),
    ({"controller.queues": {"b.team": "BestEffortFIFO", "a_team": "StrictFIFO"}},
     ["--queue=a_team=StrictFIFO", "--queue=b.team=BestEffortFIFO"]),
    ({"controller.queues": {"gpu": {"mode": "StrictFIFO", "namespaces": ["ml-a", "ml-b"]},
                            "shared": {"mode": "BestEffortFIFO"}, "any": "StrictFIFO"}},
     ["--queue=any=StrictFIFO", "--queue=gpu=StrictFIFO:ml-a,ml-b", "--queue=shared=BestEffortFIFO"]),
    ({"controller.kueue": "off"}, ["--kueue=off"]),
    ({"controller.kueue": False}, ["--kueue=off"]),
    ({"controller.kueue": "on", "kueue.enabled": True}, ["--kueue=on"]),
    ({"controller.kueue": True, "kueue.enabled": True}, ["--kueue=on"]),
    ({"controller.kueue": "auto", "kueue.enabled": True}, []),
    ({"controller.logLevel": "debug"}, ["--log-level=debug"]),
    ({"controller.logLevel": "info"}, []),
    ({"controller.extraArgs": ["--resync-seconds=10", "--queue=x=StrictFIFO"],
      "controller.queues": {"y": "StrictFIFO"}, "controller.logLevel": "error"},
     ["--queue=y=StrictFIFO", "--log-level=error", "--resync-seconds=10", "--queue=x=StrictFIFO"]),
])
def test_controller_flags(helm: Helm, values: dict[str, Any], added: list[str]) -> None:
    assert added_args(helm, *CONTROLLER, values) == added


@pytest.mark.parametrize(("values", "added"), [
    ({"agent.reconcileSeconds": 2.5}, ["--reconcile-seconds=2.5"]),
    ({"agent.reconcileSeconds": 30}, ["--reconcile-seconds=30"]),
    ({"agent.reconcileSeconds": 5}, []),
    ({"agent.migConfig": "all-balanced"}, ["--mig-config=all-balanced"]),
    ({"agent.gfdCompat": True}, ["--gfd-compat"]),
    ({"agent.logLevel": "warning"}, ["--log-level=warning"]),
    ({"agent.extraArgs": ["--allow-mig-mode-change"], "agent.logLevel": "debug"},
     ["--log-level=debug", "--allow-mig-mode-change"]),
    # A single pool's own value wins over agent.*, false and "" included.
    ({"agent.gfdCompat": True, "agent.migConfig": "all-balanced", "agent.pools": [
        {"name": "default", "reservedCpus": "0", "gfdCompat": False, "migConfig": "",
         "reconcileSeconds": 1}]},
     ["--reconcile-seconds=1"]),
])
def test_agent_flags(helm: Helm, values: dict[str, Any], added: list[str]) -> None:
    assert added_args(helm, *AGENT, values) == added


def test_agent_flags_per_pool(helm: Helm) -> None:
    pools = [{"name": "cpu", "reservedCpus": "0"},
             {"name": "gpu", "reservedCpus": "0", "migConfig": "all-1g.10gb", "gfdCompat": True}]
    docs = render(helm, {"agent.pools": pools, "agent.reconcileSeconds": 10})
    cpu, gpu = (container(find(docs, "DaemonSet", f"topolet-agent-{p}"))["args"] for p in ("cpu", "gpu"))
    assert [a for a in cpu if a.startswith(("--reconcile", "--mig", "--gfd"))] == ["--reconcile-seconds=10"]
    assert [a for a in gpu if a.startswith(("--reconcile", "--mig", "--gfd"))] == [
        "--reconcile-seconds=10", "--mig-config=all-1g.10gb", "--gfd-compat"]



@pytest.mark.parametrize(("values", "gfd"), [
    ({}, "false"),
    ({"agent.gfdCompat": True}, "true"),
    ({"agent.gfdCompat": True, "agent.pools": [{"name": "default", "reservedCpus": "0", "gfdCompat": False}]},
     "false"),
    ({"agent.pools": [{"name": "cpu", "reservedCpus": "0"},
                      {"name": "gpu", "reservedCpus": "0", "gfdCompat": True}]}, "true"),
])
def test_the_agent_policy_lets_gfd_labels_through_where_an_agent_publishes_them(
        helm: Helm, values: dict[str, Any], gfd: str) -> None:
    """An agent with --gfd-compat publishes nvidia.com/ labels, which topolet-agent-own-node refuses
    unless its gfdCompat variable is true: the chart sets it where any pool runs so, and only there."""
    policy = find(render(helm, values), "ValidatingAdmissionPolicy", "topolet-agent-own-node")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["gfdCompat"] == gfd
    base = yaml.safe_load_all((CHART.parent.parent / "daemonset" / "admission-policy.yaml").read_text())
    ours = next(d for d in base if d["kind"] == "ValidatingAdmissionPolicy")
    assert {k: v for k, v in variables.items() if k != "gfdCompat"} == {
        v["name"]: v["expression"] for v in ours["spec"]["variables"] if v["name"] != "gfdCompat"}

@pytest.mark.parametrize(("values", "message"), [
    ({"kueue.enabled": True, "controller.kueue": "off"}, "controller.kueue=off with kueue.enabled"),
    ({"kueue.enabled": True, "controller.kueue": False}, "controller.kueue=off with kueue.enabled"),
    ({"controller.kueue": "on"}, "controller.kueue=on needs kueue.enabled"),
])
def test_kueue_mode_that_contradicts_kueue_enabled_is_refused(helm: Helm, values: dict[str, Any],
                                                               message: str) -> None:
    errors = [line for line in refused(helm, values).splitlines() if "Error:" in line]
    assert len(errors) == 1 and message in errors[0], errors


def test_cleanup_log_level(helm: Helm) -> None:
    def args(values: dict[str, Any]) -> list[str]:
        return list(container(find(render(helm, values), "Job", "topolet-cleanup"))["args"])

    assert not [a for a in args({}) if a.startswith("--log-level")]
    assert args({"cleanup.logLevel": "debug"})[-1] == "--log-level=debug"


@pytest.mark.parametrize(("kind", "name", "prefix", "chart_env"), [
    (*AGENT, "agent", ["NODE_NAME", "POD_NAMESPACE"]),
    (*CONTROLLER, "controller", ["POD_NAME", "POD_NAMESPACE"]),
])
def test_extra_env_is_appended_and_never_twice(helm: Helm, kind: str, name: str, prefix: str,
                                               chart_env: list[str]) -> None:
    extra = [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
             {"name": "GOMAXPROCS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]
    env = container(find(render(helm, {f"{prefix}.extraEnv": extra}), kind, name))["env"]
    assert [e["name"] for e in env] == [*chart_env, "HTTPS_PROXY", "GOMAXPROCS"]
    assert env[-2:] == extra
    for twice in ([{"name": chart_env[0], "value": "x"}], [extra[0], extra[0]]):
        output = refused(helm, {f"{prefix}.extraEnv": twice})
        assert f"{prefix}.extraEnv: {twice[0]['name']} is set twice" in output, output


@pytest.mark.parametrize(("kind", "name", "prefix"), [(*AGENT, "agent"), (*CONTROLLER, "controller")])
def test_pod_annotations_and_labels(helm: Helm, kind: str, name: str, prefix: str) -> None:
    values = {f"{prefix}.podAnnotations": {"example.com/owner": "team-a", "prometheus.io/scrape": "false"},
              f"{prefix}.podLabels": {"team": "a"}}
    obj = find(render(helm, values), kind, name)
    meta = obj["spec"]["template"]["metadata"]
    assert meta["annotations"]["example.com/owner"] == "team-a"
    assert meta["annotations"]["prometheus.io/scrape"] == "false"  # a base annotation replaced
    assert meta["labels"]["team"] == "a"
    assert meta["labels"].items() >= obj["spec"]["selector"]["matchLabels"].items()
    assert "team" not in obj["spec"]["selector"]["matchLabels"] and "team" not in obj["metadata"]["labels"]


@pytest.mark.parametrize(("prefix", "key"), [
    ("agent", "app.kubernetes.io/name"), ("agent", "app.kubernetes.io/component"),
    ("agent", "topolet.io/node-pool"), ("agent", "app.kubernetes.io/instance"),
    ("controller", "app.kubernetes.io/component"), ("controller", "app.kubernetes.io/name"),
])
def test_pod_labels_never_override_the_selectors(helm: Helm, prefix: str, key: str) -> None:
    output = refused(helm, {f"{prefix}.podLabels": {key: "other"}})
    assert f"{prefix}.podLabels: {key} is one of the chart's own pod labels" in output, output


@pytest.mark.parametrize(("kind", "name", "values", "strategy"), [
    (*AGENT, {"agent.updateStrategy": {"type": "OnDelete"}}, {"type": "OnDelete"}),
    (*AGENT, {"agent.updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}},
     {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
    (*AGENT, {"agent.updateStrategy.rollingUpdate.maxUnavailable": "25%"},
     {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}}),
    (*CONTROLLER, {"controller.strategy": {"type": "Recreate"}}, {"type": "Recreate"}),
    (*CONTROLLER, {"controller.strategy.rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 1}},
     {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 1}}),
])
def test_update_strategies(helm: Helm, kind: str, name: str, values: dict[str, Any],
                           strategy: dict[str, Any]) -> None:
    field = "updateStrategy" if kind == "DaemonSet" else "strategy"
    assert find(render(helm, values), kind, name)["spec"][field] == strategy


def test_controller_placement_is_its_own(helm: Helm) -> None:
    """A GPU-only selector on the agent pools leaves the controller alone; controller.nodeSelector and
    controller.affinity add to the top-level nodeSelector and architectures, as a pool's do."""
    term = {"matchExpressions": [{"key": "node-role.kubernetes.io/infra", "operator": "Exists"}]}
    spread = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone",
         "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "controller"}}}]}
    docs = render(helm, {
        "agent.pools": [{"name": "gpu", "reservedCpus": "0",
                         "nodeSelector": {"nvidia.com/gpu.present": "true"}}],
        "controller.nodeSelector": {"node-role.kubernetes.io/infra": "", "kubernetes.io/os": "linux"},
        "controller.affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}, "podAntiAffinity": spread},
    })
    spec = find(docs, *CONTROLLER)["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role.kubernetes.io/infra": ""}
    arch = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
    assert spec["affinity"] == {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [*term["matchExpressions"], arch]}]}},
        "podAntiAffinity": spread}
    agent_spec = find(docs, *AGENT)["spec"]["template"]["spec"]
    assert agent_spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}
    # The uninstall's hook Job runs where the controller does (its node affinity, not its spread).
    hook = find(docs, *CLEANUP)["spec"]["template"]["spec"]
    assert hook["nodeSelector"] == spec["nodeSelector"]
    assert hook["affinity"] == {"nodeAffinity": spec["affinity"]["nodeAffinity"]}
    # Without controller.affinity, the base's preferred spread over hostnames stays.
    default = find(render(helm), *CONTROLLER)["spec"]["template"]["spec"]["affinity"]
    assert set(default) == {"nodeAffinity", "podAntiAffinity"}


@pytest.mark.parametrize(("values", "secrets"), [
    ({"global.imagePullSecrets": ["parent-cred"]}, ["parent-cred"]),
    ({"global.imagePullSecrets": [{"name": "parent-cred"}]}, ["parent-cred"]),
    ({"image.pullSecrets": ["regcred", "shared"],
      "global.imagePullSecrets": [{"name": "shared"}, "parent.cred"]},
     ["regcred", "shared", "parent.cred"]),
])
def test_global_image_pull_secrets(helm: Helm, values: dict[str, Any], secrets: list[str]) -> None:
    docs = render(helm, values)
    for kind, name in (AGENT, CONTROLLER, CLEANUP):
        spec = find(docs, kind, name)["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": s} for s in secrets]


def test_as_a_subchart_with_a_parents_globals(helm: Helm, tmp_path: Path) -> None:
    """Helm hands a parent's every global to each subchart, validated against the subchart's schema:
    topolet takes the pull secrets and lets the keys meant for the parent's other charts through."""
    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "topolet")
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "platform", "version": "1.0.0",
        "dependencies": [{"name": "topolet", "version": "0.1.0"}]}))
    (parent / "values.yaml").write_text(yaml.safe_dump({
        "global": {"imagePullSecrets": [{"name": "parent-cred"}], "imageRegistry": "registry.example.com",
                   "storageClass": "fast"},
        "topolet": {"image": {"repository": "topolet"}}}))
    done = helm.run("template", "platform", str(parent), "--namespace", NAMESPACE)
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    for kind, name in (AGENT, CONTROLLER):
        spec = find(docs, kind, name)["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "parent-cred"}]


@pytest.mark.parametrize(("values", "where"), [
    ({"controller.queues": {"gpu-team": "FIFO"}}, "/controller/queues"),
    ({"controller.queues": {"-bad": "StrictFIFO"}}, "/controller/queues"),
    ({"controller.queues": {"a" * 64: "StrictFIFO"}}, "/controller/queues"),
    ({"controller.queues": {"gpu": {"namespaces": ["ml"]}}}, "/controller/queues/gpu"),
    ({"controller.queues": {"gpu": {"mode": "StrictFIFO", "namespaces": []}}}, "/controller/queues/gpu"),
    ({"controller.queues": {"gpu": {"mode": "StrictFIFO", "namespaces": ["ML"]}}}, "/controller/queues/gpu"),
    ({"controller.queues": {"gpu": {"mode": "StrictFIFO", "namespace": ["ml"]}}}, "/controller/queues/gpu"),
    ({"controller.kueue": "maybe"}, "/controller/kueue"),
    ({"controller.logLevel": "trace"}, "/controller/logLevel"),
    ({"agent.logLevel": "WARNING"}, "/agent/logLevel"),
    ({"cleanup.logLevel": "verbose"}, "/cleanup/logLevel"),
    ({"agent.reconcileSeconds": 0}, "/agent/reconcileSeconds"),
    ({"agent.migConfig": "all balanced"}, "/agent/migConfig"),
    ({"agent.gfdCompat": "yes"}, "/agent/gfdCompat"),
    ({"agent.extraArgs": "--gfd-compat"}, "/agent/extraArgs"),
    ({"controller.extraEnv": [{"value": "no name"}]}, "/controller/extraEnv/0"),
    ({"agent.podLabels": {"team": 1}}, "/agent/podLabels/team"),
    ({"agent.updateStrategy": {"type": "Recreate"}}, "/agent/updateStrategy/type"),
    # Never two agents on one node: both would enforce its cgroups.
    ({"agent.updateStrategy.rollingUpdate.maxSurge": 1}, "/agent/updateStrategy/rollingUpdate/maxSurge"),
    ({"controller.strategy.rollingUpdate.maxSurge": "lots"}, "/controller/strategy/rollingUpdate/maxSurge"),
    ({"controller.affinity": {"nodeSelector": {}}}, "/controller/affinity"),
    ({"controller.nodeSelector": {"pool": True}}, "/controller/nodeSelector/pool"),
    ({"global.imagePullSecrets": [{"secret": "x"}]}, "/global/imagePullSecrets/0"),
    ({"agent.pools": [{"name": "gpu", "reservedCpus": "0", "gfdCompat": "on"}]}, "/agent/pools/0/gfdCompat"),
])
def test_schema_refuses_bad_settings(helm: Helm, values: dict[str, Any], where: str) -> None:
    output = refused(helm, values)
    assert "schema" in output and where in output, output


def test_lint_is_clean_with_every_setting(helm: Helm) -> None:
    values = {
        "global.imagePullSecrets": ["parent-cred"],
        "agent.logLevel": "debug", "agent.reconcileSeconds": 2, "agent.migConfig": "all-balanced",
        "agent.gfdCompat": True, "agent.extraArgs": ["--allow-mig-mode-change"],
        "agent.extraEnv": [{"name": "A", "value": "b"}], "agent.podAnnotations": {"a": "b"},
        "agent.podLabels": {"team": "a"}, "agent.updateStrategy": {"type": "OnDelete"},
        "controller.logLevel": "warning",
        "controller.queues": {"gpu-team": "StrictFIFO", "ml": {"mode": "StrictFIFO", "namespaces": ["ml-a"]}},
        "controller.kueue": "on", "kueue.enabled": True, "controller.extraArgs": ["--resync-seconds=10"],
        "controller.extraEnv": [{"name": "A", "value": "b"}], "controller.podAnnotations": {"a": "b"},
        "controller.podLabels": {"team": "a"}, "controller.strategy": {"type": "Recreate"},
        "controller.nodeSelector": {"node-role.kubernetes.io/infra": ""},
        "controller.affinity": {"podAntiAffinity": {}}, "cleanup.logLevel": "debug",
    }
    done = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *set_args({**IMAGE, **values}))
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout

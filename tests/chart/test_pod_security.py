"""Pod Security: the chart refuses a namespace whose enforced level refuses the agent, on a real
kube-apiserver, with the one line both READMEs give.

The agent mounts host paths and runs privileged: in a namespace labelled
`pod-security.kubernetes.io/enforce=baseline` (or `restricted`) its DaemonSet would be created and
make no pod while the release reported deployed. `helm install` there fails with the label to set and
creates nothing, as does an upgrade once the namespace is relabelled; labelled `privileged`, it
installs. An install without the agent is never refused; `helm template` sees no namespace.
"""

from __future__ import annotations

import json

import pytest

from tests.chart.helm import CHART, NAMESPACE, RELEASE, Helm, render, set_args
from tests.chart.test_install import OBJECTS
from tests.conftest import REPO
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import api_request

VALUES = {"image.repository": "registry.example.com/topolet", "image.tag": "test"}
LEVEL = "pod-security.kubernetes.io/enforce"
# The recipe charts/topolet/README.md and daemonset/README.md both give, and the chart's refusal names.
RECIPE = f"kubectl label namespace {NAMESPACE} {LEVEL}=privileged --overwrite"


def label_namespace(plane: ControlPlane, level: str) -> None:
    """Namespace NAMESPACE, made if missing, enforcing Pod Security `level`."""
    status, body = api_request(plane, "POST", "/api/v1/namespaces",
                               body={"metadata": {"name": NAMESPACE, "labels": {LEVEL: level}}})
    if status == 409:
        status, body = api_request(plane, "PATCH", f"/api/v1/namespaces/{NAMESPACE}",
                                   body={"metadata": {"labels": {LEVEL: level}}},
                                   content_type="application/merge-patch+json")
    assert status in (200, 201), body


def install(helm: Helm) -> tuple[int, str]:
    done = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, *set_args(VALUES),
                    check=False)
    return done.returncode, done.stderr + done.stdout


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_a_namespace_that_refuses_the_agent_refuses_the_install(cluster_helm: Helm, chart_plane: ControlPlane,
                                                                level: str) -> None:
    label_namespace(chart_plane, level)
    code, output = install(cluster_helm)
    assert code != 0, output
    (line,) = [x for x in output.splitlines() if x.startswith("Error")]
    assert f'namespace {NAMESPACE} enforces Pod Security "{level}"' in line and line.endswith(RECIPE), output
    # Nothing created: no release, no object of it.
    assert json.loads(cluster_helm.run("list", "--namespace", NAMESPACE, "-o", "json").stdout) == []
    status, secrets = api_request(chart_plane, "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets")
    assert not [s for s in secrets["items"] if s["metadata"]["name"].startswith("sh.helm.release")]
    for name, path in OBJECTS.items():
        assert api_request(chart_plane, "GET", path)[0] == 404, f"{name} created"


def test_a_privileged_namespace_installs(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    label_namespace(chart_plane, "privileged")
    code, output = install(cluster_helm)
    assert code == 0, output
    assert api_request(chart_plane, "GET", OBJECTS["DaemonSet topolet-agent"])[0] == 200
    # Relabelled since: an upgrade is refused too, and the release stays as it was.
    label_namespace(chart_plane, "baseline")
    done = cluster_helm.run("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *set_args(VALUES),
                            check=False)
    assert done.returncode != 0 and done.stderr.rstrip().endswith(RECIPE), done.stderr
    history = json.loads(cluster_helm.run("history", RELEASE, "--namespace", NAMESPACE, "-o", "json").stdout)
    assert [(r["revision"], r["status"]) for r in history] == [(1, "deployed")]
    # No node here for the hook Job (test_uninstall_hook.py): uninstall without it.
    cluster_helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks")


def test_a_release_without_the_agent_installs_anywhere(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    label_namespace(chart_plane, "restricted")
    cluster_helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                     *set_args({**VALUES, "agent.enabled": False}))
    cluster_helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks")


def test_helm_template_sees_no_namespace(helm: Helm) -> None:
    assert [d for d in render(helm, VALUES) if d["kind"] == "DaemonSet"]


def test_both_readmes_give_the_same_recipe() -> None:
    for readme in ("charts/topolet/README.md", "daemonset/README.md"):
        assert RECIPE in (REPO / readme).read_text(), readme

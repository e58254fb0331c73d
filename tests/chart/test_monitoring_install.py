"""The chart's Prometheus Operator objects on a real API server: without the Operator's CRDs an install
that asks for them still succeeds, leaves them out and its notes say so; with the Operator's own CRDs
(tests/chart/operator.py, from its Go module) the API server takes the PodMonitors and the
PrometheusRule as its schema validates them; and an agent-only install keeps no controller rule, so
no TopoletControllerDown fires for ever. The tests run in order, each on the state the one before
left."""

from __future__ import annotations

from typing import Any

from tests.chart.helm import CHART, IMAGE, NAMESPACE, RELEASE, Helm, set_args
from tests.chart.operator import operator_crd
from tests.chart.test_nfd_coexistence import CRD_PATH, wait_established
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import api_request

MONITORING = {**IMAGE, "monitoring.podMonitors.enabled": True, "monitoring.prometheusRule.enabled": True}
OPERATOR = f"/apis/monitoring.coreos.com/v1/namespaces/{NAMESPACE}"


def upgrade(helm: Helm, values: dict[str, Any]) -> str:
    """`helm upgrade --install` with `values`: its output (the notes)."""
    return helm.run("upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--create-namespace", "--timeout", "2m", *set_args(values)).stdout


def test_without_the_operator_its_kinds_are_left_out_and_the_notes_say_so(
        cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    notes = upgrade(cluster_helm, MONITORING)
    assert "NFD is not installed in this cluster: every agent labels its Node" in notes, notes
    assert "NO PodMonitors: this API server does not serve the Prometheus Operator's" in notes, notes
    assert "NO PrometheusRule" in notes, notes
    manifest = cluster_helm.run("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    assert "kind: PodMonitor" not in manifest and "kind: PrometheusRule" not in manifest


def test_with_the_operators_crds_they_are_installed_as_its_schema_takes_them(
        cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    for plural in ("podmonitors", "prometheusrules"):
        status, body = api_request(chart_plane, "POST", CRD_PATH, body=operator_crd(plural))
        assert status == 201, body
        wait_established(chart_plane, f"{plural}.monitoring.coreos.com")
    notes = upgrade(cluster_helm, MONITORING)
    assert "Monitoring: PodMonitors," in notes and "the PrometheusRule," in notes, notes
    for name in ("topolet-agent", "topolet-controller"):
        status, monitor = api_request(chart_plane, "GET", f"{OPERATOR}/podmonitors/{name}")
        assert status == 200, monitor
    status, rule = api_request(chart_plane, "GET", f"{OPERATOR}/prometheusrules/topolet")
    assert status == 200, rule
    assert [g["name"] for g in rule["spec"]["groups"]] == [
        "topolet-agent.records", "topolet-agent.alerts", "topolet-controller"]


def test_agent_only_keeps_no_controller_rule_or_monitor(cluster_helm: Helm,
                                                        chart_plane: ControlPlane) -> None:
    upgrade(cluster_helm, {**MONITORING, "controller.enabled": False})
    status, rule = api_request(chart_plane, "GET", f"{OPERATOR}/prometheusrules/topolet")
    assert status == 200, rule
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == ["topolet-agent.records", "topolet-agent.alerts"]
    assert not [r for g in groups for r in g["rules"] if r.get("alert", "").startswith("TopoletController")]
    assert api_request(chart_plane, "GET", f"{OPERATOR}/podmonitors/topolet-controller")[0] == 404
    assert api_request(chart_plane, "GET", f"{OPERATOR}/podmonitors/topolet-agent")[0] == 200

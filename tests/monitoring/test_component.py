"""daemonset/components/prometheus-operator: what it adds to the base, rendered by `kubectl kustomize`.

It adds PodMonitors that scrape every agent and controller replica under the job names the rules and
dashboards use, and the rules as a PrometheusRule generated from the plain rules file; it leaves every
object of the base as it was, annotations for annotation-based scraping included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.controlplane.kubectl import BASE, build_kubectl, kustomize_build
from tests.monitoring.prometheus_rule import COMPONENT, PROMETHEUS_RULE, RULES, RUNBOOK_PLACEHOLDER, render

NAMESPACE = "topolet-system"
# (workload kind, name, PodMonitor, job, port): the contract of issue 11.
SCRAPED = [("DaemonSet", "topolet-agent", "topolet-agent", "topolet-agent", 9470),
           ("Deployment", "topolet-controller", "topolet-controller", "topolet-controller", 9471)]


def render_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kustomize_build(build_kubectl(), path)) if d]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render_docs(BASE)


@pytest.fixture(scope="module")
def with_component(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The base with the component, as an overlay would include it."""
    overlay = tmp_path_factory.mktemp("overlay")
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, overlay)}]\n"
        f"components: [{os.path.relpath(COMPONENT, overlay)}]\n")
    return render_docs(overlay)


def key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if key(d) == (kind, name)]
    return doc


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels is checked here"
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_adds_the_monitors_and_the_rule_and_changes_nothing_else(
        base: list[dict[str, Any]], with_component: list[dict[str, Any]]) -> None:
    before = {key(d): d for d in base}
    after = {key(d): d for d in with_component}
    assert set(after) - set(before) == {("PodMonitor", "topolet-agent"), ("PodMonitor", "topolet-controller"),
                                        ("PrometheusRule", "topolet")}
    assert set(before) <= set(after)
    assert all(after[k] == doc for k, doc in before.items())
    for k in set(after) - set(before):
        assert after[k]["apiVersion"] == "monitoring.coreos.com/v1"
        assert after[k]["metadata"]["namespace"] == NAMESPACE
        assert after[k]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "topolet"


@pytest.mark.parametrize(("kind", "workload", "monitor", "job", "port"), SCRAPED)
def test_each_pod_monitor_scrapes_its_workloads_port_as_its_job(
        with_component: list[dict[str, Any]], kind: str, workload: str, monitor: str, job: str,
        port: int) -> None:
    spec = one(with_component, "PodMonitor", monitor)["spec"]
    template = one(with_component, kind, workload)["spec"]["template"]
    # It selects this workload's pods and no other's, in the namespace it lives in (a PodMonitor with
    # no namespaceSelector looks in its own).
    pod_labels = {key(d): d["spec"]["template"]["metadata"]["labels"]
                  for d in with_component if "template" in d.get("spec", {})}
    assert [k for k, labels in pod_labels.items() if selects(spec["selector"], labels)] == [(kind, workload)]
    assert "namespaceSelector" not in spec
    (endpoint,) = spec["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"]
             for c in template["spec"]["containers"] for p in c.get("ports", [])}
    assert ports[endpoint["port"]] == port
    assert endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["job"] == {"action": "replace", "targetLabel": "job", "replacement": job}
    assert relabel["node"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]


@pytest.mark.parametrize(("kind", "workload", "port"), [(k, w, p) for k, w, _, _, p in SCRAPED])
def test_the_base_keeps_the_scrape_annotations(with_component: list[dict[str, Any]], kind: str, workload: str,
                                               port: int) -> None:
    annotations = one(with_component, kind, workload)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_prometheus_rule_is_the_plain_rules_file(with_component: list[dict[str, Any]]) -> None:
    assert PROMETHEUS_RULE.read_text() == render(), \
        "prometheusrule.yaml is stale: run .venv/bin/python -m tests.monitoring.prometheus_rule"
    rule = one(with_component, "PrometheusRule", "topolet")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_render_follows_an_edit_of_the_rules_file() -> None:
    """The generated text changes with the source, comments and all (the comparison above can fail)."""
    edited = RULES.read_text().replace("for: 10m", "for: 11m", 1)
    assert edited != RULES.read_text()
    text = render(edited)
    assert text != render()
    assert yaml.safe_load(text)["spec"] == yaml.safe_load(edited)


def test_without_an_overlay_entry_every_runbook_url_is_the_placeholder(
        with_component: list[dict[str, Any]]) -> None:
    """The base's ConfigMap topolet-runbooks defaults to the rules file's placeholder: a host that never
    resolves (.invalid), so no alert links to a guess at where topolet's source is served."""
    groups = one(with_component, "PrometheusRule", "topolet")["spec"]["groups"]
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
    assert urls
    for url in urls:
        assert url == f"{RUNBOOK_PLACEHOLDER}daemonset/README.md#{url.partition('#')[2]}", url
    assert str(urlsplit(RUNBOOK_PLACEHOLDER).hostname).endswith(".invalid")


def test_an_overlay_moves_every_runbook_url_with_one_generator_entry(tmp_path: Path) -> None:
    """The one kustomize setting: an overlay merges its base URL into the base's local ConfigMap
    topolet-runbooks; every alert's runbook_url moves under it, its section anchor kept, and the
    ConfigMap itself is never rendered."""
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, tmp_path)}]\n"
        f"components: [{os.path.relpath(COMPONENT, tmp_path)}]\n"
        "configMapGenerator:\n"
        "  - {name: topolet-runbooks, behavior: merge, literals: [baseURL=https://wiki.example.com/t/]}\n")
    docs = render_docs(tmp_path)
    assert not [d for d in docs if d["metadata"]["name"] == "topolet-runbooks"]
    alerts = [r for g in one(docs, "PrometheusRule", "topolet")["spec"]["groups"] for r in g["rules"]
              if "alert" in r]
    plain = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
             if "alert" in r}
    assert len(alerts) == len(plain) > 0
    for alert in alerts:
        anchor = plain[alert["alert"]]["annotations"]["runbook_url"].partition("#")[2]
        assert alert["annotations"]["runbook_url"] == f"https://wiki.example.com/t/daemonset/README.md#{anchor}"

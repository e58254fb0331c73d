"""daemonset/monitoring/topolet.rules.yaml under Debian's promtool: valid, every alert unit-tested both
ways (tests/monitoring/rules_test.yaml), and every alert documented with a runbook section that exists.

promtool comes with Debian's `prometheus` package (`make deps`); under CI=true a missing one fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import REPO, require
from tests.monitoring.prometheus_rule import COMPONENT, RUNBOOK_PLACEHOLDER

RULES = REPO / "daemonset" / "monitoring" / "topolet.rules.yaml"
RULES_TEST = Path(__file__).resolve().parent / "rules_test.yaml"
README = REPO / "daemonset" / "README.md"
# The scrape jobs of the metric contract (issue 11): every rule reads one of them.
JOBS = ('job="topolet-agent"', 'job="topolet-controller"')


def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "needs promtool (Debian's prometheus package: make deps)")
    assert path is not None
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, check=False)


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def alert_cases() -> list[dict[str, Any]]:
    """Every alert_rule_test entry of rules_test.yaml."""
    return [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
            for case in test.get("alert_rule_test", [])]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_promtool_checks_the_rules_file() -> None:
    done = run_promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = run_promtool("test", "rules", str(RULES_TEST))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_tests_catch_a_loosened_alert(tmp_path: Path) -> None:
    """A drift alert that fires on one repair, or allocation errors that count refusals, fail the tests."""
    for old, new in [("cgroup_drift:increase10m > 2", "cgroup_drift:increase10m > 0"),
                     ('result="error"}[10m]', 'result=~"error|refused"}[10m]')]:
        text = RULES.read_text()
        assert old in text
        copy = tmp_path / "daemonset" / "monitoring" / RULES.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text.replace(old, new))
        tests = tmp_path / "tests" / "monitoring" / RULES_TEST.name
        tests.parent.mkdir(parents=True, exist_ok=True)
        tests.write_text(RULES_TEST.read_text())
        done = run_promtool("test", "rules", str(tests))
        assert done.returncode != 0, f"{new!r} passed the unit tests"


@pytest.mark.parametrize("name", [a["alert"] for a in alerts()])
def test_every_alert_is_tested_firing_and_quiet(name: str) -> None:
    cases = [c for c in alert_cases() if c["alertname"] == name]
    assert any(c["exp_alerts"] for c in cases), f"no case where {name} fires"
    assert any(not c["exp_alerts"] for c in cases), f"no case where {name} stays quiet"


@pytest.mark.parametrize("name", [a["alert"] for a in alerts()])
def test_every_alert_has_a_severity_summary_description_and_runbook(name: str) -> None:
    (alert,) = [a for a in alerts() if a["alert"] == name]
    assert alert["labels"]["severity"] in ("critical", "warning")
    assert set(alert["annotations"]) == {"summary", "description", "runbook_url"}
    assert all(alert["annotations"][k].strip() for k in ("summary", "description"))
    url, _, anchor = alert["annotations"]["runbook_url"].partition("#")
    # Absolute, as Alertmanager's users follow it: the one base, then the README's path in the repository.
    assert url == RUNBOOK_PLACEHOLDER + str(README.relative_to(REPO)), url
    assert anchor == name.lower()
    headings = [line.lstrip("#") for line in README.read_text().splitlines() if line.startswith("### ")]
    assert anchor in {github_anchor(h) for h in headings}, f"no runbook section {name} in {README}"


def test_every_rule_reads_a_contract_job() -> None:
    for rule in rules():
        expr = rule["expr"]
        assert any(job in expr for job in JOBS) or re.match(r"^(instance|job):topolet_", expr.strip()), \
            f"{rule.get('alert') or rule.get('record')} reads no topolet job: {expr}"


def test_the_runbook_base_is_unset_until_the_operator_sets_it() -> None:
    """No default links anywhere real: the rules file and the kustomize base's ConfigMap
    topolet-runbooks share one placeholder that never resolves, and the chart's value is empty (its
    alerts then carry no runbook_url). tests/monitoring/test_component.py and
    tests/chart/test_render.py set it each way."""
    assert str(urlsplit(RUNBOOK_PLACEHOLDER).hostname).endswith(".invalid")
    kustomization = yaml.safe_load((REPO / "daemonset" / "kustomization.yaml").read_text())
    (generator,) = [g for g in kustomization["configMapGenerator"] if g["name"] == "topolet-runbooks"]
    assert generator["literals"] == [f"baseURL={RUNBOOK_PLACEHOLDER}"]
    assert generator["options"]["annotations"] == {"config.kubernetes.io/local-config": "true"}
    values = yaml.safe_load((REPO / "charts" / "topolet" / "values.yaml").read_text())
    assert values["monitoring"]["runbookBaseURL"] == ""
    assert all(r["annotations"]["runbook_url"].startswith(RUNBOOK_PLACEHOLDER) for r in alerts())
    # Every URL these files name is under the placeholder (or the comment's elided https://.../), never
    # a guess at where topolet's source is hosted.
    for path in (RULES, RULES_TEST, REPO / "daemonset" / "kustomization.yaml", *COMPONENT.iterdir()):
        for url in re.findall(r"https?://[^\s\]'\"]+", path.read_text()):
            assert url.startswith((RUNBOOK_PLACEHOLDER, "https://.../")), f"{path}: {url}"

"""The chart's copies of daemonset/ files equal their originals; the chart's versions are the project's."""

from __future__ import annotations

import tomllib

import yaml

from tests.chart.chart_files import CHART, REPO, stale, unlisted

SYNC = "run `.venv/bin/python -m tests.chart.chart_files`"


def test_copies_equal_daemonset_files() -> None:
    assert stale() == [], f"charts/topolet/files/ differs from daemonset/: {SYNC}"


def test_no_stray_copies() -> None:
    assert unlisted() == [], f"files under charts/topolet/files/ that daemonset/ lacks: {SYNC}"


def test_chart_version_is_the_project_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == version

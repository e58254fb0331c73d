"""The PrometheusRule of daemonset/components/prometheus-operator/, generated from the plain rules file.

`render()` is the text of `prometheusrule.yaml`: a header, the object's metadata, and the rules file's
`groups:` indented under `spec:` with its comments, so the two cannot drift apart
(tests/monitoring/test_component.py compares the committed file with it). After editing
daemonset/monitoring/topolet.rules.yaml, regenerate:

    .venv/bin/python -m tests.monitoring.prometheus_rule
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "daemonset" / "monitoring" / "topolet.rules.yaml"
COMPONENT = REPO / "daemonset" / "components" / "prometheus-operator"
PROMETHEUS_RULE = COMPONENT / "prometheusrule.yaml"
# The base of every runbook_url in the rules file, and the kustomize base's default for it (ConfigMap
# topolet-runbooks): a placeholder under .invalid, which never resolves (RFC 2606), until an overlay or a
# sed sets where topolet's source is served. The chart's monitoring.runbookBaseURL defaults to empty.
RUNBOOK_PLACEHOLDER = "https://topolet-runbooks.invalid/"

HEADER = """\
# GENERATED from daemonset/monitoring/topolet.rules.yaml by `python -m tests.monitoring.prometheus_rule`:
# edit that file, then regenerate (tests/monitoring/test_component.py fails while the two differ).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: topolet
  namespace: topolet-system
spec:
"""


def render(rules_text: str | None = None) -> str:
    """The PrometheusRule's text for `rules_text` (default: the rules file as committed)."""
    text = RULES.read_text() if rules_text is None else rules_text
    lines = text.splitlines()
    # The file's own header (comments before `groups:`) describes the plain file; the rules' comments
    # come along.
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "".join(f"  {line}\n" if line else "\n" for line in lines[start:])
    return HEADER + body


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(render())
    print(f"wrote {PROMETHEUS_RULE.relative_to(REPO)}")

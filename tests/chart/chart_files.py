"""The chart's copies of daemonset/ files (charts/topolet/files/), kept byte-equal to their originals.

Helm reads only files inside the chart, and a packaged chart carries no symlinks, so the chart keeps
copies of the manifests, policies, CRDs, rules and dashboards it builds its objects from, under the
same relative paths. daemonset/ is the one source: after editing one of these files there, copy them
again (tests/chart/test_chart_files.py fails while any copy differs):

    .venv/bin/python -m tests.chart.chart_files
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "daemonset"
CHART = REPO / "charts" / "topolet"
COPIES = CHART / "files"

# Every daemonset/ file the chart's templates read (paths relative to daemonset/).
MIRRORED = (
    "agent.yaml",
    "rbac.yaml",
    "admission-policy.yaml",
    "networkpolicy.yaml",
    "crds/noderesourcetopologies.yaml",
    "controller/controller.yaml",
    "controller/rbac.yaml",
    "controller/admission-policy.yaml",
    "controller/fields-policy.yaml",
    "controller/placement-policy.yaml",
    "controller/networkpolicy.yaml",
    "components/kueue/admissioncheck.yaml",
    "components/kueue/rbac.yaml",
    "components/kueue/placement-policy.yaml",
    "components/kueue/failsafe-policy.yaml",
    "components/prometheus-operator/podmonitors.yaml",
    "components/prometheus-operator/prometheusrule.yaml",
    "dashboards/topolet.json",
    "dashboards/topolet-node.json",
    "dashboards/topolet-admission.json",
)


def stale() -> list[str]:
    """The mirrored paths whose chart copy is missing or differs from daemonset/'s file."""
    return [rel for rel in MIRRORED
            if not (COPIES / rel).is_file() or (COPIES / rel).read_bytes() != (BASE / rel).read_bytes()]


def unlisted() -> list[str]:
    """Files under the chart's files/ that no mirrored path accounts for (left over from a rename)."""
    return sorted(str(p.relative_to(COPIES)) for p in COPIES.rglob("*")
                  if p.is_file() and str(p.relative_to(COPIES)) not in MIRRORED)


def sync() -> list[str]:
    """Copy every stale file from daemonset/ into the chart and remove unlisted ones; what changed."""
    changed = stale()
    for rel in changed:
        target = COPIES / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((BASE / rel).read_bytes())
    gone = unlisted()
    for rel in gone:
        (COPIES / rel).unlink()
    return changed + gone


if __name__ == "__main__":
    for rel in sync():
        print(f"charts/topolet/files/{rel}")

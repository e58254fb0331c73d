"""The Prometheus Operator's own CRDs (PodMonitor, PrometheusRule), from its Go module at the version
tests/chart/prometheus-operator/go.mod pins, downloaded through the Go module proxy once and then read
from the module cache. `operator_crd(name)` is one CRD file's object; a module that cannot be had fails
the test under CI=true, else skips it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import require

PINNED = Path(__file__).resolve().parent / "prometheus-operator"
MODULE = "github.com/prometheus-operator/prometheus-operator"
DOWNLOAD_TIMEOUT_S = 300

_dir: Path | str | None = None


def _module_dir() -> Path:
    """The module's folder in the Go module cache (downloaded and checked against go.sum first)."""
    global _dir
    if _dir is None:
        try:
            done = subprocess.run(["go", "mod", "download", "-json", MODULE], cwd=PINNED, capture_output=True,
                                  text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
            info = json.loads(done.stdout or "{}")
            _dir = Path(info["Dir"]) if done.returncode == 0 and "Dir" in info else (
                f"go mod download {MODULE} exited {done.returncode}: {info.get('Error') or done.stderr}")
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            _dir = f"go mod download {MODULE}: {exc}"
    require(isinstance(_dir, Path), f"no Prometheus Operator CRDs: {_dir}")
    assert isinstance(_dir, Path)
    return _dir


def operator_crd(plural: str) -> dict[str, Any]:
    """The Operator's CRD for `plural` (podmonitors, prometheusrules), as its release ships it."""
    path = _module_dir() / "example" / "prometheus-operator-crd" / f"monitoring.coreos.com_{plural}.yaml"
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd

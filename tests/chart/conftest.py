"""Fixtures for the chart's tests: `helm` (no cluster) and `chart_plane` (a control plane of its own).

`chart_plane` is an etcd + kube-apiserver for these tests alone: the chart's cluster-scoped objects
(CRDs, ClusterRoles, admission policies) have the base's names, so a release could not be installed
beside the base that other tests apply to the shared `control_plane`. Under CI=true a control plane or a
helm that cannot be built or started fails the test; otherwise it skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.chart.helm import Helm, build_helm
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import ControlPlane, ControlPlaneError, build_binaries


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm without a cluster (lint, template)."""
    return Helm(build_helm(), tmp_path_factory.mktemp("helm-home"))


@contextmanager
def started_plane(folder: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver in `folder`, stopped afterwards (a failure under CI=true, else a skip)."""
    try:
        import kubernetes  # noqa: F401

        plane = ControlPlane(build_binaries(), folder)
        plane.start()
    except (ImportError, ControlPlaneError) as exc:
        reason = f"no control plane: {exc}"
        if IN_CI:
            pytest.fail(f"control plane required under CI: {reason}")
        pytest.skip(reason)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def chart_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own."""
    with started_plane(tmp_path_factory.mktemp("chart-plane")) as plane:
        yield plane


@pytest.fixture(scope="module")
def cluster_helm(helm: Helm, chart_plane: ControlPlane) -> Helm:
    """helm with the chart plane's admin kubeconfig."""
    return Helm(helm.binary, helm.home, Path(chart_plane.kubeconfig))

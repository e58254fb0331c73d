"""The admission tests' shared fixtures: an API client and a fresh namespace on the test cluster
(defined once in tests/controlplane/fixtures.py)."""

from __future__ import annotations

from tests.controlplane.fixtures import api, cluster, cluster_session, namespace

__all__ = ["api", "cluster", "cluster_session", "namespace"]

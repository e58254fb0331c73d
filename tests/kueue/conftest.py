"""The Kueue tests' fixtures: real Kueue on a test cluster of its own (tests/controlplane/fixtures.py)."""

from __future__ import annotations

from tests.controlplane.fixtures import kueue, kueue_session

__all__ = ["kueue", "kueue_session"]

"""A pod's Kubernetes QoS class, as the API and the kubelet's cgroup names spell it.

Public API: `QOSClass` (`GUARANTEED`, `BURSTABLE`, `BESTEFFORT`; reads the API's "BestEffort" too).
"""

from __future__ import annotations

from enum import StrEnum


class QOSClass(StrEnum):
    """A pod's Kubernetes QoS class (`status.qosClass`, lower-cased)."""

    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"

    @classmethod
    def _missing_(cls, value: object) -> QOSClass | None:
        # The API spells them "Guaranteed", "Burstable", "BestEffort".
        if isinstance(value, str) and value.lower() != value:
            return cls(value.lower())
        return None

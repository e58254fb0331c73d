"""Typed errors raised at topolet's boundaries; the CLI turns each into one line and a non-zero exit."""

from __future__ import annotations


class TopoletError(Exception):
    """Base of every error topolet raises on purpose."""


class TopologyError(TopoletError):
    """Hardware discovery failed or the input tree is malformed.

    `path` names the file or folder that was wrong, when there is one.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{message}: {path}" if path else message)
        self.path = path


class CPUListError(TopoletError, ValueError):
    """A cpulist or cpumask string could not be parsed."""


class AllocationError(TopoletError):
    """A CPU or device request cannot be satisfied under its constraints."""


class EnforcementError(TopoletError):
    """Writing a cgroup, affinity or memory policy failed; `path` names what was written."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{message}: {path}" if path else message)
        self.path = path


class StateError(TopoletError):
    """The state file is corrupt, from an unknown version, or cannot be written."""


class ConfigError(TopoletError):
    """Configuration or a command-line value is invalid."""


class KubeAPIError(TopoletError):
    """A Kubernetes API call failed; `status` is the HTTP status, None when the server was not reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404

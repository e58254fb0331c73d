"""`--enforcement off`: a pinning engine that decides and records allocations but writes no cgroup.

`RecordingEngine` is a `PinningEngine` with its cgroup side off: the same allocator, state file,
lock and reserved CPUs, so it records exactly what an enforcing agent would pin, and publishes the
same NRT and labels.  It reads no cpuset hierarchy (every CPU and memory node is allowed), so an
agent can run on another machine's hardware dump (`--fsroot`).  Its layout names a cgroup root that
does not exist: no cgroup is found or written, and a missing or corrupt state file rebuilds empty.
"""

from __future__ import annotations

import os

from agent.enforce import CgroupLayout
from agent.enforce.state import State
from agent.enforce.state_file import StateFile
from agent.errors import EnforcementError
from agent.gpu.model import GPU
from agent.pinning.engine import PinningEngine, ReconcileResult
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology

# A root no cgroup hierarchy is mounted at: `exists()` is False for every cgroup under it.
NO_CGROUP_ROOT = "/nonexistent/topolet-enforcement-off"


class RecordingEngine(PinningEngine):
    """Allocations chosen and recorded in the state file; no cgroup read or written."""

    def __init__(self, topology: Topology, state_file: StateFile, reserved: CPUSet = EMPTY,
                 gpus: tuple[GPU, ...] = ()) -> None:
        # The parent's constructor reads the root cpuset; here the topology alone says what is allowed.
        self.topology = topology
        self.gpus = gpus
        self.layout = CgroupLayout(2, NO_CGROUP_ROOT)
        if os.path.exists(NO_CGROUP_ROOT):  # someone made it: refuse rather than write there
            raise EnforcementError("exists; --enforcement off relies on its absence", NO_CGROUP_ROOT)
        self.state_file = state_file
        self.reserved = reserved & topology.cpus
        self.proc = "/proc"
        self.allowed = topology.cpus
        self.all_mems = CPUSet(n.id for n in topology.numa_nodes)
        self.extra_shared = frozenset()
        # The parent's bookkeeping of rebuilt states: an agent writes a rebuild at once.
        self.defer_rebuild = False
        self._unsaved = False

    def _ensure_parents(self) -> list[str]:
        """No topolet cgroups to make."""
        return []

    def _apply(self, state: State, remove: tuple[str, ...] = (), shared: tuple[str, ...] = ()) -> None:
        """Nothing to write: the state file is the whole record."""

    def join_pool(self, rel: str) -> bool:
        """A shared container needs no write; False (nothing written)."""
        return False

    def reconcile(self) -> ReconcileResult:
        """Release dead non-pod allocations (pods are released by the pod watch); no drift to repair."""
        with self.locked() as state:
            _, released, collected = self._reap(state)
            return ReconcileResult(released, collected, 0)

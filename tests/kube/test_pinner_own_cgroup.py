"""The agent's own container stays off the pool set where the kernel keeps its cpuset from it.

Found live in tests/vm's cgroup v2 guest: containerd gives the DaemonSet's pod a private cgroup
namespace on v2, and with the hierarchy mounted nsdelegate (as systemd mounts it) the kernel refuses
the agent every write to its own container's cgroup, so each pass that shrank the pool failed there
and /healthz went stale until the kubelet's liveness probe killed the agent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent.enforce.cgroup import CgroupLayout, at_own_namespace_root
from tests.kube.test_pinner_metrics import made


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0::/\n", True),  # v2, a private cgroup namespace (or the real root)
        ("0::/kubepods/burstable/pod1/abc\n", False),  # v2, the host's namespace
        ("12:cpuset:/kubepods/pod1/abc\n0::/\n", True),
        ("12:cpuset:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\n", False),
    ],
)
def test_at_own_namespace_root(tmp_path: Path, text: str, expected: bool) -> None:
    path = tmp_path / "cgroup"
    path.write_text(text)
    assert at_own_namespace_root(str(path)) is expected
    assert at_own_namespace_root(str(tmp_path / "missing")) is False


def _cgroups(root: Path, procs: dict[str, str]) -> CgroupLayout:
    for rel, text in procs.items():
        (root / rel).mkdir(parents=True)
        (root / rel / "cgroup.procs").write_text(text)
    return CgroupLayout(2, str(root))


@pytest.mark.parametrize("at_root", [True, False])
def test_own_container_leaves_the_pool_set_only_at_its_namespace_root(dump_root: Any, tmp_path: Path,
                                                                      at_root: bool) -> None:
    p, _ = made(dump_root, tmp_path)
    # Other containers' processes read as 0 from inside a pid namespace; ours as our own pid.
    p.engine.layout = _cgroups(tmp_path / "cg", {"kubepods/pod-a/c1": "0\n0\n",
                                                 "kubepods/pod-b/agent": f"{os.getpid()}\n"})
    p._at_namespace_root = at_root
    p.shared = {("a", "c1"): "kubepods/pod-a/c1", ("b", "agent"): "kubepods/pod-b/agent"}
    p._set_shared()
    if at_root:
        assert p.engine.extra_shared == frozenset({"kubepods/pod-a/c1"})
    else:
        assert p.engine.extra_shared == frozenset(p.shared.values())

    # A new pool container is added; the agent's own stays out (found once, remembered).
    (tmp_path / "cg" / "kubepods/pod-b/agent/cgroup.procs").write_text("")
    p.shared[("c", "c3")] = "kubepods/pod-c/c3"
    p._set_shared()
    expected = {"kubepods/pod-a/c1", "kubepods/pod-c/c3"} | (set() if at_root else {"kubepods/pod-b/agent"})
    assert p.engine.extra_shared == frozenset(expected)

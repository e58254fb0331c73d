"""`KubeAgent(config, topology, ...)` wires what the composition root found: it reads nothing.

Its config names paths that do not exist (hardware root, state folder, cgroup root, sockets,
kubeconfig), its API client answers nothing, and while it is constructed an audit hook and stand-ins
for `os.stat`/`os.access` record every file, socket and process the process touches: none.  The
start-up reads are `agent.cli.compose.kube_agent`'s (run against the real API server by the agent
tests in this folder).  No root, no cluster.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.cli import build_parser
from agent.cli.compose import agent_config
from agent.enforce.state_file import StateFile
from agent.kube.daemon import KUBELET_STATIC, Enforcement, KubeAgent
from agent.kube.kubelet.resources import Kubelet
from agent.kube.pods.node_cgroups import NodeCgroups
from agent.kubeapi.client import KubeClient
from agent.metrics.registry import Metrics
from agent.pinning.recording import RecordingEngine
from agent.topology.cpuset import CPUSet
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL

MISSING = "/nonexistent/topolet-wiring"
ARGS = ["agent", "--mode", "kubernetes", "--node-name", "worker-1", "--kubeconfig", f"{MISSING}/kubeconfig",
        "--fsroot", f"{MISSING}/root", "--state-dir", f"{MISSING}/state",
        "--features-dir", f"{MISSING}/features.d", "--cgroup-root", f"{MISSING}/cgroup",
        "--pod-resources-socket", f"{MISSING}/kubelet.sock", "--nri-socket", f"{MISSING}/nri.sock",
        "--runtime-bundles", f"{MISSING}/bundles", "--mig-config", "all-1g.10gb", "--reserved-cpus", "0"]

# Audit events (sys.addaudithook) that reach outside the process's memory.
TOUCHING = ("open", "os.", "socket.", "subprocess.", "shutil.", "glob.", "fcntl.", "mmap.")
IMPORTS = (".py", ".pyc", ".so")  # a module loaded on first use is no read of the node


class NoAPI:
    """An API client that answers nothing: any use of it is a request the constructor made."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API client was used: {name}")


_armed: list[list[str]] = []  # the recording under way, if any (an audit hook cannot be removed)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _armed or not event.startswith(TOUCHING):
        return
    if event == "open" and str(args[0]).endswith(IMPORTS):
        return
    _armed[-1].append(f"{event} {args[:2]!r}")


sys.addaudithook(_hook)


@pytest.fixture
def touched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[str]]]:
    """Records what is touched from now on (files opened or listed, sockets, processes, and the
    stats and access checks the audit hook does not see) until the test ends."""
    seen: list[str] = []

    def recording(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.append(f"os.{name} {args[:1]!r}")
            return real(*args, **kwargs)
        return call

    for name in ("stat", "lstat", "access"):
        monkeypatch.setattr(os, name, recording(name, getattr(os, name)))
    _armed.append(seen)
    try:
        yield lambda: list(seen)
    finally:
        _armed.pop()


@pytest.mark.parametrize("mode", ["on", "off", KUBELET_STATIC])
def test_constructing_the_agent_touches_nothing(mode: str, touched: Callable[[], list[str]]) -> None:
    config = agent_config(build_parser().parse_args(ARGS))
    state_file = StateFile(config.state_dir)
    kubelet = Kubelet(config.pod_resources_socket, ())
    if mode == KUBELET_STATIC:
        kubelet.static_cpus = CPUSet([1, 2, 3])  # as its CPU-manager answer would have set it
    # The engine is the composition root's (a PinningEngine reads the cpuset root as it is made).
    engine = RecordingEngine(TWO_SOCKETS_AND_CXL, state_file, CPUSet.parse("0"))
    enforcement = Enforcement(engine, mode, NodeCgroups(None, False), "/kubepods" if mode == "on" else "")
    metrics = Metrics()
    before = touched()
    agent = KubeAgent(config, TWO_SOCKETS_AND_CXL, metrics, api=KubeClient(NoAPI()), node="worker-1",
                      namespace="topolet-system", gpus=(), kubelet=kubelet,
                      enforcement=enforcement, nvml=object())
    assert touched() == before, "the constructor touched the node"
    assert agent.enforce == (mode == "on") and agent.enforcement == mode
    assert agent.topology is TWO_SOCKETS_AND_CXL and agent.state_file is state_file
    assert agent.mig is not None and agent.route_name is None  # MIG asked; the route chosen in run()
    assert agent.publisher.config is config.publisher and agent.pinner.numa_scope == config.numa_scope
    assert metrics.registry.get_sample_value("topolet_info", {
        "enforcement": mode, "nodename": "worker-1", "mode": "kubernetes",
        "version": _version()}) == 1.0
    for path in (config.fsroot, config.state_dir, config.cgroup_root or "", config.pod_resources_socket):
        assert not os.path.exists(path)


def test_the_recording_sees_a_read(touched: Callable[[], list[str]], tmp_path: Any) -> None:
    """The check is not vacuous: a file read, a stat and a listing under it are recorded."""
    (tmp_path / "f").write_text("x")
    before = len(touched())
    (tmp_path / "f").read_text()
    os.path.exists(tmp_path / "g")
    os.listdir(tmp_path)
    seen = touched()[before:]
    assert any(s.startswith("open ") for s in seen), seen
    assert any(s.startswith("os.stat ") for s in seen), seen
    assert any(s.startswith("os.listdir ") for s in seen), seen


def _version() -> str:
    from agent import __version__

    return __version__

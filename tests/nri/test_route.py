"""Route selection (agent.kube.pods.route): auto takes NRI only when the socket exists and registration
answers; nri insists and connects once the runtime appears; pod-cgroup and --enforcement off never
connect.  Against NRI's own runtime side (main.go -script) where a runtime answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.kube.pods.route import DEFAULT_NRI_SOCKET, NRI, POD_CGROUP, PinningRoute
from agent.nri.plugin import Handler
from tests.conftest import REPO
from tests.nri.agent_parts import connected
from tests.nri.goruntime import ScriptedRuntime


@pytest.mark.parametrize(("asked", "enforce", "why"), [
    ("auto", True, "no NRI socket at"),
    ("pod-cgroup", True, "--route pod-cgroup"),
    ("nri", False, "--enforcement off"),
])
def test_routes_that_never_connect(short_tmp: Path, asked: str, enforce: bool, why: str) -> None:
    route = PinningRoute(asked, str(short_tmp / "nri.sock"), Handler, enforce=enforce)
    assert route.start() == POD_CGROUP
    assert why in route.reason and route.connections == 0
    route.stop()


def test_auto_falls_back_when_the_socket_does_not_answer(short_tmp: Path) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(short_tmp / "nri.sock"))
    silent.listen(1)
    try:
        route = PinningRoute("auto", str(short_tmp / "nri.sock"), Handler, register_seconds=0.5)
        assert route.start() == POD_CGROUP
        assert "did not answer" in route.reason and "no registration within 0.5 s" in route.reason
        route.stop()
    finally:
        silent.close()


def test_auto_takes_nri_when_registration_answers(runtime_binary: str, short_tmp: Path) -> None:
    runtime = ScriptedRuntime(runtime_binary, short_tmp / "nri.sock")
    try:
        runtime.wait_listening()
        route = PinningRoute("auto", str(runtime.socket), Handler)
        assert route.start() == NRI
        assert route.connections == 1 and "registered as an NRI plugin" in route.reason
        runtime.wait_event("Synchronize")
        route.stop()
    finally:
        runtime.close()


def test_nri_insists_until_the_runtime_appears(runtime_binary: str, short_tmp: Path) -> None:
    route = PinningRoute("nri", str(short_tmp / "nri.sock"), Handler, register_seconds=2.0)
    assert route.start() == NRI and "connecting again" in route.reason
    runtime = ScriptedRuntime(runtime_binary, short_tmp / "nri.sock")
    try:
        runtime.wait_listening()
        runtime.wait_event("Synchronize", timeout=30)  # the route's back-off brought it
        assert connected(route, 1)
    finally:
        stopper = threading.Thread(target=route.stop)
        stopper.start()
        stopper.join(15)
        assert not stopper.is_alive(), "the route did not stop"
        runtime.close()


def test_the_agent_loads_no_nri_code_until_the_route_tries_nri() -> None:
    """NRI's messages (protobuf) cost memory on every node: the agent imports them only for NRI."""
    from agent.nri.plugin import DEFAULT_SOCKET

    assert DEFAULT_NRI_SOCKET == DEFAULT_SOCKET
    code = "import sys, agent.kube.daemon; print(sorted(m for m in sys.modules if m.startswith('agent.nri')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]"

"""The NRI route on a real node: kubelet v1.37.2, containerd v2.4.2 with NRI on, runc, and a plugin built
from `agent.nri.plugin` that answers every CreateContainer with one fixed CPU (the node's last).

No agent runs here and nothing pins after the start: what each test checks is what the container's
first process read of itself before anything else (its `/proc/self/status`, read with shell builtins,
then `nproc`), as the container's log on the node holds it.  The plugin runs as a process of its own
(this module run as `python -m`), so "killed" is a SIGKILL.

- With the plugin connected, the first instruction runs on the plugin's CPU (and in a cgroup of it).
- Plugin killed, default config: the next container is created unadjusted, on the whole node; the
  plugin restarted is synchronized with what runs and adjusts the next one again.
- With the plugin in `required_plugins` (NRI's default validator): while it is gone, a container is
  refused (CreateContainerError, the sandbox still made) unless its pod tolerates missing plugins; the
  kubelet retries, and once the plugin is back the container is created adjusted.

Needs what tests/realnode needs, plus containerd 2.4.2 (`tests/controlplane/build.sh containerd
containerd-shim-runc-v2`) and two CPUs: a skip on a laptop, a failure under CI=true.  Prints what
the first instructions read and the refusal → running time; asserts nothing on timing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent.nri import api_pb2
from agent.nri.plugin import Handler, Plugin, cpuset_adjustment, event_mask
from tests.conftest import REPO, require
from tests.controlplane.cluster import Cluster
from tests.controlplane.harness import _Process
from tests.realnode.conftest import pods_deleted_after, running_node
from tests.realnode.containerd import CONTAINERD_2_4, TOLERATE_MISSING_PLUGINS
from tests.realnode.node import RealNode, RealNodeParts, container_id, cpuset_of, guaranteed_pod, wait

NS = "default"
PLUGIN_NAME = "topolet-test"
PLUGIN_INDEX = "10"
# The container's first process reads its own status with builtins only (no exec before it).
FIRST_INSTRUCTIONS = ('while read -r k v; do case $k in Cpus_allowed_list:|Mems_allowed_list:) '
                      'echo "$k $v";; esac; done < /proc/self/status; echo "nproc: $(/bin/busybox nproc)"; '
                      'exec /bin/sleep 2147483647')
# Guaranteed (requests = limits), small enough for three pods on a 2-CPU node: the plugin, not the
# request, decides the cpuset here.
POD_CPU = "250m"
# The kubelet retries a refused container on its back-off (10 s, doubling): generous.
RETRY_TIMEOUT_S = 180.0


# ---- the plugin (its own process: `python -m tests.realnode.test_nri_route SOCKET CPUS`) ---------

class FixedCpuset(Handler):
    """Every new container gets `cpus`; what it sees is printed for the test to read."""

    def __init__(self, cpus: str) -> None:
        self.cpus = cpus

    def configure(self, request: api_pb2.ConfigureRequest) -> int:
        print(f"configured by {request.runtime_name} {request.runtime_version}", flush=True)
        return event_mask(api_pb2.CREATE_CONTAINER)

    def synchronize(self, pods: Sequence[api_pb2.PodSandbox],
                    containers: Sequence[api_pb2.Container]) -> Sequence[api_pb2.ContainerUpdate]:
        print(f"synchronized {len(pods)} pods {len(containers)} containers", flush=True)
        return ()

    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
    ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
        print(f"create {pod.namespace}/{pod.name}/{container.name}: cpus {self.cpus}", flush=True)
        return cpuset_adjustment(self.cpus), ()


def serve(socket_path: str, cpus: str) -> None:
    Plugin.connect(socket_path, FixedCpuset(cpus), PLUGIN_NAME, PLUGIN_INDEX).run()
    print("the runtime closed the connection", flush=True)


class PluginProcess:
    """The plugin as a process on `node`'s NRI socket; start() and kill() wait for containerd to see it."""

    def __init__(self, node: RealNode, cpus: str) -> None:
        self.node = node
        self.cpus = cpus
        self.log = node.dir / "nri-plugin.log"
        self.proc: _Process | None = None

    def _containerd_says(self, text: str) -> int:
        """How many lines of containerd's log name this plugin and say `text`."""
        log = (self.node.dir / "containerd.log").read_text(errors="replace")
        return sum(1 for line in log.splitlines() if f"{PLUGIN_INDEX}-{PLUGIN_NAME}" in line and text in line)

    def start(self) -> None:
        before = self._containerd_says("connected and synchronized")
        self.proc = _Process("nri-plugin", [sys.executable, "-m", "tests.realnode.test_nri_route",
                                            str(self.node.nri_socket), self.cpus],
                             self.log, env={"PYTHONPATH": str(REPO)})
        self.node._wait(lambda: self._containerd_says("connected and synchronized") > before,
                        "containerd to take the NRI plugin", self.proc, timeout=60)

    def kill(self) -> None:
        """SIGKILL the plugin and wait until containerd has seen its connection close."""
        assert self.proc is not None
        before = self._containerd_says("connection to plugin")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.popen.pid, signal.SIGKILL)
        self.proc.popen.wait()
        self.proc = None
        self.node._wait(lambda: self._containerd_says("connection to plugin") > before,
                        "containerd to see the plugin's connection closed", self.node.containerd, timeout=60)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# ---- fixtures -------------------------------------------------------------------------------------

def nri_node(cluster: Cluster, parts: RealNodeParts, required: tuple[str, ...] = ()) -> Iterator[RealNode]:
    require(parts.containerd2 is not None, "no containerd 2.4.2 among the real node's parts")
    yield from running_node(cluster, parts, runtime=CONTAINERD_2_4, nri_required_plugins=required)


@pytest.fixture(scope="class")
def default_node(realnode_cluster: Cluster, realnode_parts: RealNodeParts) -> Iterator[RealNode]:
    """A real node on containerd 2.4.2 with NRI on, its default settings (no plugin required)."""
    yield from nri_node(realnode_cluster, realnode_parts)


@pytest.fixture(scope="class")
def required_node(realnode_cluster: Cluster, realnode_parts: RealNodeParts) -> Iterator[RealNode]:
    """A real node on containerd 2.4.2 whose NRI default validator requires the test's plugin."""
    yield from nri_node(realnode_cluster, realnode_parts, (PLUGIN_NAME,))


def node_cpus(node: RealNode) -> list[int]:
    from agent.topology.cpuset import CPUSet

    return sorted(CPUSet.parse((node.cpuset_root / "cpuset.cpus").read_text().strip()))


def started_plugin(node: RealNode) -> Iterator[PluginProcess]:
    cpus = node_cpus(node)
    require(len(cpus) >= 2, "needs two CPUs to tell the plugin's cpuset from the whole node's")
    plugin = PluginProcess(node, str(cpus[-1]))
    plugin.start()
    try:
        yield plugin
    finally:
        print(f"--- NRI plugin ---\n{plugin.output()[-3000:]}")
        plugin.stop()


@pytest.fixture
def default_plugin(default_node: RealNode) -> Iterator[PluginProcess]:
    yield from started_plugin(default_node)


@pytest.fixture
def required_plugin(required_node: RealNode) -> Iterator[PluginProcess]:
    yield from started_plugin(required_node)


@pytest.fixture
def default_pods(default_node: RealNode) -> Iterator[list[str]]:
    yield from pods_deleted_after(default_node)


@pytest.fixture
def required_pods(required_node: RealNode) -> Iterator[list[str]]:
    yield from pods_deleted_after(required_node)


# ---- pods -----------------------------------------------------------------------------------------

def create_pod(node: RealNode, pods: list[str], name: str, annotations: dict[str, str] | None = None) -> None:
    """A Guaranteed pod on `node` whose container starts with FIRST_INSTRUCTIONS."""
    pod = guaranteed_pod(name, node.name, cpu=POD_CPU, annotations=annotations)
    pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", FIRST_INSTRUCTIONS]
    pods.append(name)
    with node.api() as api:
        api.create(f"/api/v1/namespaces/{NS}/pods", pod)


def get_pod(node: RealNode, name: str) -> dict[str, Any]:
    with node.api() as api:
        return dict(api.get(f"/api/v1/namespaces/{NS}/pods/{name}"))


def running(node: RealNode, name: str, timeout: float = 90.0) -> dict[str, Any]:
    """The pod once its container runs."""
    return dict(wait(lambda: (p := get_pod(node, name)) and container_id(p) and p, f"pod {name} running",
                     timeout))


def first_read(node: RealNode, pod: dict[str, Any]) -> dict[str, str]:
    """What the container's first instructions printed, from its log on the node (CRI log format:
    `<time> <stream> <tag> <line>`): Cpus_allowed_list, Mems_allowed_list and nproc."""
    folder = node.dir / "pod-logs" / f"{NS}_{pod['metadata']['name']}_{pod['metadata']['uid']}" / "c"

    def printed() -> dict[str, str] | None:
        lines = [line.split(" ", 3)[3] for f in sorted(folder.glob("*.log"))
                 for line in f.read_text(errors="replace").splitlines() if line.count(" ") >= 3]
        got = dict(line.split(": ", 1) for line in lines if ": " in line)
        return got if "nproc" in got else None

    return dict(wait(printed, f"the first lines of {pod['metadata']['name']} in {folder}"))


def refusal(node: RealNode, name: str) -> str | None:
    """The kubelet's reason and message for a container the runtime refused to create, if so."""
    for cs in (get_pod(node, name).get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerError":
            return f"{waiting['reason']}: {waiting.get('message', '')}"
    return None


def assert_pinned(node: RealNode, pod: dict[str, Any], cpus: str) -> dict[str, str]:
    """The first instructions ran on `cpus` alone, in a cgroup runc gave exactly those CPUs."""
    seen = first_read(node, pod)
    assert (seen["Cpus_allowed_list"], seen["nproc"]) == (cpus, "1"), seen
    pid = wait(lambda: node.task_pids().get(str(container_id(pod))), "the container's task")
    assert cpuset_of(int(pid))[1] == cpus
    return seen


def assert_whole_node(node: RealNode, pod: dict[str, Any]) -> dict[str, str]:
    seen = first_read(node, pod)
    cpus = node_cpus(node)
    assert (seen["Cpus_allowed_list"], seen["nproc"]) == (f"{cpus[0]}-{cpus[-1]}", str(len(cpus))), seen
    return seen


def shown(seen: dict[str, str]) -> str:
    return f"Cpus_allowed_list {seen['Cpus_allowed_list']}, Mems_allowed_list {seen['Mems_allowed_list']}, " \
           f"nproc {seen['nproc']}"


# ---- tests ----------------------------------------------------------------------------------------

class TestDefaultSettings:
    def test_first_instruction_runs_on_the_plugins_cpus(self, default_node: RealNode,
                                                        default_plugin: PluginProcess,
                                                        default_pods: list[str]) -> None:
        create_pod(default_node, default_pods, "nri-pinned")
        pod = running(default_node, "nri-pinned")
        seen = assert_pinned(default_node, pod, default_plugin.cpus)
        assert f"create {NS}/nri-pinned/c: cpus {default_plugin.cpus}" in default_plugin.output()
        print(f"\nfirst instruction, plugin connected: {shown(seen)}")

    def test_killed_plugin_leaves_the_next_container_unadjusted(self, default_node: RealNode,
                                                                default_plugin: PluginProcess,
                                                                default_pods: list[str]) -> None:
        create_pod(default_node, default_pods, "nri-before")
        assert_pinned(default_node, running(default_node, "nri-before"), default_plugin.cpus)

        default_plugin.kill()
        create_pod(default_node, default_pods, "nri-unadjusted")
        seen = assert_whole_node(default_node, running(default_node, "nri-unadjusted"))
        print(f"\nfirst instruction, plugin killed: {shown(seen)}")

        # Back: synchronized with what runs (both pods' containers), it adjusts the next one again.
        default_plugin.start()
        synced = re.findall(r"synchronized (\d+) pods (\d+) containers", default_plugin.output())
        assert int(synced[-1][1]) >= 2, default_plugin.output()
        create_pod(default_node, default_pods, "nri-after")
        seen = assert_pinned(default_node, running(default_node, "nri-after"), default_plugin.cpus)
        print(f"first instruction, plugin back: {shown(seen)}")


class TestRequiredPlugin:
    def test_container_waits_for_the_required_plugin(self, required_node: RealNode,
                                                     required_plugin: PluginProcess,
                                                     required_pods: list[str]) -> None:
        required_plugin.kill()
        create_pod(required_node, required_pods, "nri-refused")
        create_pod(required_node, required_pods, "nri-tolerant", {TOLERATE_MISSING_PLUGINS: "true"})
        why = wait(lambda: refusal(required_node, "nri-refused"), "the container refused", timeout=90)
        assert f'required plugin "{PLUGIN_NAME}" not present' in why, why
        refused_at = time.monotonic()
        # The sandbox was made (CNI gave it an address); only the container waits.
        assert get_pod(required_node, "nri-refused")["status"].get("podIP")
        # A pod that tolerates missing plugins runs meanwhile, unadjusted.
        assert_whole_node(required_node, running(required_node, "nri-tolerant"))
        assert container_id(get_pod(required_node, "nri-refused")) is None

        required_plugin.start()
        back_at = time.monotonic()
        pod = running(required_node, "nri-refused", timeout=RETRY_TIMEOUT_S)
        created_at = time.monotonic()
        seen = assert_pinned(required_node, pod, required_plugin.cpus)
        print(f"\nrequired plugin missing: {why}\n"
              f"plugin back {back_at - refused_at:.1f} s after the refusal was seen; container running "
              f"{created_at - back_at:.1f} s later (the kubelet's back-off)\n"
              f"first instruction, plugin back: {shown(seen)}")


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])

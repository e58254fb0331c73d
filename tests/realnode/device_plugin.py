"""A stand-in device plugin for the real node: one extended resource whose devices sit on given NUMA
nodes, served over the kubelet's device plugin API (v1beta1, `tests/realnode/deviceplugin/`).

Tests run it in a process of its own (`PluginProcess`, `python -m tests.realnode.device_plugin`): a
test process whose gRPC threads run while it starts the node's daemons with a `preexec_fn` can crash
in the forked child (gRPC's fork handlers), so no gRPC runs in the test process itself.

`StandInDevicePlugin(folder, resource, devices)` serves `DevicePlugin` on `<folder>/<name>.sock`
(`folder`: the kubelet's device-plugins folder, `RealNode.device_plugins_dir`) and registers it with
the kubelet's `Registration` service on `<folder>/kubelet.sock`.  `devices` maps each device id to
its NUMA node.  The kubelet then lists the devices (`ListAndWatch`, one answer held open), advertises
the resource on the Node, chooses devices for containers itself (its device manager, with its
Topology Manager's hints) and asks the plugin to `Allocate` them; the stand-in records each
allocation (`allocated`) and hands the container an environment variable naming its devices.  Only
the device plugin is a stand-in: the kubelet, its device manager and its Topology Manager are real.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tests.realnode.deviceplugin import api_pb2, api_pb2_grpc

API_VERSION = "v1beta1"
REGISTER_TIMEOUT_S = 30.0


class _Servicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: StandInDevicePlugin) -> None:
        self.p = plugin

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's name
        return api_pb2.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        yield api_pb2.ListAndWatchResponse(devices=[
            api_pb2.Device(ID=device_id, health="Healthy",
                           topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]))
            for device_id, numa in sorted(self.p.devices.items())])
        # The devices never change: hold the stream open until the plugin stops or the kubelet leaves.
        while not self.p.stopping.wait(0.5):
            if not context.is_active():
                return

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        answers = []
        for c in request.container_requests:
            ids = tuple(c.devices_ids)
            with self.p.lock:
                self.p.allocated.append(ids)
                if self.p.record is not None:
                    with self.p.record.open("a") as f:
                        f.write(" ".join(ids) + "\n")
            answers.append(api_pb2.ContainerAllocateResponse(envs={self.p.env: ",".join(ids)}))
        return api_pb2.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class StandInDevicePlugin:
    """One resource's device plugin, registered with a real kubelet (see the module docstring)."""

    def __init__(self, folder: Path, resource: str, devices: Mapping[str, int]) -> None:
        self.folder = folder
        self.resource = resource
        self.devices = dict(devices)
        self.endpoint = resource.rpartition("/")[2] + ".sock"
        self.env = "STANDIN_" + resource.rpartition("/")[2].upper() + "_DEVICES"
        self.allocated: list[tuple[str, ...]] = []
        self.record: Path | None = None  # a file each allocation is appended to, one line each
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._server: Any = None

    @property
    def path(self) -> Path:
        return self.folder / self.endpoint

    def start(self) -> StandInDevicePlugin:
        """Serve on the plugin's socket, then register with the kubelet."""
        self.path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix://{self.folder / 'kubelet.sock'}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(version=API_VERSION, endpoint=self.endpoint,
                                        resource_name=self.resource,
                                        options=api_pb2.DevicePluginOptions()),
                timeout=REGISTER_TIMEOUT_S, wait_for_ready=True)
        return self

    def stop(self) -> None:
        """Stop serving (the kubelet sees the socket go and marks the devices unhealthy)."""
        self.stopping.set()
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
            self._server = None
        self.path.unlink(missing_ok=True)


class PluginProcess:
    """A `StandInDevicePlugin` in a process of its own: `start()` returns once it is registered."""

    def __init__(self, folder: Path, resource: str, devices: Mapping[str, int], workdir: Path) -> None:
        self.argv = [sys.executable, "-m", __name__, str(folder), resource,
                     str(workdir / (resource.rpartition("/")[2] + ".allocations")),
                     *(f"{i}={numa}" for i, numa in sorted(devices.items()))]
        self.record = Path(self.argv[5])
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> PluginProcess:
        from tests.conftest import REPO

        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                     stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "registered", or "" when it died
        if line.strip() != "registered":
            self.stop()
            raise RuntimeError(f"device plugin {self.argv[4]} did not register: {line!r}")
        return self

    def allocated(self) -> list[tuple[str, ...]]:
        """The device ids of each Allocate the kubelet sent it."""
        if not self.record.exists():
            return []
        return [tuple(line.split()) for line in self.record.read_text().splitlines() if line]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def main(argv: list[str]) -> int:
    """Serve one resource: FOLDER RESOURCE ALLOCATIONS_FILE ID=NUMA...; "registered" once registered,
    then serve until SIGTERM."""
    folder, resource, record, *pairs = argv
    devices = {i: int(numa) for i, _, numa in (p.partition("=") for p in pairs)}
    plugin = StandInDevicePlugin(Path(folder), resource, devices)
    plugin.record = Path(record)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    plugin.start()
    print("registered", flush=True)
    done.wait()
    plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

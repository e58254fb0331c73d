"""End to end against NRI's own runtime side (pkg/adaptation v0.12.3 with ttrpc v1.2.9, as containerd
v2.4.2 embeds them): registration, Configure, a Synchronize split over several requests, CreateContainer
answered with a cpuset adjustment big enough to span many multiplexer frames, UpdateContainer,
StopContainer, RemoveContainer, a pod notification, and the plugin's own UpdateContainers.

Needs `go` (the runtime is built from the Go module proxy, cached): a skip on a laptop without it, a
failure under CI=true.  Prints the runtime's CreateContainer round trips; asserts nothing on timing.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.nri import api_pb2
from agent.nri.plugin import Handler, Plugin, cpuset_adjustment, cpuset_update, event_mask
from tests.nri.goruntime import GoRuntime

SYNC_BYTES = 5 << 20  # above ttrpc's 4 MiB: the runtime must split Synchronize (`more`)
BIG_ENV = [f"TOPOLET_PAD_{i}={'y' * 200}" for i in range(100)]  # ~21 KB: a multi-frame answer


class PinningHandler(Handler):
    """Answers as the agent will: a cpuset for the new container, CPUs taken from another one."""

    def __init__(self) -> None:
        self.synchronized = threading.Event()
        self.pods_seen = 0
        self.containers_seen = 0
        self.removed: list[str] = []
        self.notified: list[tuple[int, str]] = []
        self.runtime_name = ""

    def configure(self, request: api_pb2.ConfigureRequest) -> int:
        self.runtime_name = request.runtime_name
        return event_mask(api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_CONTAINER, api_pb2.STOP_CONTAINER,
                          api_pb2.REMOVE_CONTAINER, api_pb2.RUN_POD_SANDBOX)

    def synchronize(self, pods: Sequence[api_pb2.PodSandbox],
                    containers: Sequence[api_pb2.Container]) -> Sequence[api_pb2.ContainerUpdate]:
        self.pods_seen = len({p.id for p in pods})
        self.containers_seen = len(containers)
        self.synchronized.set()
        return [cpuset_update("ctr0", "0-3")]

    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
    ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
        adjust = cpuset_adjustment("2-3", "0")
        for entry in BIG_ENV:
            key, value = entry.split("=", 1)
            adjust.env.add(key=key, value=value)
        return adjust, [cpuset_update("ctr0", "0-1")]

    def stop_container(self, pod: api_pb2.PodSandbox,
                       container: api_pb2.Container) -> Sequence[api_pb2.ContainerUpdate]:
        return [cpuset_update("ctr0", "0-3")]

    def remove_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        self.removed.append(container.id if container is not None else "")

    def state_change(self, event: int, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        self.notified.append((event, pod.id))


def cpus(update: dict[str, Any]) -> str:
    """The cpuset CPUs of a ContainerUpdate as the runtime printed it (protojson, proto names)."""
    return str(update["linux"]["resources"]["cpu"]["cpus"])


def test_plugin_against_nri_runtime(runtime_binary: str, short_tmp: Path) -> None:
    runtime = GoRuntime(runtime_binary, short_tmp / "nri.sock", "-sync-bytes", str(SYNC_BYTES),
                        "-creates", "200", "-wait-updates", "20s")
    try:
        runtime.wait_listening()
        handler = PinningHandler()
        plugin = Plugin.connect(str(runtime.socket), handler, "topolet", "90")
        outcome: list[BaseException | None] = []

        def serve() -> None:
            try:
                plugin.run()
                outcome.append(None)
            except BaseException as exc:  # reported by the assertion below
                outcome.append(exc)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        assert handler.synchronized.wait(30), runtime.log
        assert plugin.registered.is_set()
        release = cpuset_update("ctr0", "0")
        release.ignore_failure = True
        assert plugin.update_containers([release]) == []

        events = runtime.events_until_done()
        server.join(10)
        assert not server.is_alive(), "run() did not return after the runtime exited"
    finally:
        runtime.close()
    assert outcome == [None], outcome

    assert handler.runtime_name == "nri-runtime"
    sync = events["Synchronize"]
    # Every part of the split request collected, nothing twice.
    assert (handler.pods_seen, handler.containers_seen) == (sync["pods"], sync["containers"])
    assert sync["pods"] > 1000
    assert [(u["container_id"], cpus(u)) for u in sync["update"]] == [("ctr0", "0-3")]

    created = events["CreateContainer"]["response"]
    cpu = created["adjust"]["linux"]["resources"]["cpu"]
    assert (cpu["cpus"], cpu["mems"]) == ("2-3", "0")
    env = {e["key"]: e["value"] for e in created["adjust"]["env"]}
    assert env["TOPOLET_PAD_99"] == "y" * 200 and len(env) == len(BIG_ENV)
    assert [(u["container_id"], cpus(u)) for u in created["update"]] == [("ctr0", "0-1")]

    stopped = events["StopContainer"]["response"]
    assert [(u["container_id"], cpus(u)) for u in stopped["update"]] == [("ctr0", "0-3")]
    assert "RemoveContainer" in events and handler.removed == ["ctr1"]
    assert "RunPodSandbox" in events and handler.notified == [(api_pb2.RUN_POD_SANDBOX, "pod1")]
    asked = events["UpdateContainers"]["update"]
    assert [(u["container_id"], cpus(u), u.get("ignore_failure")) for u in asked] == [("ctr0", "0", True)]

    timing = events["timing"]
    print(f"\nCreateContainer round trip as NRI's runtime measured it, {timing['creates']} requests "
          f"(21 KB answers): p50 {timing['p50_us'] / 1e3:.3f} ms, p99 {timing['p99_us'] / 1e3:.3f} ms, "
          f"max {timing['max_us'] / 1e3:.3f} ms")

"""The kubelet's other stand-in: its pod-resources gRPC server (`v1.PodResourcesLister`).

Besides the kubelet stand-in (kubelet_standin.py) this is the only stand-in in the Kubernetes tests.
No kubelet runs on the test machine, so this serves what a kubelet would: a REAL gRPC server on a
REAL unix socket (in a private temporary folder), speaking the wire format of our transcription of
the published API, with canned device assignments given by the test.  It records every call, and
can misbehave the ways a kubelet might:

- `get=False`: no `Get` method (a kubelet older than it, or with its feature gate off): UNIMPLEMENTED;
- `mode="garbage"`: every method answers bytes that are not the message;
- `mode="hang"`: every method blocks until the stand-in is stopped (or 30 s pass);
- `SilentSocket`: a unix socket that accepts connections and never says a word (not gRPC at all).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterable, Mapping
from concurrent import futures
from typing import Any

import grpc

from agent.kube.kubelet.podresources import api_pb2, api_pb2_grpc
from agent.kube.kubelet.podresources.client import Device

SERVICE = "v1.PodResourcesLister"
METHODS = ("List", "GetAllocatableResources", "Get")
GARBAGE = b"\xff" * 12  # a field key whose varint never ends: no protobuf parser accepts it
HANG_LIMIT_SECONDS = 30.0

Assignments = Mapping[tuple[str, str, str], Iterable[Device]]  # (namespace, pod, container) → devices


def short_tmpdir() -> str:
    """A fresh folder with a short path (unix socket paths are limited to 107 bytes)."""
    return tempfile.mkdtemp(prefix="podres-", dir="/tmp")


def _container_devices(d: Device) -> Any:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in sorted(d.numa_nodes)])
    return api_pb2.ContainerDevices(resource_name=d.resource, device_ids=list(d.ids),
                                    topology=topology if d.numa_nodes else None)


def pod_messages(assignments: Assignments, cpu_ids: Mapping[tuple[str, str, str], Iterable[int]] | None = None
                 ) -> list[Any]:
    """`PodResources` messages for canned assignments, pods in first-seen order."""
    pods: dict[tuple[str, str], Any] = {}
    for (namespace, pod, container), devices in assignments.items():
        msg = pods.get((namespace, pod))
        if msg is None:
            msg = pods[(namespace, pod)] = api_pb2.PodResources(name=pod, namespace=namespace)
        msg.containers.append(api_pb2.ContainerResources(
            name=container, devices=[_container_devices(d) for d in devices],
            cpu_ids=list((cpu_ids or {}).get((namespace, pod, container), ()))))
    return list(pods.values())


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, standin: PodResourcesStandIn) -> None:
        self.s = standin

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        self.s.record("List")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.s.pods())

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.s.record("GetAllocatableResources")
        return api_pb2.AllocatableResourcesResponse(
            devices=[_container_devices(d) for d in self.s.allocatable_devices],
            cpu_ids=list(self.s.allocatable_cpus))

    def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.s.record("Get")
        if not self.s.get_enabled:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "method Get not implemented")
        for pod in self.s.pods():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=pod)
        # As the kubelet answers (v1.37 server_v1.go returns a plain error: code Unknown).
        context.abort(grpc.StatusCode.UNKNOWN,
                      f"pod {request.pod_name} in namespace {request.pod_namespace} not found")


class PodResourcesStandIn:
    """A kubelet pod-resources server on `<folder>/kubelet.sock` with canned assignments."""

    def __init__(self, assignments: Assignments | None = None, *, folder: str | None = None,
                 allocatable_devices: Iterable[Device] = (), allocatable_cpus: Iterable[int] = (),
                 cpu_ids: Mapping[tuple[str, str, str], Iterable[int]] | None = None,
                 raw_pods: list[Any] | None = None, get: bool = True, mode: str = "ok") -> None:
        assert mode in ("ok", "garbage", "hang"), mode
        self.own_folder = folder is None
        self.folder = folder or short_tmpdir()
        self.path = os.path.join(self.folder, "kubelet.sock")
        self.assignments: Assignments = dict(assignments or {})
        self.cpu_ids = cpu_ids
        self.raw_pods = raw_pods  # PodResources messages served as they are (malformed content tests)
        self.allocatable_devices = tuple(allocatable_devices)
        self.allocatable_cpus = tuple(allocatable_cpus)
        self.get_enabled = get
        self.mode = mode
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: Any = None

    def record(self, method: str) -> None:
        with self._lock:
            self.calls.append(method)

    def pods(self) -> list[Any]:
        if self.raw_pods is not None:
            return list(self.raw_pods)
        return pod_messages(self.assignments, self.cpu_ids)

    def _misbehaving(self) -> Any:
        def answer(name: str) -> Any:
            def handler(request: bytes, context: Any) -> bytes:
                self.record(name)
                if self.mode == "hang":
                    self._release.wait(HANG_LIMIT_SECONDS)
                return GARBAGE
            return grpc.unary_unary_rpc_method_handler(handler)  # raw bytes in and out
        return grpc.method_handlers_generic_handler(SERVICE, {m: answer(m) for m in METHODS})

    def start(self) -> PodResourcesStandIn:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if self.mode == "ok":
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
                _Servicer(self), server)
        else:
            server.add_generic_rpc_handlers((self._misbehaving(),))
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket (as a kubelet that exits); the folder stays."""
        self._release.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def close(self) -> None:
        self.stop()
        if self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PodResourcesStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SilentSocket:
    """A unix socket that accepts connections, reads what comes and never answers."""

    def __init__(self, folder: str | None = None) -> None:
        self.folder = folder or short_tmpdir()
        self.path = os.path.join(self.folder, "kubelet.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            self._conns.append(conn)  # held open, never written to

    def __enter__(self) -> SilentSocket:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._conns:
            conn.close()
        self.sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)

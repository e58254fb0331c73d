"""`PodResourcesClient`: which devices the kubelet gave each container, read from its pod-resources API.

The kubelet serves `v1.PodResourcesLister` over gRPC on a unix socket on its node.  The socket is
optional: where it is absent the feature is off and every answer is "no info"; where it answers
badly (an error, a hang past the timeout, bytes that are not the messages) the failure is logged
once and the answer is "no info" too.  A client never raises to its caller: pinning goes on without
device locality.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from agent.kube.kubelet.podresources import api_pb2, api_pb2_grpc

_T = TypeVar("_T")

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_SECONDS = 1.0  # a local socket answers in milliseconds; this bounds a hung kubelet
# After a failed call the socket is left alone this long (answers are "no info" at once), so a hung
# kubelet costs one timeout per period, not one per pod being pinned.
DEFAULT_BACKOFF_SECONDS = 10.0
# A node's full List stays far below this; a bigger answer is refused rather than buffered.
MAX_MESSAGE_BYTES = 16 << 20
_MAX_NUMA_ID = 1 << 16  # larger (or negative) NUMA ids in an answer are garbage, not nodes
_MAX_CPU_ID = 1 << 22  # likewise for CPU ids

ContainerKey = tuple[str, str, str]  # (namespace, pod name, container name)
_UNKNOWN_POD = object()  # Get's NOT_FOUND, or the kubelet's own "pod ... not found"
# The kubelet answers Get for a pod it has not admitted (yet) with code Unknown and this text
# (pkg/kubelet/apis/podresources/server_v1.go: "pod %s in namespace %s not found").
_NOT_FOUND_TEXT = " not found"


@dataclass(frozen=True, slots=True)
class Device:
    """Devices of one resource given to a container, with the NUMA nodes the kubelet reports for them."""

    resource: str  # e.g. "nvidia.com/gpu"
    ids: tuple[str, ...]  # as the device plugin names them (GPU UUIDs or indices for NVIDIA's)
    numa_nodes: frozenset[int]  # empty when the device plugin reports no locality


DeviceMap = dict[ContainerKey, list[Device]]


@dataclass(frozen=True, slots=True)
class Allocatable:
    """What the kubelet can hand out: devices and the CPUs its CPU manager may give exclusively."""

    devices: tuple[Device, ...]
    cpu_ids: frozenset[int]


def socket_path_of(target: str) -> str:
    """The file path of a socket given as a path or a `unix://` URI."""
    return target[len("unix://"):] if target.startswith("unix://") else target


def _numa_nodes(topology: Any) -> frozenset[int]:
    return frozenset(int(n.ID) for n in topology.nodes if 0 <= int(n.ID) < _MAX_NUMA_ID)


def _devices(entries: Iterable[Any]) -> list[Device]:
    out: list[Device] = []
    for d in entries:
        ids = tuple(i for i in d.device_ids if i)
        if not d.resource_name or not ids:
            continue
        out.append(Device(str(d.resource_name), ids, _numa_nodes(d.topology)))
    return out


def _containers(pods: Iterable[Any]) -> DeviceMap:
    out: DeviceMap = {}
    for pod in pods:
        if not pod.name or not pod.namespace:
            continue
        for c in pod.containers:
            if c.name:
                out.setdefault((str(pod.namespace), str(pod.name), str(c.name)), []).extend(
                    _devices(c.devices))
    return out


def _pod_not_found(exc: grpc.RpcError) -> bool:
    """Whether an error is the kubelet's "pod <name> in namespace <ns> not found"."""
    detail = str(exc.details()) if isinstance(exc, grpc.Call) else ""
    return detail.startswith("pod ") and detail.endswith(_NOT_FOUND_TEXT)


def _of_pod(found: DeviceMap, namespace: str, pod: str) -> dict[str, tuple[Device, ...]]:
    return {key[2]: tuple(devices) for key, devices in found.items() if key[:2] == (namespace, pod)}


class PodResourcesClient:
    """A client of the kubelet's pod-resources socket; every answer is "no info" ({} or None) on failure."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 backoff: float = DEFAULT_BACKOFF_SECONDS) -> None:
        self.path = os.path.abspath(socket_path_of(socket_path))
        self.target = f"unix://{self.path}"
        self.timeout = timeout
        self.backoff = backoff
        self._quiet_until = 0.0  # monotonic time before which the socket is not asked (after a failure)
        self.failures = 0  # calls that got no usable answer from a socket that exists
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._get_unimplemented = False  # an older kubelet (or a gate off): List serves instead
        self._last_problem: str | None = None

    @property
    def available(self) -> bool:
        """Whether the kubelet's socket exists now (it comes and goes with the kubelet)."""
        return os.path.exists(self.path)

    def close(self) -> None:
        """Close the channel; a later call opens a new one."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def _call(self, method: str, request: Any) -> Any:
        """One RPC; None on any failure (logged once per kind of failure until a call succeeds)."""
        if not self.available:
            self._note(f"no pod-resources socket at {self.path}: device locality off", logging.INFO)
            return None
        if time.monotonic() < self._quiet_until:
            return None
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(self.target, options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.enable_retries", 0),
                ])
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
            stub = self._stub
        try:
            reply = getattr(stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if method == "Get" and code == grpc.StatusCode.UNIMPLEMENTED:
                self._get_unimplemented = True
                return None
            if method == "Get" and (code == grpc.StatusCode.NOT_FOUND
                                    or (code == grpc.StatusCode.UNKNOWN and _pod_not_found(exc))):
                return _UNKNOWN_POD  # an answer, not a failure: the kubelet runs no such pod (yet)
            self._failed()
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            self._note(f"pod-resources {method} at {self.path}: {code.name if code else 'error'}: "
                       f"{str(detail)[:200]}", logging.WARNING)
            with self._lock:  # a fresh channel next time: the kubelet may have restarted
                self._drop()
            return None
        except Exception as exc:  # noqa: BLE001 - an answer from outside must never crash the agent
            self._failed()
            self._note(f"pod-resources {method} at {self.path}: {type(exc).__name__}: {str(exc)[:200]}",
                       logging.WARNING)
            return None
        if self._last_problem is not None:
            log.info("pod-resources socket %s answers again", self.path)
            self._last_problem = None
        return reply

    def _failed(self) -> None:
        self.failures += 1
        self._quiet_until = time.monotonic() + self.backoff

    def _note(self, problem: str, level: int) -> None:
        if problem != self._last_problem:
            self._last_problem = problem
            log.log(level, "%s", problem)

    def _list_reply(self, decode: Callable[[Any], _T]) -> _T | None:
        """`decode` of List's pod resources; None when the kubelet gives no answer or one it cannot
        read (a failure, as in `_call`)."""
        reply = self._call("List", api_pb2.ListPodResourcesRequest())
        if reply is None:
            return None
        try:
            return decode(reply.pod_resources)
        except Exception as exc:  # noqa: BLE001 - see _call
            self._failed()
            self._note(f"pod-resources List: unreadable answer: {exc}", logging.WARNING)
            return None

    def _listed(self) -> DeviceMap | None:
        return self._list_reply(_containers)

    def list(self) -> DeviceMap:
        """Devices of every container the kubelet runs, by (namespace, pod, container); {} = no info."""
        return self._listed() or {}

    def exclusive_cpus(self) -> frozenset[int] | None:
        """CPUs the kubelet's CPU manager gave containers exclusively (List's `cpu_ids`, as NFD's
        topology updater reads them); None = no info."""
        return self._list_reply(lambda pods: frozenset(
            int(c) for pod in pods for container in pod.containers for c in container.cpu_ids
            if 0 <= int(c) < _MAX_CPU_ID))

    def get(self, namespace: str, pod: str) -> dict[str, tuple[Device, ...]] | None:
        """Devices of one pod's containers by container name (Get, else List); None = no info."""
        if not self._get_unimplemented:
            reply = self._call("Get", api_pb2.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace))
            if reply is _UNKNOWN_POD:
                return {}
            if reply is None and not self._get_unimplemented:
                return None
            if reply is not None:
                try:
                    found = _containers([reply.pod_resources])
                except Exception as exc:  # noqa: BLE001 - see _call
                    self._failed()
                    self._note(f"pod-resources Get: unreadable answer: {exc}", logging.WARNING)
                    return None
                return _of_pod(found, namespace, pod)
        every = self._listed()
        if every is None:
            return None
        return _of_pod(every, namespace, pod)

    def allocatable(self) -> Allocatable | None:
        """Every device and exclusive-capable CPU the kubelet could hand out; None = no info."""
        reply = self._call("GetAllocatableResources", api_pb2.AllocatableResourcesRequest())
        if reply is None:
            return None
        try:
            cpus = frozenset(int(c) for c in reply.cpu_ids if 0 <= int(c) < _MAX_CPU_ID)
            return Allocatable(tuple(_devices(reply.devices)), cpus)
        except Exception as exc:  # noqa: BLE001 - see _call
            self._failed()
            self._note(f"pod-resources GetAllocatableResources: unreadable answer: {exc}", logging.WARNING)
            return None

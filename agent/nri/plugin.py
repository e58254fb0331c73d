"""`Plugin`: an external NRI plugin on one runtime socket, answering the runtime with a `Handler`.

Register, Configure, Synchronize, then one request per subscribed event, as NRI v0.12.3's stub does.
Every handler call runs on the thread that runs `Plugin.run()`, one at a time, in arrival order;
`run()` returns when the runtime closes the socket (or on `close()`): reconnect with a new `Plugin`.
A handler that raises fails that one request, not the connection.
The exchange in full: agent/nri/README.md.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from agent.errors import ConfigError
from agent.nri import api_pb2, rpc_status_pb2, ttrpc_pb2
from agent.nri.framing import (
    TTRPC_MESSAGE_MAX,
    Conn,
    Demultiplexer,
    Message,
    MessageType,
    NRIProtocolError,
    encode_message,
)

log = logging.getLogger(__name__)

NRI_VERSION = "v0.12.3"  # the nri module api.proto was copied from (regenerate.sh)
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"  # nri pkg/api/plugin.go DefaultSocketPath
_RECV_BYTES = 1 << 16

# google.rpc.Code values ttrpc answers with (services.go, server.go).
OK = 0
UNKNOWN = 2
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12


def event_mask(*events: int) -> int:
    """The subscription bits of NRI events (api_pb2.CREATE_CONTAINER...), as nri's EventMask.Set sets them."""
    mask = 0
    for event in events:
        if not api_pb2.UNKNOWN < event < api_pb2.LAST:
            raise ValueError(f"not an NRI event: {event}")
        mask |= 1 << (event - 1)
    return mask


class Handler:
    """What a plugin answers; the defaults answer "no change".  Override what the plugin needs."""

    def configure(self, request: api_pb2.ConfigureRequest) -> int:
        """The event mask to subscribe to, given the runtime's name, version and timeouts (0: every event)."""
        return event_mask(api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_CONTAINER, api_pb2.STOP_CONTAINER,
                          api_pb2.REMOVE_CONTAINER)

    def synchronize(self, pods: Sequence[api_pb2.PodSandbox],
                    containers: Sequence[api_pb2.Container]) -> Sequence[api_pb2.ContainerUpdate]:
        """Container updates for the pods and containers that exist now."""
        return ()

    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
    ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
        """The new container's adjustment (None: none) and updates to other containers."""
        return None, ()

    def update_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
                         resources: api_pb2.LinuxResources) -> Sequence[api_pb2.ContainerUpdate]:
        """Updates to apply when the runtime changes a container's resources."""
        return ()

    def stop_container(self, pod: api_pb2.PodSandbox,
                       container: api_pb2.Container) -> Sequence[api_pb2.ContainerUpdate]:
        """Updates to other containers once this one stops (e.g. CPUs handed back)."""
        return ()

    def remove_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        """The container is gone (None: a StateChange that named no container)."""

    def state_change(self, event: int, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        """A lifecycle notification (an api_pb2.Event) for a pod, or a container when one is given."""

    def shutdown(self) -> None:
        """The runtime is shutting down; the connection closes next."""


def cpuset_adjustment(cpus: str, mems: str = "") -> api_pb2.ContainerAdjustment:
    """A CreateContainer adjustment that sets the new container's cpuset (cpulist strings; "" leaves one)."""
    adjust = api_pb2.ContainerAdjustment()
    _set_cpuset(adjust.linux.resources.cpu, cpus, mems)
    return adjust


def cpuset_update(container_id: str, cpus: str, mems: str = "") -> api_pb2.ContainerUpdate:
    """An update that sets an existing container's cpuset (cpulist strings; "" leaves one)."""
    update = api_pb2.ContainerUpdate(container_id=container_id)
    _set_cpuset(update.linux.resources.cpu, cpus, mems)
    return update


def _set_cpuset(cpu: Any, cpus: str, mems: str) -> None:
    if cpus:
        cpu.cpus = cpus
    if mems:
        cpu.mems = mems


class _PendingCall:
    __slots__ = ("done", "response", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Any = None
        self.error: str | None = None


def check_plugin_identity(name: str, index: str) -> None:
    """Raise ConfigError unless the runtime accepts this name and index (nri api CheckPluginName/Index)."""
    if len(index) != 2 or not all("0" <= c <= "9" for c in index):
        raise ConfigError(f"NRI plugin index {index!r} must be two digits")
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.+")
    if not name or not set(name) <= allowed:
        raise ConfigError(f"NRI plugin name {name!r} must be non-empty [a-zA-Z0-9_.+-]")


class Plugin:
    """One NRI plugin connection: register, then answer the runtime's requests with `handler`."""

    def __init__(self, sock: socket.socket, handler: Handler, name: str, index: str) -> None:
        check_plugin_identity(name, index)
        self._sock = sock
        self._handler = handler
        self._name = name
        self._index = index
        self._demux = Demultiplexer()
        self._write_lock = threading.Lock()
        self._calls_lock = threading.Lock()
        self._pending: dict[int, _PendingCall] = {}
        self._next_stream = 1  # ttrpc client.go: odd, from 1, step 2
        self._last_served_stream = 0  # ttrpc server.go: requests' ids must be odd and increase
        self._serving_thread: int | None = None
        self._closed = False
        self._sync_pods: list[Any] = []
        self._sync_containers: list[Any] = []
        self.registered = threading.Event()  # set once the runtime has answered RegisterPlugin
        self._methods: dict[str, tuple[type[Any], Callable[[Any], Any]]] = {
            "Configure": (api_pb2.ConfigureRequest, self._configure),
            "Synchronize": (api_pb2.SynchronizeRequest, self._synchronize),
            "Shutdown": (api_pb2.Empty, self._shutdown),
            "CreateContainer": (api_pb2.CreateContainerRequest, self._create_container),
            "UpdateContainer": (api_pb2.UpdateContainerRequest, self._update_container),
            "StopContainer": (api_pb2.StopContainerRequest, self._stop_container),
            "RemoveContainer": (api_pb2.RemoveContainerRequest, self._remove_container),
            "StateChange": (api_pb2.StateChangeEvent, self._state_change),
        }
        for method, event in _NOTIFICATIONS.items():
            request_type = getattr(api_pb2, f"{method}Request")
            reply_type = getattr(api_pb2, f"{method}Response")
            self._methods[method] = (request_type, self._notification(event, reply_type))

    @classmethod
    def connect(cls, socket_path: str, handler: Handler, name: str, index: str,
                timeout: float = 5.0) -> Plugin:
        """A plugin connected to the runtime's NRI socket at `socket_path` (not yet registered)."""
        check_plugin_identity(name, index)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            sock.settimeout(None)
        except OSError:
            sock.close()
            raise
        return cls(sock, handler, name, index)

    def run(self) -> None:
        """Register, then serve until the runtime closes the connection; NRIProtocolError if it misbehaves."""
        self._serving_thread = threading.get_ident()
        try:
            self._register()
            while self._receive():
                pass
        finally:
            self.close()
            self._sock.close()

    def close(self) -> None:
        """End the connection (from any thread); `run()` returns and calls still waiting fail."""
        with self._calls_lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        for call in pending:
            call.error = "connection closed"
            call.done.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes run()'s read, which then closes the socket
        except OSError:
            pass  # already disconnected
        if self._serving_thread is None:
            self._sock.close()

    def update_containers(self, updates: Sequence[api_pb2.ContainerUpdate],
                          evictions: Sequence[api_pb2.ContainerEviction] = (),
                          timeout: float = 2.0) -> list[api_pb2.ContainerUpdate]:
        """Ask the runtime to update containers now; the updates it could not apply.

        Call it from any thread but the one running `run()` (which reads the answer).
        """
        if threading.get_ident() == self._serving_thread:
            raise RuntimeError("update_containers from the serving thread would wait on itself")
        request = api_pb2.UpdateContainersRequest(update=updates, evict=evictions)
        call, stream = self._start_call("UpdateContainers", request, timeout)
        if not call.done.wait(timeout):
            with self._calls_lock:
                self._pending.pop(stream, None)
            raise NRIProtocolError(f"UpdateContainers: no answer from the runtime within {timeout} s")
        reply = self._finish_call("UpdateContainers", call, api_pb2.UpdateContainersResponse)
        return list(reply.failed)

    # --- the Runtime service (this side is the ttrpc client on connection 2) ---

    def _register(self) -> None:
        request = api_pb2.RegisterPluginRequest(plugin_name=self._name, plugin_idx=self._index,
                                                NRI_version=NRI_VERSION)
        call, _ = self._start_call("RegisterPlugin", request, None)
        # The runtime calls Configure before it answers: serve while waiting.
        while not call.done.is_set():
            if not self._receive():
                raise NRIProtocolError("the runtime closed the connection before registration finished")
        self._finish_call("RegisterPlugin", call, api_pb2.Empty)
        self.registered.set()

    def _start_call(self, method: str, request: Any, timeout: float | None) -> tuple[_PendingCall, int]:
        call = _PendingCall()
        with self._calls_lock:
            if self._closed:
                raise NRIProtocolError(f"{method}: the connection is closed")
            stream = self._next_stream
            self._next_stream += 2
            self._pending[stream] = call
        envelope = ttrpc_pb2.Request(service=RUNTIME_SERVICE, method=method,
                                     payload=request.SerializeToString(),
                                     timeout_nano=int(timeout * 1e9) if timeout else 0)
        self._send(Conn.RUNTIME_SERVICE, stream, MessageType.REQUEST, envelope.SerializeToString())
        return call, stream

    @staticmethod
    def _finish_call(method: str, call: _PendingCall, reply_type: type[Any]) -> Any:
        if call.error is not None:
            raise NRIProtocolError(f"{method}: {call.error}")
        response = call.response
        if response.HasField("status") and response.status.code != OK:
            raise NRIProtocolError(
                f"{method} refused by the runtime: code {response.status.code}: {response.status.message}")
        reply = reply_type()
        try:
            reply.ParseFromString(response.payload)
        except DecodeError as exc:
            raise NRIProtocolError(f"{method}: undecodable answer: {exc}") from exc
        return reply

    # --- reading the socket ---

    def _receive(self) -> bool:
        """Read once and handle what it completes; False once the runtime has closed the connection."""
        try:
            data = self._sock.recv(_RECV_BYTES)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        except OSError:
            if self._closed:
                return False
            raise
        if not data:
            if not self._demux.idle and not self._closed:
                raise NRIProtocolError("the runtime closed the connection in the middle of a message")
            return False
        for message in self._demux.feed(data):
            if message.conn == Conn.PLUGIN_SERVICE:
                self._serve(message)
            else:
                self._deliver(message)
        return True

    def _deliver(self, message: Message) -> None:
        if message.type != MessageType.RESPONSE:
            return  # this side serves nothing on connection 2; ttrpc's client ignores such messages too
        with self._calls_lock:
            call = self._pending.pop(message.stream_id, None)
        if call is None:
            return  # the answer to a call that gave up waiting
        response = ttrpc_pb2.Response()
        try:
            response.ParseFromString(message.payload)
        except DecodeError as exc:
            raise NRIProtocolError(f"undecodable ttrpc response: {exc}") from exc
        call.response = response
        call.done.set()

    # --- the Plugin service (this side is the ttrpc server on connection 1) ---

    def _serve(self, message: Message) -> None:
        stream = message.stream_id
        if message.type == MessageType.DATA:
            self._answer(stream, INVALID_ARGUMENT, "StreamID is no longer active")  # NRI is unary only
            return
        if message.type != MessageType.REQUEST:
            return  # ttrpc's server ignores unknown message types, for future use
        if stream % 2 != 1:
            self._answer(stream, INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
            return
        if stream <= self._last_served_stream:
            self._answer(stream, INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
            return
        self._last_served_stream = stream
        envelope = ttrpc_pb2.Request()
        try:
            envelope.ParseFromString(message.payload)
        except DecodeError as exc:
            self._answer(stream, INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            return
        if envelope.service != PLUGIN_SERVICE:
            self._answer(stream, UNIMPLEMENTED, f"service {envelope.service}")
            return
        entry = self._methods.get(envelope.method)
        if entry is None:
            self._answer(stream, UNIMPLEMENTED, f"method {envelope.method}")
            return
        request_type, call = entry
        request = request_type()
        try:
            request.ParseFromString(envelope.payload)
        except DecodeError as exc:
            self._answer(stream, INVALID_ARGUMENT, f"{envelope.method}: {exc}")
            return
        try:
            reply = call(request)
        except Exception as exc:  # a handler's failure fails this request, not the connection
            log.exception("NRI %s handler failed", envelope.method)
            self._answer(stream, UNKNOWN, f"{type(exc).__name__}: {exc}")
            return
        self._answer(stream, OK, "", reply.SerializeToString())

    def _answer(self, stream: int, code: int, text: str, payload: bytes = b"") -> None:
        body = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=code, message=text), payload=payload)
        data = body.SerializeToString()
        if len(data) > TTRPC_MESSAGE_MAX:
            data = ttrpc_pb2.Response(status=rpc_status_pb2.Status(
                code=RESOURCE_EXHAUSTED, message=f"answer of {len(data)} bytes exceeds {TTRPC_MESSAGE_MAX}",
            )).SerializeToString()
        self._send(Conn.PLUGIN_SERVICE, stream, MessageType.RESPONSE, data)

    def _send(self, conn: int, stream: int, type_: int, payload: bytes) -> None:
        data = encode_message(conn, stream, type_, 0, payload)
        with self._write_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise NRIProtocolError(f"writing to the runtime failed: {exc}") from exc

    # --- requests to handler calls ---

    def _configure(self, request: Any) -> Any:
        events = int(self._handler.configure(request))
        return api_pb2.ConfigureResponse(events=events)

    def _synchronize(self, request: Any) -> Any:
        # A split Synchronize is collected whole before the handler sees it, as the Go stub does.
        self._sync_pods.extend(request.pods)
        self._sync_containers.extend(request.containers)
        if request.more:
            return api_pb2.SynchronizeResponse(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        return api_pb2.SynchronizeResponse(update=self._handler.synchronize(pods, containers))

    def _shutdown(self, request: Any) -> Any:
        self._handler.shutdown()
        return api_pb2.Empty()

    def _create_container(self, request: Any) -> Any:
        adjust, updates = self._handler.create_container(request.pod, request.container)
        return api_pb2.CreateContainerResponse(adjust=adjust, update=updates)

    def _update_container(self, request: Any) -> Any:
        updates = self._handler.update_container(request.pod, request.container, request.linux_resources)
        return api_pb2.UpdateContainerResponse(update=updates)

    def _stop_container(self, request: Any) -> Any:
        updates = self._handler.stop_container(request.pod, request.container)
        return api_pb2.StopContainerResponse(update=updates)

    def _remove_container(self, request: Any) -> Any:
        self._handler.remove_container(request.pod, request.container)
        return api_pb2.RemoveContainerResponse()

    def _state_change(self, request: Any) -> Any:
        # What older runtimes send, and what the runtime falls back to when a method is unimplemented.
        container = request.container if request.HasField("container") else None
        if request.event == api_pb2.REMOVE_CONTAINER:
            self._handler.remove_container(request.pod, container)
        else:
            self._handler.state_change(request.event, request.pod, container)
        return api_pb2.Empty()

    def _notification(self, event: int, reply_type: type[Any]) -> Callable[[Any], Any]:
        def notify(request: Any) -> Any:
            container = request.container if "container" in request.DESCRIPTOR.fields_by_name else None
            self._handler.state_change(event, request.pod, container)
            return reply_type()

        return notify


# The runtime's per-event notifications (api.proto's Plugin service): each method takes <method>Request
# and answers an empty <method>Response.
_NOTIFICATIONS: dict[str, int] = {
    "RunPodSandbox": api_pb2.RUN_POD_SANDBOX,
    "UpdatePodSandbox": api_pb2.UPDATE_POD_SANDBOX,
    "PostUpdatePodSandbox": api_pb2.POST_UPDATE_POD_SANDBOX,
    "StopPodSandbox": api_pb2.STOP_POD_SANDBOX,
    "RemovePodSandbox": api_pb2.REMOVE_POD_SANDBOX,
    "PostCreateContainer": api_pb2.POST_CREATE_CONTAINER,
    "StartContainer": api_pb2.START_CONTAINER,
    "PostStartContainer": api_pb2.POST_START_CONTAINER,
    "PostUpdateContainer": api_pb2.POST_UPDATE_CONTAINER,
}

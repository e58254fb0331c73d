"""agent.nri.plugin over a real unix socketpair, against a scripted runtime that checks every frame.

The runtime's order and rules are NRI v0.12.3's (pkg/adaptation/plugin.go): it calls Configure before
it answers RegisterPlugin, splits Synchronize with `more`, and expects ttrpc's answers for what a
plugin does not serve (Unimplemented, code 12) so that it can fall back to StateChange.
test_go_runtime.py runs the same plugin against NRI's real runtime side.
"""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent.errors import ConfigError
from agent.nri import api_pb2, rpc_status_pb2, ttrpc_pb2
from agent.nri.framing import Conn, Demultiplexer, Message, MessageType, NRIProtocolError, encode_message
from agent.nri.plugin import (
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    Handler,
    Plugin,
    check_plugin_identity,
    cpuset_adjustment,
    cpuset_update,
    event_mask,
)


class Runtime:
    """The runtime's end of the socketpair: sends requests and answers, returns what the plugin sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(10)
        self.demux = Demultiplexer()
        self.inbox: list[Message] = []

    def expect(self) -> Message:
        while not self.inbox:
            data = self.sock.recv(1 << 16)
            assert data, "the plugin closed the connection"
            self.inbox += self.demux.feed(data)
        return self.inbox.pop(0)

    def call(self, stream: int, method: str, request: Any, service: str = PLUGIN_SERVICE) -> None:
        envelope = ttrpc_pb2.Request(service=service, method=method, payload=request.SerializeToString())
        self.send_raw(Conn.PLUGIN_SERVICE, stream, MessageType.REQUEST, envelope.SerializeToString())

    def send_raw(self, conn: int, stream: int, type_: int, payload: bytes) -> None:
        self.sock.sendall(encode_message(conn, stream, type_, 0, payload))

    def answer(self, stream: int, method: str, reply_type: type[Any]) -> Any:
        """The plugin's answer on `stream`: checks the framing and an OK status, returns the reply."""
        code, text, reply = self.answer_status(stream, reply_type)
        assert code == 0, f"{method}: {code} {text}"
        return reply

    def answer_status(self, stream: int, reply_type: type[Any] = api_pb2.Empty) -> tuple[int, str, Any]:
        message = self.expect()
        assert (message.conn, message.stream_id, message.type, message.flags) == (
            Conn.PLUGIN_SERVICE, stream, MessageType.RESPONSE, 0)
        response = ttrpc_pb2.Response()
        response.ParseFromString(message.payload)
        assert response.HasField("status")  # as Go's ttrpc server: present even when OK
        reply = reply_type()
        reply.ParseFromString(response.payload)
        return response.status.code, response.status.message, reply

    def expect_call(self, method: str, request_type: type[Any]) -> tuple[int, Any]:
        """A call the plugin made to the Runtime service: its stream id and request."""
        message = self.expect()
        assert (message.conn, message.type, message.flags) == (Conn.RUNTIME_SERVICE, MessageType.REQUEST, 0)
        assert message.stream_id % 2 == 1
        envelope = ttrpc_pb2.Request()
        envelope.ParseFromString(message.payload)
        assert (envelope.service, envelope.method) == (RUNTIME_SERVICE, method)
        request = request_type()
        request.ParseFromString(envelope.payload)
        return message.stream_id, request

    def reply(self, stream: int, reply: Any, code: int = 0, text: str = "") -> None:
        response = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=code, message=text),
                                      payload=reply.SerializeToString())
        self.send_raw(Conn.RUNTIME_SERVICE, stream, MessageType.RESPONSE, response.SerializeToString())


class RecordingHandler(Handler):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def configure(self, request: api_pb2.ConfigureRequest) -> int:
        self.calls.append(("configure", request.runtime_name, request.request_timeout))
        return event_mask(api_pb2.CREATE_CONTAINER, api_pb2.REMOVE_CONTAINER, api_pb2.START_CONTAINER)

    def synchronize(self, pods: Sequence[api_pb2.PodSandbox],
                    containers: Sequence[api_pb2.Container]) -> Sequence[api_pb2.ContainerUpdate]:
        self.calls.append(("synchronize", [p.id for p in pods], [c.id for c in containers]))
        return [api_pb2.ContainerUpdate(container_id="c0")]

    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
    ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
        self.calls.append(("create", pod.id, container.id))
        if container.id == "bad":
            raise ValueError("no CPUs left")
        if container.id == "huge":
            adjust = api_pb2.ContainerAdjustment()
            adjust.env.add(key="PAD", value="z" * (5 << 20))
            return adjust, ()
        return cpuset_adjustment("4-7"), ()

    def remove_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        self.calls.append(("remove", pod.id, container.id if container is not None else None))

    def state_change(self, event: int, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        self.calls.append(("state", event, pod.id, container.id if container is not None else None))

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))


class Served:
    """A plugin running on its own thread; `outcome` is None once run() returned, else what it raised."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self.outcome: list[BaseException | None] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.plugin.run()
            self.outcome.append(None)
        except BaseException as exc:  # the test asserts on it
            self.outcome.append(exc)

    def finished(self) -> BaseException | None:
        self.thread.join(10)
        assert not self.thread.is_alive(), "run() did not return"
        return self.outcome[0]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, Runtime]]:
    plugin_end, runtime_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield plugin_end, Runtime(runtime_end)
    plugin_end.close()
    runtime_end.close()


def create(pod: api_pb2.PodSandbox, container_id: str) -> api_pb2.CreateContainerRequest:
    return api_pb2.CreateContainerRequest(pod=pod, container=api_pb2.Container(id=container_id))


def register(runtime: Runtime) -> None:
    """NRI's start-up: RegisterPlugin, Configure answered before registration is, then the answer."""
    stream, request = runtime.expect_call("RegisterPlugin", api_pb2.RegisterPluginRequest)
    assert stream == 1  # ttrpc's client starts at 1
    assert (request.plugin_name, request.plugin_idx, request.NRI_version) == ("topolet", "90", "v0.12.3")
    runtime.call(1, "Configure", api_pb2.ConfigureRequest(runtime_name="containerd", request_timeout=2000))
    configured = runtime.answer(1, "Configure", api_pb2.ConfigureResponse)
    assert configured.events == (1 << 3) | (1 << 10) | (1 << 5)  # CREATE 4, REMOVE 11, START 6
    runtime.reply(stream, api_pb2.Empty())


class Session:
    """A registered plugin on its own thread, the scripted runtime at the other end, the handler's record."""

    def __init__(self, sock: socket.socket, runtime: Runtime, handler: RecordingHandler) -> None:
        self.handler = handler
        self.plugin = Plugin(sock, handler, "topolet", "90")
        self.served = Served(self.plugin)
        self.runtime = runtime
        register(runtime)
        assert self.plugin.registered.wait(5)

    def end(self) -> None:
        """The runtime closes the connection; run() must return cleanly."""
        self.runtime.sock.close()
        assert self.served.finished() is None


@pytest.fixture
def session(pair: tuple[socket.socket, Runtime]) -> Session:
    return Session(*pair, RecordingHandler())


class Asking(threading.Thread):
    """update_containers on a thread of its own, as the agent's loop calls it."""

    def __init__(self, plugin: Plugin, updates: Sequence[api_pb2.ContainerUpdate],
                 timeout: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.plugin, self.updates, self.timeout = plugin, updates, timeout
        self.failed: list[api_pb2.ContainerUpdate] | None = None
        self.error: NRIProtocolError | None = None
        self.start()

    def run(self) -> None:
        try:
            self.failed = self.plugin.update_containers(self.updates, timeout=self.timeout)
        except NRIProtocolError as exc:
            self.error = exc

    def outcome(self) -> list[api_pb2.ContainerUpdate] | NRIProtocolError | None:
        self.join(10)
        return self.error if self.error is not None else self.failed


def test_registers_configures_and_serves(session: Session) -> None:
    runtime, handler = session.runtime, session.handler

    pod = api_pb2.PodSandbox(id="p1")
    runtime.call(3, "Synchronize", api_pb2.SynchronizeRequest(pods=[pod], more=True))
    assert runtime.answer(3, "Synchronize", api_pb2.SynchronizeResponse).more
    runtime.call(5, "Synchronize", api_pb2.SynchronizeRequest(
        pods=[api_pb2.PodSandbox(id="p2")], containers=[api_pb2.Container(id="c0")]))
    synced = runtime.answer(5, "Synchronize", api_pb2.SynchronizeResponse)
    assert [u.container_id for u in synced.update] == ["c0"] and not synced.more

    runtime.call(7, "CreateContainer", create(pod, "c1"))
    created = runtime.answer(7, "CreateContainer", api_pb2.CreateContainerResponse)
    assert created.adjust.linux.resources.cpu.cpus == "4-7"

    c1, c2 = api_pb2.Container(id="c1"), api_pb2.Container(id="c2")
    runtime.call(9, "RemoveContainer", api_pb2.RemoveContainerRequest(pod=pod, container=c1))
    runtime.answer(9, "RemoveContainer", api_pb2.RemoveContainerResponse)
    runtime.call(11, "StartContainer", api_pb2.StartContainerRequest(pod=pod, container=c2))
    runtime.answer(11, "StartContainer", api_pb2.StartContainerResponse)
    # What an older runtime sends instead (and what the runtime falls back to).
    removed = api_pb2.StateChangeEvent(event=api_pb2.REMOVE_CONTAINER, pod=pod, container=c2)
    runtime.call(13, "StateChange", removed)
    runtime.answer(13, "StateChange", api_pb2.Empty)
    runtime.call(15, "StateChange", api_pb2.StateChangeEvent(event=api_pb2.STOP_POD_SANDBOX, pod=pod))
    runtime.answer(15, "StateChange", api_pb2.Empty)
    runtime.call(17, "Shutdown", api_pb2.Empty())
    runtime.answer(17, "Shutdown", api_pb2.Empty)

    session.end()
    assert handler.calls == [
        ("configure", "containerd", 2000),
        ("synchronize", ["p1", "p2"], ["c0"]),
        ("create", "p1", "c1"),
        ("remove", "p1", "c1"),
        ("state", api_pb2.START_CONTAINER, "p1", "c2"),
        ("remove", "p1", "c2"),
        ("state", api_pb2.STOP_POD_SANDBOX, "p1", None),
        ("shutdown",),
    ]


def test_answers_what_it_cannot_serve_as_ttrpc_does(session: Session) -> None:
    runtime = session.runtime
    pod = api_pb2.PodSandbox(id="p")

    # Unknown method and service: Unimplemented (12), with ttrpc's texts.
    runtime.call(3, "ValidateContainerAdjustment", api_pb2.ValidateContainerAdjustmentRequest())
    assert runtime.answer_status(3)[:2] == (12, "method ValidateContainerAdjustment")
    runtime.call(5, "Log", api_pb2.Empty(), service="nri.pkg.api.v1alpha1.HostFunctions")
    assert runtime.answer_status(5)[:2] == (12, "service nri.pkg.api.v1alpha1.HostFunctions")
    # A handler that raises fails that request only (Unknown, 2), and the next one is served.
    runtime.call(7, "CreateContainer", create(pod, "bad"))
    assert runtime.answer_status(7)[:2] == (2, "ValueError: no CPUs left")
    # An answer over ttrpc's 4 MiB is replaced by ResourceExhausted (8).
    runtime.call(9, "CreateContainer", create(pod, "huge"))
    code, text, _ = runtime.answer_status(9)
    assert code == 8 and "exceeds" in text
    # Stream ids: even, or not increasing, are refused as ttrpc's server refuses them (3).
    runtime.call(10, "CreateContainer", api_pb2.CreateContainerRequest(pod=pod))
    assert runtime.answer_status(10)[:2] == (3, "StreamID must be odd for client initiated streams")
    runtime.call(9, "CreateContainer", api_pb2.CreateContainerRequest(pod=pod))
    assert runtime.answer_status(9)[:2] == (3, "StreamID cannot be re-used and must increment")
    # Bytes that are not a ttrpc Request, and a data message (NRI is unary only).
    runtime.send_raw(Conn.PLUGIN_SERVICE, 11, MessageType.REQUEST, b"\xff\xff")
    assert runtime.answer_status(11)[0] == 3
    runtime.send_raw(Conn.PLUGIN_SERVICE, 13, MessageType.DATA, b"")
    assert runtime.answer_status(13)[:2] == (3, "StreamID is no longer active")
    # An unknown message type is ignored, as ttrpc's server ignores it; the next request is served.
    runtime.send_raw(Conn.PLUGIN_SERVICE, 15, 9, b"")
    runtime.call(17, "CreateContainer", create(pod, "ok"))
    served_ok = runtime.answer(17, "CreateContainer", api_pb2.CreateContainerResponse)
    assert served_ok.adjust.linux.resources.cpu.cpus == "4-7"
    session.end()


def test_update_containers_from_another_thread(session: Session) -> None:
    runtime, plugin = session.runtime, session.plugin
    update = cpuset_update("c9", "1")
    asking = Asking(plugin, [update])
    stream, request = runtime.expect_call("UpdateContainers", api_pb2.UpdateContainersRequest)
    assert stream == 3  # RegisterPlugin took 1
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in request.update] == [("c9", "1")]
    failed = api_pb2.ContainerUpdate(container_id="c9")
    runtime.reply(stream, api_pb2.UpdateContainersResponse(failed=[failed]))
    assert asking.outcome() == [failed]

    # The runtime refuses: an error status becomes NRIProtocolError with its text.
    asking = Asking(plugin, [update])
    stream, _ = runtime.expect_call("UpdateContainers", api_pb2.UpdateContainersRequest)
    assert stream == 5
    runtime.reply(stream, api_pb2.UpdateContainersResponse(), code=2, text="no such container")
    assert "no such container" in str(asking.outcome())

    # No answer in time: NRIProtocolError; the late answer is dropped, the connection lives on.
    with pytest.raises(NRIProtocolError, match="no answer"):
        plugin.update_containers([update], timeout=0.2)
    stream, _ = runtime.expect_call("UpdateContainers", api_pb2.UpdateContainersRequest)
    runtime.reply(stream, api_pb2.UpdateContainersResponse())
    runtime.call(3, "CreateContainer", api_pb2.CreateContainerRequest(container=api_pb2.Container(id="c")))
    runtime.answer(3, "CreateContainer", api_pb2.CreateContainerResponse)

    session.end()
    with pytest.raises(NRIProtocolError, match="closed"):
        plugin.update_containers([update])


def test_update_containers_inside_a_handler_fails_that_request(pair: tuple[socket.socket, Runtime]) -> None:
    class Reentrant(RecordingHandler):
        def create_container(
            self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
        ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
            session.plugin.update_containers([])
            return None, ()

    session = Session(*pair, Reentrant())
    session.runtime.call(3, "CreateContainer", api_pb2.CreateContainerRequest())
    code, text, _ = session.runtime.answer_status(3)
    assert code == 2 and "serving thread" in text
    session.end()


def test_close_from_another_thread_ends_run_and_waiting_calls(session: Session) -> None:
    asking = Asking(session.plugin, [], timeout=10)
    session.runtime.expect_call("UpdateContainers", api_pb2.UpdateContainersRequest)
    session.plugin.close()
    assert "closed" in str(asking.outcome())
    assert session.served.finished() is None


@pytest.mark.parametrize(("after_register", "tail", "error"), [
    (False, b"", "before registration"),
    # Half of a multiplexer header, then the runtime goes away.
    (True, bytes.fromhex("0000000100"), "middle of a message"),
    # A whole frame that holds half of a ttrpc message.
    (True, bytes.fromhex("00000001" "00000004" "00000010"), "middle of a message"),
    # A length over the cap.
    (True, bytes.fromhex("00000001" "ffffffff"), "exceeds"),
])
def test_a_broken_connection_raises(pair: tuple[socket.socket, Runtime], after_register: bool, tail: bytes,
                                    error: str) -> None:
    sock, runtime = pair
    handler = RecordingHandler()
    served = Served(Plugin(sock, handler, "topolet", "90"))
    if after_register:
        register(runtime)
    else:
        runtime.expect_call("RegisterPlugin", api_pb2.RegisterPluginRequest)
    runtime.sock.sendall(tail)
    runtime.sock.close()
    outcome = served.finished()
    assert isinstance(outcome, NRIProtocolError) and error in str(outcome)


def test_connect_to_a_socket_path() -> None:
    with tempfile.TemporaryDirectory(prefix="nri-") as d:
        path = f"{d}/nri.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        plugin = Plugin.connect(path, RecordingHandler(), "topolet", "90")
        accepted, _ = listener.accept()
        runtime = Runtime(accepted)
        served = Served(plugin)
        register(runtime)
        accepted.close()
        listener.close()
        assert served.finished() is None
        with pytest.raises(FileNotFoundError):
            Plugin.connect(f"{d}/absent.sock", Handler(), "topolet", "90")


@pytest.mark.parametrize(("name", "index"), [
    ("", "90"), ("top olet", "90"), ("topolet/x", "90"),
    ("topolet", "9"), ("topolet", "9a"), ("topolet", "100"),
])
def test_names_the_runtime_would_refuse(name: str, index: str) -> None:
    with pytest.raises(ConfigError):
        check_plugin_identity(name, index)


def test_event_mask_matches_nri() -> None:
    # api/event.go: EventMask.Set sets 1 << (event - 1); ValidEvents is (1 << (LAST - 1)) - 1.
    assert event_mask(api_pb2.RUN_POD_SANDBOX) == 0x1
    assert event_mask(api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_CONTAINER) == 0x8 | 0x80
    every = range(api_pb2.RUN_POD_SANDBOX, api_pb2.LAST)
    assert event_mask(*every) == (1 << (api_pb2.LAST - 1)) - 1 == 0x3FFF
    for bad in (api_pb2.UNKNOWN, api_pb2.LAST):
        with pytest.raises(ValueError):
            event_mask(bad)


def test_cpuset_answers() -> None:
    adjust = cpuset_adjustment("2-3", "0")
    assert (adjust.linux.resources.cpu.cpus, adjust.linux.resources.cpu.mems) == ("2-3", "0")
    # Only what is set goes on the wire, nothing else of the container's resources (api.proto:
    # ContainerAdjustment.linux 6 > LinuxContainerAdjustment.resources 2 > LinuxResources.cpu 2 >
    # LinuxCPU.cpus 6, mems 7).
    assert adjust.SerializeToString() == bytes.fromhex("320c" "120a" "1208" "3203" "322d33" "3a01" "30")
    update = cpuset_update("c1", "5", "")
    assert update.container_id == "c1" and update.linux.resources.cpu.cpus == "5"
    assert not update.linux.resources.cpu.mems

"""The small HTTP server for /metrics and /healthz, bounded whatever its clients do.

`MetricsServer(metrics, "host:port", health)` serves any object with a `registry` (the agent's
`agent.metrics.registry.Metrics`, the admission controller's `AdmissionMetrics`) on /metrics, and
`health()` on /healthz and /readyz; `.start()`, `.stop()`, `.port`.  Its cost is bounded whatever
clients do (see the class).  `staleness_health(metrics, max_age)` is the agent's health: the last
reconcile is recent.
"""

from __future__ import annotations

import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app

from agent.errors import ConfigError
from agent.metrics.listen import parse_listen
from agent.metrics.registry import Metrics

log = logging.getLogger(__name__)


class _Unreachable(ConnectionAbortedError):
    """The client took longer than the server's timeout to take its answer (wsgiref drops these quietly)."""


class _DeadlineWriter:
    """The answer's output: each write must reach the client before `deadline` (monotonic seconds)."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self._conn = conn
        self._deadline = deadline

    def write(self, data: bytes) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _Unreachable("answer timed out")
        self._conn.settimeout(left)  # sendall's timeout bounds the whole call, not each send
        try:
            self._conn.sendall(data)
        except TimeoutError as exc:
            raise _Unreachable("answer timed out") from exc
        return len(data)

    def flush(self) -> None:
        return


class _Exchange(WSGIRequestHandler):
    """One request whose head has been read already: wsgiref parses it and runs the app."""

    def __init__(self, conn: socket.socket, address: Any, server: Any, head: bytes, deadline: float) -> None:
        self._head = head
        self._deadline = deadline
        super().__init__(conn, address, server)

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._head)
        self.wfile = _DeadlineWriter(self.connection, self._deadline)  # type: ignore[assignment]

    def finish(self) -> None:
        """The server closes the connection."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return


@dataclass(slots=True)
class _Pending:
    """A connection still sending its request head."""

    address: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)


Health = Callable[[], tuple[bool, str]]

MAX_CONNECTIONS = 64  # connections held at once (reading, queued or being answered)
ANSWER_THREADS = 2  # requests answered at once: each takes milliseconds
TIMEOUT_SECONDS = 5.0  # to send the request, and again to take the answer
LISTEN_BACKLOG = 128  # the kernel's queue of connections not yet accepted (accepting is quick)
MAX_REQUEST_HEAD = 16 * 1024  # a scrape's request line and headers are a few hundred bytes


class MetricsServer:
    """Serves /metrics (Prometheus text) and /healthz (200 while `health()` says ok, else 503).

    Bounded whatever clients do: one thread reads every connection's request head without blocking,
    and `answer_threads` threads answer complete requests, so an idle or slow connection costs a
    socket, never a thread.  At most `max_connections` are held: a new one pushes out the oldest
    still sending its request (a scraper sends it at once, so idle connections cannot crowd it out),
    and is refused at once when every held one is being answered.  A connection gets
    `timeout_seconds` to send its request head (at most `MAX_REQUEST_HEAD` bytes) and as long again
    to take the answer; one that is late is closed.
    """

    def __init__(self, metrics: Metrics, listen: str, health: Health, *,
                 max_connections: int = MAX_CONNECTIONS, answer_threads: int = ANSWER_THREADS,
                 timeout_seconds: float = TIMEOUT_SECONDS) -> None:
        host, port = parse_listen(listen)
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path in ("/healthz", "/readyz"):
                ok, why = health()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain; charset=utf-8")])
                return [(why or ("ok" if ok else "unhealthy")).encode() + b"\n"]
            if path == "/metrics":
                return metrics_app(environ, start_response)  # type: ignore[no-any-return]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]

        try:
            if ":" in host:  # "[::]" listens on both families where the kernel allows
                self._listener = socket.create_server(
                    (host, port), family=socket.AF_INET6, backlog=LISTEN_BACKLOG,
                    dualstack_ipv6=host == "::" and socket.has_dualstack_ipv6())
            else:
                self._listener = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
        except OSError as exc:  # in use, not this host's address, a name that does not resolve
            why = str(exc.strerror or exc).split(" (while attempting", 1)[0]  # create_server's addition
            raise ConfigError(f"cannot serve /metrics on {listen}: {why}") from exc
        self._listener.setblocking(False)
        self._app = app
        # What wsgiref's request handler reads from its server.
        self.base_environ: dict[str, Any] = {
            "SERVER_NAME": host,
            "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_PORT": str(self.port), "REMOTE_HOST": "",
            "CONTENT_LENGTH": "", "SCRIPT_NAME": "",
        }
        self.max_connections = max_connections
        self.timeout_seconds = timeout_seconds
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()  # oldest first
        self._answers: queue.Queue[tuple[socket.socket, Any, bytes] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._held = 0  # connections held: pending, queued or being answered
        self._stopping = threading.Event()
        self.refused = 0  # connections closed unread: over the bound, or late
        self._threads = [threading.Thread(target=self._read_loop, name="metrics", daemon=True)]
        self._threads += [threading.Thread(target=self._answer_loop, name=f"metrics-answer-{i}", daemon=True)
                          for i in range(answer_threads)]

    def get_app(self) -> Callable[..., Iterable[bytes]]:
        """The WSGI app (wsgiref's request handler asks its server for it)."""
        return self._app

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def held(self) -> int:
        """Connections held now: still sending their request, queued, or being answered."""
        with self._lock:
            return self._held

    @property
    def reading(self) -> int:
        """Connections still sending their request head."""
        return len(self._pending)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for _ in self._threads[1:]:
            self._answers.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=2 * self.timeout_seconds)
        if not self._threads[0].is_alive():
            self._close_all()

    # -- the reading thread ----------------------------------------------------------------------

    def _read_loop(self) -> None:
        sel = self._selector
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                timeout = None
                if self._pending:
                    oldest = next(iter(self._pending.values()))
                    timeout = max(oldest.deadline - time.monotonic(), 0.0)
                for key, _ in sel.select(timeout):
                    sock = key.fileobj
                    if sock is self._listener:
                        self._accept()
                    elif sock is self._wake_r:
                        self._drain_wake()
                    else:
                        assert isinstance(sock, socket.socket)
                        self._read(sock)
                self._expire()
        finally:
            self._close_all()

    def _accept(self) -> None:
        while True:
            try:
                conn, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors and the like: what is held is served first
                if not self._drop_oldest_pending():
                    self._stopping.wait(0.1)  # nothing to let go of: do not spin on the listener
                return
            with self._lock:
                full = self._held >= self.max_connections
            if full and not self._drop_oldest_pending():
                self.refused += 1
                _close(conn)
                continue
            conn.setblocking(False)
            with self._lock:
                self._held += 1
            self._pending[conn] = _Pending(address, time.monotonic() + self.timeout_seconds)
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        pending = self._pending.get(conn)
        if pending is None:
            return
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        start = max(len(pending.head) - 3, 0)
        pending.head += data
        if pending.head.find(b"\r\n\r\n", start) >= 0 or pending.head.find(b"\n\n", start) >= 0:
            self._selector.unregister(conn)
            del self._pending[conn]
            self._answers.put((conn, pending.address, bytes(pending.head)))
        elif len(pending.head) > MAX_REQUEST_HEAD:
            self._drop(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            conn, oldest = next(iter(self._pending.items()))
            if oldest.deadline > now:
                return
            self._drop(conn)

    def _drop_oldest_pending(self) -> bool:
        if not self._pending:
            return False
        self._drop(next(iter(self._pending)))
        return True

    def _drop(self, conn: socket.socket) -> None:
        """Close a connection still sending its request."""
        self._pending.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        self.refused += 1
        _close(conn)
        self._release()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _release(self) -> None:
        with self._lock:
            self._held -= 1

    def _close_all(self) -> None:
        for conn in list(self._pending):
            self._drop(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            _close(sock)
        try:
            self._selector.close()
        except (OSError, ValueError):
            pass

    # -- the answering threads -------------------------------------------------------------------

    def _answer_loop(self) -> None:
        while True:
            item = self._answers.get()
            if item is None:
                return
            conn, address, head = item
            try:
                if not self._stopping.is_set():
                    conn.setblocking(True)
                    _Exchange(conn, address, self, head, time.monotonic() + self.timeout_seconds)
            except OSError:
                pass  # the client went away, or was too slow to take its answer
            except Exception:  # noqa: BLE001 - one bad exchange must not cost the server a thread
                log.exception("metrics request from %s failed", address)
            finally:
                try:
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                _close(conn)
                self._release()


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def staleness_health(metrics: Metrics, max_age_seconds: float) -> Health:
    """Healthy while the last reconcile finished less than `max_age_seconds` ago."""

    def check() -> tuple[bool, str]:
        last = metrics.last_reconcile._value.get()  # noqa: SLF001 - prometheus_client keeps no getter
        if not last:
            return False, "no reconcile yet"
        age = time.time() - last
        return (age <= max_age_seconds, f"last reconcile {age:.1f}s ago")

    return check

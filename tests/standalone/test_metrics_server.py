"""The /metrics + /healthz server (`agent.metrics.server.MetricsServer`) stays bounded whatever clients do:
idle and half-open connections cost no thread, a slow-loris is dropped after the timeout, a flood
beyond the bound is refused at once, and scrapes keep being answered (the agent's metrics and the
admission controller's alike)."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agent.admission.report.metrics import AdmissionMetrics
from agent.metrics.registry import Metrics
from agent.metrics.server import MetricsServer
from tests.standalone.conftest import wait_for


@contextmanager
def serving(health: Callable[[], tuple[bool, str]] = lambda: (True, "fine"), metrics: Any = None,
            **kw: Any) -> Iterator[MetricsServer]:
    server = MetricsServer(metrics if metrics is not None else Metrics(), "127.0.0.1:0", health, **kw)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def server_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("metrics"))


def closed_unanswered(sock: socket.socket, timeout: float = 20.0) -> bool:
    """True when the server closes `sock` without a byte of answer (waits at most `timeout`)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_many_idle_connections_hold_no_threads_and_health_still_answers() -> None:
    before = threading.active_count()
    with serving(max_connections=16, answer_threads=2, timeout_seconds=60.0) as server:
        idle: list[socket.socket] = []
        try:
            for i in range(300):
                s = socket.create_connection(("127.0.0.1", server.port))
                if i % 2:  # half-open requests: a request line and a header, never the blank line
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                idle.append(s)
            wait_for(lambda: server.refused >= 300 - 16, "the oldest idle connections to be pushed out")
            assert server_threads() == 3  # one reader, two answerers: not one per connection
            assert threading.active_count() <= before + 3  # and nothing else of its own
            assert server.held <= 16
            assert get(server.port, "/healthz") == (200, "fine\n")
            status, body = get(server.port, "/metrics")
            assert status == 200 and "topolet_info{" in body
            assert closed_unanswered(idle[0])  # pushed out by the newer ones
        finally:
            for s in idle:
                s.close()
    assert server_threads() == 0  # stop() ends them


def test_a_slow_loris_is_dropped_after_the_timeout() -> None:
    with serving(timeout_seconds=1.0) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
            s.settimeout(0.25)
            sent = 0
            answer = b""
            for _ in range(400):  # a header byte every 0.25 s: each read is quick, the whole is not
                try:
                    answer = s.recv(1024)
                    break  # closed (b"") or answered: either way the server has acted
                except TimeoutError:
                    pass
                except ConnectionResetError:
                    break
                try:
                    s.sendall(b"X")
                    sent += 1
                except (BrokenPipeError, ConnectionResetError):
                    break
            assert answer == b"", "the server answered a request that never ended"
            assert sent < 400, "the slow connection was never dropped"
        assert get(server.port, "/healthz")[0] == 200


def test_connections_beyond_the_bound_are_refused_at_once_while_all_are_answered() -> None:
    gate = threading.Event()

    def slow_health() -> tuple[bool, str]:
        gate.wait(30)
        return True, "fine"

    with serving(slow_health, max_connections=2, answer_threads=1, timeout_seconds=30.0) as server:
        results: list[tuple[int, str]] = []
        clients = [threading.Thread(target=lambda: results.append(get(server.port, "/healthz")))
                   for _ in range(2)]
        for t in clients:
            t.start()
        # Both requests read: one being answered (held in health()), one queued behind it.
        wait_for(lambda: server.held == 2 and not server.reading, "both requests to be read")
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_unanswered(extra)
        gate.set()
        for t in clients:
            t.join(30)
        assert results == [(200, "fine\n")] * 2


def test_an_oversized_request_head_is_dropped() -> None:
    with serving() as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 64 * 1024)
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert closed_unanswered(s)
        assert get(server.port, "/healthz")[0] == 200


def test_health_and_not_found() -> None:
    with serving(lambda: (False, "no reconcile yet")) as server:
        assert get(server.port, "/healthz") == (503, "no reconcile yet\n")
        assert get(server.port, "/readyz") == (503, "no reconcile yet\n")
        assert get(server.port, "/nothing")[0] == 404


def test_serves_the_admission_controllers_metrics() -> None:
    with serving(metrics=AdmissionMetrics()) as server:
        status, body = get(server.port, "/metrics")
        assert status == 200
        assert 'topolet_admission_decisions_total{result="admitted"} 0.0' in body

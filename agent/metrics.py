"""topolet's Prometheus metrics (one registry) and the small HTTP server for /metrics and /healthz.

Names follow Prometheus conventions: `topolet_` prefix, base units, counters end in `_total`, labels
stay bounded (numa, state, result, reason — never pod or process names).  Every labelled counter has
a series from the start for each of its known label values (so `increase()` sees the first event),
no `*_created` series are exported, and the registry carries the process metrics (`process_*`).

Values that live elsewhere are read when scraped, not copied in: `watch_cpus(source)` makes
`topolet_cpus` the engine's CPU states at scrape time, `watch_gpus(source)` makes `topolet_gpus{numa,
state}` (whole GPUs, allocated or free) and `topolet_mig_devices{numa, profile, state}` the GPUs'
per-zone figures the NRT publishes, at scrape time, `watch_mig(source)` exports the MIG applier's
totals (`MIG_APPLY_TOTALS`).  `topolet_info` carries `nodename` (never `node`, which scrape configs
add as a target label).

`MetricsServer(metrics, "host:port", health)` serves any object with a `registry` (the agent's
`Metrics`, the admission controller's `AdmissionMetrics`) on /metrics, and `health()` on /healthz and
/readyz; `.start()`, `.stop()`, `.port`.  Its cost is bounded whatever clients do (see the class).
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent import __version__

log = logging.getLogger(__name__)

MIG_CONFIG_STATES = ("pending", "success", "failed")  # topolet.io/mig.config.state values
PIN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# topolet_allocations_total{result}: a refusal is a request the node cannot or may not satisfy, an
# error a failure of ours or of the system (a cgroup or state write failed).
ALLOCATED, REFUSED, RELEASED, ERROR = "allocated", "refused", "released", "error"
ALLOCATION_RESULTS = (ALLOCATED, REFUSED, RELEASED, ERROR)
# topolet_allocation_refusals_total{reason}: not enough free CPUs (or GPUs); the NUMA or SMT policy
# cannot be met with what is free; the request or the pod's annotations are invalid.
CAPACITY, ALIGNMENT, INVALID = "capacity", "alignment", "invalid"
REFUSAL_REASONS = (CAPACITY, ALIGNMENT, INVALID)
API_WRITE_KINDS = ("nrt", "labels", "event")
CPU_STATES = ("exclusive", "shared", "reserved")
# agent.gpu.applier's operation names (OPERATIONS there; a test keeps the two equal) and results.
MIG_OPERATIONS = ("gpu_instance_create", "gpu_instance_destroy", "compute_instance_create", "mig_mode_change")
MIG_OPERATION_RESULTS = ("success", "error")
# The totals agent.gpu.applier.ApplyCounters keeps (its as_metrics() names), with their help text.
MIG_APPLY_TOTALS = {
    "topolet_mig_instances_created_total": "MIG GPU instances created",
    "topolet_mig_instances_destroyed_total": "MIG GPU instances destroyed",
    "topolet_mig_mode_changes_total": "MIG mode changes of a GPU",
    "topolet_mig_apply_errors_total": "MIG config passes that failed",
}

CPURows = Iterable[tuple[int, str, int]]  # (numa, state, count)
# {numa id (-1: unknown): {resource: (capacity, available)}}: agent.kube.nrt_build.zone_gpus's answer.
GPUZones = Mapping[int, Mapping[str, tuple[int, int]]]
GPU_STATES = ("allocated", "free")
WHOLE_GPU_RESOURCE, MIG_RESOURCE_PREFIX = "nvidia.com/gpu", "nvidia.com/mig-"  # the NRT's names


class _CPUStates(Collector):
    """`topolet_cpus` from the engine's state at scrape time (no rows: no series, e.g. pinning off)."""

    def __init__(self) -> None:
        self.source: Callable[[], CPURows] | None = None

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily("topolet_cpus", _CPUS_HELP, labels=("numa", "state"))]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("topolet_cpus", _CPUS_HELP, labels=("numa", "state"))
        source = self.source
        if source is not None:
            try:
                rows = list(source())
            except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever the state file holds
                log.debug("topolet_cpus not read: %s", exc)
                rows = []
            for numa, state, count in rows:
                family.add_metric((str(numa), state), count)
        return [family]


class _MigTotals(Collector):
    """The MIG applier's totals at scrape time; 0 while no applier exists (no GPU, or no config)."""

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, int] | None] | None = None

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [CounterMetricFamily(name, text) for name, text in MIG_APPLY_TOTALS.items()]

    def collect(self) -> Iterable[CounterMetricFamily]:
        totals = self.source() if self.source is not None else None
        return [CounterMetricFamily(name, text, value=(totals or {}).get(name, 0))
                for name, text in MIG_APPLY_TOTALS.items()]


class _GPUZones(Collector):
    """`topolet_gpus` and `topolet_mig_devices` from the node's GPUs and holds at scrape time (no GPUs
    known: no series)."""

    def __init__(self) -> None:
        self.source: Callable[[], GPUZones] | None = None

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("topolet_gpus", _GPUS_HELP, labels=("numa", "state")),
                GaugeMetricFamily("topolet_mig_devices", _MIG_DEVICES_HELP,
                                  labels=("numa", "profile", "state")))

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        gpus, mig = self._families()
        source = self.source
        zones: GPUZones = {}
        if source is not None:
            try:
                zones = source()
            except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever the state file holds
                log.debug("topolet_gpus not read: %s", exc)
        for numa, resources in sorted(zones.items()):
            for resource, (capacity, available) in sorted(resources.items()):
                counts = zip(GPU_STATES, (capacity - available, available), strict=True)
                if resource == WHOLE_GPU_RESOURCE:
                    for state, count in counts:
                        gpus.add_metric((str(numa), state), count)
                elif resource.startswith(MIG_RESOURCE_PREFIX):
                    profile = resource[len(MIG_RESOURCE_PREFIX):]
                    for state, count in counts:
                        mig.add_metric((str(numa), profile, state), count)
        return [gpus, mig]


_CPUS_HELP = "CPUs by NUMA node and state (exclusive, shared, reserved), read from the state when scraped"
_GPUS_HELP = ("Whole GPUs (not in MIG mode) by NUMA node (-1: unknown) and state (allocated, free), read "
              "when scraped")
_MIG_DEVICES_HELP = ("MIG devices by NUMA node of their GPU, profile (as in nvidia.com/mig-<profile>) and "
                     "state (allocated, free), read when scraped")


def new_registry() -> CollectorRegistry:
    """A registry with the process metrics (RSS, CPU seconds, open fds) and no `*_created` series."""
    # A switch of the client library, for the whole process: set wherever a registry is built, so
    # it holds in the agent and the controller alike.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


class Metrics:
    """Every metric the agent exports, on its own registry (so tests can build several)."""

    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        self.info = Info("topolet", "topolet build and node facts", registry=r)
        self.info.info({"version": __version__})
        self._cpus = _CPUStates()
        r.register(self._cpus)
        self.allocations = Counter("topolet_allocations",
                                   "Exclusive CPU allocations by result: allocated, refused, released, "
                                   "error", ["result"], registry=r)
        self.refusals = Counter("topolet_allocation_refusals",
                                "Refused exclusive CPU requests by reason (capacity, alignment, invalid)",
                                ["reason"], registry=r)
        self.pin_latency = Histogram("topolet_pin_latency_seconds",
                                     "Request to cpuset-and-affinity-applied latency",
                                     buckets=PIN_BUCKETS, registry=r)
        self.drift = Counter("topolet_cgroup_drift", "cpusets found rewritten by someone else and repaired",
                             registry=r)
        self.state_writes = Counter("topolet_state_writes", "State file writes", registry=r)
        self.label_writes = Counter("topolet_label_writes", "features.d label file writes", registry=r)
        self.reconcile_seconds = Histogram("topolet_reconcile_duration_seconds", "One reconcile pass",
                                           registry=r)
        self.last_reconcile = Gauge("topolet_last_reconcile_timestamp_seconds",
                                    "Unix time of the last completed reconcile", registry=r)
        self.reconcile_errors = Counter("topolet_reconcile_errors", "Reconcile passes that failed",
                                        registry=r)
        self.pod_lists = Counter("topolet_pod_lists", "Lists of this node's pods (startup, expired watch)",
                                 registry=r)
        self.pool_writes = Counter("topolet_pool_cgroup_writes",
                                   "Container cgroups given the shared pool outside an allocation change",
                                   registry=r)
        self.api_writes = Counter("topolet_api_writes", "Kubernetes API writes by kind (nrt, labels, event)",
                                  ["kind"], registry=r)
        self.api_write_errors = Counter("topolet_api_write_errors",
                                        "Kubernetes API writes that failed, by kind (nrt, labels, event)",
                                        ["kind"], registry=r)
        self.mig_operations = Counter("topolet_mig_operations",
                                      "MIG changes through NVML by operation and result (success, error)",
                                      ["op", "result"], registry=r)
        self.mig_config_state = Gauge("topolet_mig_config_state",
                                      "1 for the MIG config state now (pending, success, failed), 0 for the "
                                      "others; no series while no MIG config is managed",
                                      ["state"], registry=r)
        self._mig_totals = _MigTotals()
        r.register(self._mig_totals)
        self._gpus = _GPUZones()
        r.register(self._gpus)
        for result in ALLOCATION_RESULTS:
            self.allocations.labels(result=result)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason=reason)
        for kind in API_WRITE_KINDS:
            self.api_writes.labels(kind=kind)
            self.api_write_errors.labels(kind=kind)
        for op in MIG_OPERATIONS:
            for result in MIG_OPERATION_RESULTS:
                self.mig_operations.labels(op=op, result=result)

    def released(self, _alloc_id: str = "") -> None:
        """Count one released allocation (an engine's `on_release`)."""
        self.allocations.labels(result=RELEASED).inc()

    def refused(self, reason: str) -> None:
        """Count one refused allocation and its reason (one of REFUSAL_REASONS)."""
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        self.allocations.labels(result=REFUSED).inc()
        self.refusals.labels(reason=reason).inc()

    def set_node(self, nodename: str, enforcement: bool, **facts: str) -> None:
        """Complete `topolet_info` with this node's name, whether CPUs are enforced, and `facts`."""
        self.info.info({"version": __version__, "nodename": nodename,
                        "enforcement": "on" if enforcement else "off", **facts})

    def watch_cpus(self, source: Callable[[], CPURows] | None) -> None:
        """Serve `topolet_cpus` from `source()` at each scrape (called on the scraping thread)."""
        self._cpus.source = source

    def watch_gpus(self, source: Callable[[], GPUZones] | None) -> None:
        """Serve `topolet_gpus` and `topolet_mig_devices` from `source()` at each scrape (on the
        scraping thread); `source` answers as `agent.kube.nrt_build.zone_gpus` does."""
        self._gpus.source = source

    def watch_mig(self, source: Callable[[], Mapping[str, int] | None] | None) -> None:
        """Serve the MIG applier's totals from `source()` (None: no applier yet, all 0) at each scrape."""
        self._mig_totals.source = source

    def set_mig_config_state(self, state: str | None) -> None:
        """Mark `state` as the MIG config state now (None: no MIG config managed, no series)."""
        if state is None:
            self.mig_config_state.clear()
            return
        # Set in place (no clear first) so a scrape never sees the family empty mid-update.
        for value in MIG_CONFIG_STATES:
            self.mig_config_state.labels(state=value).set(1 if value == state else 0)


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
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
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

        if ":" in host:  # "[::]" listens on both families where the kernel allows
            self._listener = socket.create_server(
                (host, int(port)), family=socket.AF_INET6, backlog=LISTEN_BACKLOG,
                dualstack_ipv6=host == "::" and socket.has_dualstack_ipv6())
        else:
            self._listener = socket.create_server((host, int(port)), backlog=LISTEN_BACKLOG)
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

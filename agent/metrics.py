"""topolet's Prometheus metrics (one registry) and the small HTTP server for /metrics and /healthz.

Names follow Prometheus conventions: `topolet_` prefix, base units, counters end in `_total`, labels
stay bounded (numa, state, result — never pod or process names).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app

from agent import __version__

MIG_CONFIG_STATES = ("pending", "success", "failed")  # topolet.io/mig.config.state values
PIN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Every metric the agent exports, on its own registry (so tests can build several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Info("topolet", "topolet build and node facts", registry=r)
        self.info.info({"version": __version__})
        self.cpus = Gauge("topolet_cpus", "CPUs by NUMA node and state (exclusive, shared, reserved)",
                          ["numa", "state"], registry=r)
        self.allocations = Counter("topolet_allocations", "Exclusive CPU allocation attempts by result",
                                   ["result"], registry=r)
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
        self.mig_operations = Counter("topolet_mig_operations",
                                      "MIG changes through NVML by operation and result (success, error)",
                                      ["op", "result"], registry=r)
        self.mig_config_state = Gauge("topolet_mig_config_state",
                                      "1 for the MIG config state now (pending, success, failed), 0 for the "
                                      "others; no series while no MIG config is managed",
                                      ["state"], registry=r)

    def set_mig_config_state(self, state: str | None) -> None:
        """Mark `state` as the MIG config state now (None: no MIG config managed, no series)."""
        if state is None:
            self.mig_config_state.clear()
            return
        # Set in place (no clear first) so a scrape never sees the family empty mid-update.
        for value in MIG_CONFIG_STATES:
            self.mig_config_state.labels(state=value).set(1 if value == state else 0)

    def set_cpu_states(self, rows: Iterable[tuple[int, str, int]]) -> None:
        """Replace the `topolet_cpus` series with (numa, state, count) rows."""
        self.cpus.clear()
        for numa, state, count in rows:
            self.cpus.labels(numa=str(numa), state=state).set(count)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return


Health = Callable[[], tuple[bool, str]]


class MetricsServer:
    """Serves /metrics (Prometheus text) and /healthz (200 while `health()` says ok, else 503)."""

    def __init__(self, metrics: Metrics, listen: str, health: Health) -> None:
        host, _, port = listen.rpartition(":")
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

        self._server = make_server(host.strip("[]") or "127.0.0.1", int(port), app,
                                   server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def staleness_health(metrics: Metrics, max_age_seconds: float) -> Health:
    """Healthy while the last reconcile finished less than `max_age_seconds` ago."""

    def check() -> tuple[bool, str]:
        last = metrics.last_reconcile._value.get()  # noqa: SLF001 - prometheus_client keeps no getter
        if not last:
            return False, "no reconcile yet"
        age = time.time() - last
        return (age <= max_age_seconds, f"last reconcile {age:.1f}s ago")

    return check

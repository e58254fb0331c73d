"""`topolet controller`: the sub-command around `agent.admission.controller.loop.Controller`.

Public API: `run_controller(args)` (`agent.cli` imports this module only when the sub-command runs).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import replace

from agent.admission.controller.loop import LEASE_NAME, Controller, ControllerConfig
from agent.admission.controller.writes import CRASH_ENV, WRITERS
from agent.admission.jobs.queues import parse_queues
from agent.admission.kueue.check import kueue_served
from agent.admission.report.metrics import AdmissionMetrics
from agent.kubeapi.access import check_access
from agent.kubeapi.client import KubeClient, agent_namespace, load_api_client, resource_path
from agent.kubeapi.leader import LeaderElector
from agent.metrics.server import MetricsServer

log = logging.getLogger(__name__)


def _kueue_mode(kube: KubeClient, mode: str) -> bool:
    """Whether to run the Kueue AdmissionCheck (`--kueue`): auto turns it on when Kueue's v1beta2 is
    served and we may read it (else its reflectors would never sync and hold up every pass).  Asked
    after `check_access`, so a refusal here is about Kueue's objects alone."""
    if mode != "auto":
        return mode == "on"
    served = kueue_served(kube)
    if served is None:
        log.warning("Kueue's API is served but this controller may not read AdmissionChecks: the "
                    "topolet.io/topology-fit check stays off (apply daemonset/components/kueue)")
    return served is True


def run_controller(args: argparse.Namespace) -> int:
    """`topolet controller`: serve metrics, elect a leader if asked, and run until SIGTERM/SIGINT."""
    if args.crash_at:
        os.environ[CRASH_ENV] = args.crash_at
    config = ControllerConfig(namespace=agent_namespace(args.namespace),
                              queues=parse_queues(args.queue or []),
                              resync_seconds=args.resync_seconds,
                              ledger_timeout_seconds=args.ledger_timeout_seconds,
                              identity=args.identity or os.environ.get("POD_NAME", ""))
    metrics = AdmissionMetrics()
    max_age = max(3 * config.resync_seconds, 30.0)

    def health() -> tuple[bool, str]:
        last = metrics.last_pass._value.get()  # noqa: SLF001 - prometheus_client keeps no getter
        if not last:
            return False, "no pass yet"
        age = time.time() - last
        return age <= max_age, f"last pass {age:.1f}s ago"

    # Bound first: a port in use is said before the API is asked anything (started once it decides).
    server = MetricsServer(metrics, args.listen, health)  # type: ignore[arg-type]
    api = load_api_client(args.kubeconfig)
    # Six watches, the Lease and the two write pools each hold a connection at once: a pool smaller than
    # that discards connections and pays a TLS handshake on most writes.
    api.configuration.connection_pool_maxsize = 2 * WRITERS + 16
    api.rest_client = type(api.rest_client)(api.configuration)
    kube = KubeClient(api)
    # Before anything that could blame Kueue: an API server not reached, credentials refused, or no RBAC
    # for the Jobs every pass reads is said as such, and the controller exits.
    check_access(kube, [(resource_path("batch", "v1", "jobs"), "list Jobs")])
    config = replace(config, kueue=_kueue_mode(kube, args.kueue))
    stop = threading.Event()
    leader = None
    identity = config.identity or f"{socket.gethostname()}-{os.getpid()}"
    if args.leader_elect:
        leader = LeaderElector(kube, config.namespace, LEASE_NAME, identity,
                               lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                               retry_period=args.retry_period)
    controller = Controller(kube, replace(config, identity=identity), metrics, leader)
    server.start()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()
        controller.changed.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def on_change(leading: bool) -> None:
        metrics.leader.set(1 if leading else 0)
        controller.changed.set()

    if leader is not None:
        leader.start(stop, on_change)
    else:
        metrics.leader.set(1)
    controller.start()
    log.info("topolet controller %s: namespace %s, metrics on %s, Kueue check %s", identity,
             config.namespace, args.listen, "on" if config.kueue else "off")
    # The queues said once, in full: a Job naming any other, or one not open to its namespace, is refused.
    log.info("queues%s: %s", "" if args.queue else " (no --queue given: the built-in one)",
             "; ".join(q.describe() for q in config.queues.values()))
    try:
        controller.run(stop)
    finally:
        controller.stop()
        if leader is not None:
            leader.join(timeout=5)
            leader.release()
        server.stop()
        kube.close()
    return 0

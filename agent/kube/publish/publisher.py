"""The publisher thread of the Kubernetes agent: NRT on state change, labels on topology change, Events.

`Publisher` writes what the enforcer changed, retrying with the API loops' back-off while the API is
down; it leaves an NRT another manager publishes alone (and says so once), re-reads the Node's MIG
layout label where MIG is managed, and counts `topolet_api_writes_total{kind}` and
`topolet_api_write_errors_total{kind}` (README.md, "The publisher thread").
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agent.api.podplan import PodPlan, PodWarning
from agent.config import PublisherConfig
from agent.errors import TopoletError
from agent.kube.mig.status import MigStatus
from agent.kube.publish.nrt_build import Snapshot, build_nrt
from agent.kubeapi.backoff import Outage
from agent.labels import build_labels
from agent.metrics.registry import Metrics

if TYPE_CHECKING:
    from agent.gpu.model import GPU
    from agent.kubeapi.client import KubeClient

log = logging.getLogger("topolet.kube")


class Publisher:
    """Writes to the API on its own thread: NRT on state change, labels on topology change, Events."""

    def __init__(self, api: KubeClient, node: str, config: PublisherConfig, metrics: Metrics,
                 snapshot: Callable[[], Snapshot], gpus: Sequence[GPU] = (), *, namespace: str,
                 mig: MigStatus | None = None, on_mig_change: Callable[[], None] | None = None) -> None:
        """`namespace`: the agent's own (its NodeFeature's).  Reads nothing and asks the API nothing
        until `start()` or `publish_once()`."""
        from agent.kube.publish.events import EventRecorder
        from agent.kube.publish.labels_sink import LabelPublisher
        from agent.kube.publish.nrt_publisher import NRTPublisher

        self.node = node
        self.api = api
        self._node_ref: tuple[str, str] | None = None
        self.gpus = tuple(gpus)  # discovered once at start: the NRT's GPU capacity
        self.config = config
        self.metrics = metrics
        self.snapshot = snapshot
        # With MIG managed the Node is read again every `config.node_poll_seconds` (its layout label
        # may change); otherwise once, for the NRT's owner reference.
        self.mig = mig
        self.on_mig_change = on_mig_change
        self._next_node_read = 0.0
        self._mig_changed = False  # the Node asks for another MIG layout: the enforcer is told
        self.labels = LabelPublisher(api, node, namespace, sink=config.label_sink,
                                     features_dir=config.features_dir)
        self.nrt = NRTPublisher(api, node)
        self.events = EventRecorder(api, node, component="topolet")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._warnings: queue.Queue[tuple[PodPlan, PodWarning]] = queue.Queue(maxsize=1000)
        self._node_events: queue.Queue[tuple[str, str, str]] = queue.Queue(maxsize=100)
        self._published_nrt: str | None = None  # fingerprint of the last NRT written
        self._published_labels: dict[str, str] | None = None
        self._nrt_owner = ""  # the other publisher this node's NRT was last seen to be left to
        self.failing_since: float | None = None
        self.problems: list[str] = []  # what the last publish_once could not do
        self.outage = Outage(f"publishing for node {node}", log)
        self.caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def notify(self) -> None:
        """Something may have changed: compare and publish soon."""
        self.caught_up.clear()
        self._wake.set()

    def warn(self, plan: PodPlan, w: PodWarning) -> None:
        try:
            self._warnings.put_nowait((plan, w))
        except queue.Full:
            log.warning("event queue full: dropping %s for %s/%s", w.reason, plan.namespace, plan.name)
        self._wake.set()

    def node_event(self, kind: str, reason: str, message: str) -> None:
        """An Event ("Normal" or "Warning") on this node's Node, written on the publisher's thread."""
        try:
            self._node_events.put_nowait((kind, reason, message))
        except queue.Full:
            log.warning("event queue full: dropping %s for node %s", reason, self.node)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = self.publish_once()
            if ok:
                self.failing_since = None
                self.outage.recovered()
                self.caught_up.set()
                wait = None if self.mig is None else max(self._next_node_read - time.monotonic(), 0.0)
                if self.nrt.yielded_to:  # look again whether the other publisher's NRT is still there
                    wait = self.nrt.verify_seconds if wait is None else min(wait, self.nrt.verify_seconds)
                check = self.labels.next_check_in()  # --label-sink auto: look again where labels go
                if check is not None:
                    wait = check if wait is None else min(wait, check)
                self._wake.wait(wait)
            else:
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self._wake.wait(self.outage.failed("; ".join(self.problems)))
            self._wake.clear()

    def publish_once(self) -> bool:
        """Publish whatever differs from what was last written; False if anything failed (`problems`
        then says what; the caller logs it)."""
        ok = True
        self.problems = []
        if self.mig is not None and time.monotonic() >= self._next_node_read:
            try:
                self._read_node()
                self._next_node_read = time.monotonic() + self.config.node_poll_seconds
            except Exception as exc:  # noqa: BLE001 - the API may fail in any way; retried
                ok = False
                self.problems.append(f"Node {self.node} not read: {exc}")
        snap = self.snapshot()
        try:
            labels = build_labels(snap.topology, gfd_compat=self.config.gfd_compat)
            if self.mig is not None:
                labels.update(self.mig.labels())
            if labels != self._published_labels or self.labels.next_check_in() == 0:
                if self.labels.publish(labels):
                    self.metrics.api_writes.labels(kind="labels").inc()
                self._published_labels = labels
            if self.mig is not None and self.mig.released != self.mig.desired:
                self.mig.released = self.mig.desired  # its state label is on the Node now
                self._mig_changed = True
        except Exception as exc:  # noqa: BLE001 - the API may fail in any way; retried
            ok = False
            self.metrics.api_write_errors.labels(kind="labels").inc()
            self.problems.append(f"labels not published: {exc}")
        try:
            obj = self._nrt_object(snap)
            digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
            if digest != self._published_nrt or self.nrt.yielded_to:
                if self.nrt.publish(obj):
                    self.metrics.api_writes.labels(kind="nrt").inc()
                    log.info("NodeResourceTopology %s written", self.node)
                self._published_nrt = digest
                self._note_nrt_owner()
        except Exception as exc:  # noqa: BLE001
            ok = False
            self.metrics.api_write_errors.labels(kind="nrt").inc()
            self.problems.append(f"NodeResourceTopology not published: {exc}")
        while True:
            try:
                plan, w = self._warnings.get_nowait()
            except queue.Empty:
                break
            failures = self.events.failures
            try:
                # Best effort (the recorder logs and counts its own failures): a lost Event never
                # holds back the NRT behind it.
                if self.events.warn(_pod_ref(plan), w.reason, w.message):
                    self.metrics.api_writes.labels(kind="event").inc()
                elif self.events.failures != failures:
                    self.metrics.api_write_errors.labels(kind="event").inc()
            except TopoletError as exc:
                self.metrics.api_write_errors.labels(kind="event").inc()
                log.warning("event not recorded: %s", exc)
        while True:
            try:
                kind, reason, message = self._node_events.get_nowait()
            except queue.Empty:
                break
            failures = self.events.failures
            uid = self._node_ref[1] if self._node_ref is not None else ""
            if self.events.on_node(kind, reason, message, uid):
                self.metrics.api_writes.labels(kind="event").inc()
            elif self.events.failures != failures:
                self.metrics.api_write_errors.labels(kind="event").inc()
        if self._mig_changed:
            self._mig_changed = False
            if self.on_mig_change is not None:
                # After the labels, so that "pending" is on its way before the change starts.
                self.on_mig_change()
        return ok

    def _note_nrt_owner(self) -> None:
        """Say once (log, Event, `topolet_nrt_yielded`) that another manager owns this node's NRT."""
        owner = self.nrt.yielded_to
        if owner == self._nrt_owner:
            return
        self._nrt_owner = owner
        self.metrics.nrt_yielded.set(1 if owner else 0)
        if owner:
            self.node_event("Warning", "NodeResourceTopologyOwnedElsewhere",
                            f"NodeResourceTopology {self.node} is published by {owner}: topolet leaves "
                            "it alone and keeps publishing labels (delete the object or stop the other "
                            "publisher for topolet's)")

    def _read_node(self) -> None:
        """Read this node's Node: its uid (the NRT's owner) and, with MIG managed, its layout label."""
        from agent.kubeapi.client import resource_path

        node = self.api.get(resource_path("", "v1", "nodes", self.node), what=f"get node {self.node}")
        found = node.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        self._node_ref = (self.node, str(meta.get("uid") or ""))
        labels = meta.get("labels")
        if self.mig is not None:  # a new layout reaches the enforcer once its state label is published
            self.mig.node_labels({str(k): str(v) for k, v in labels.items()}
                                 if isinstance(labels, dict) else {})

    def _nrt_object(self, snap: Snapshot) -> dict[str, Any]:
        if self._node_ref is None:  # the owner reference needs the Node's uid
            self._read_node()
        if self._node_ref is None:  # _read_node sets it or raises
            raise TopoletError(f"Node {self.node} not read")
        return build_nrt(self._node_ref, snap.topology, snap.state, snap.pinned, self.gpus,
                         snap.assigned_gpus, memory=snap.memory, mig=snap.mig, route=snap.route,
                         kubelet_cpus=snap.kubelet_cpus, offered_devices=snap.offered_devices,
                         held_devices=snap.held_devices, reserved=snap.reserved,
                         scope=self.config.numa_scope)


def _pod_ref(plan: PodPlan) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": plan.name, "namespace": plan.namespace, "uid": plan.uid}}


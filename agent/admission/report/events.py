"""Events from `topolet.io/controller` on the objects it decides (Jobs; Kueue Workloads), sent off the pass.

Public API: `ObjectEvents(kube, instance, involved=("batch/v1", "Job"), on_drop=..., capacity=...)`
with `.record(obj, type, reason, message, involved=None)` (`involved=POD`: an Event on a pod, such as
one whose requests cannot be read), `.start()`, `.stop(timeout)`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from agent.api.objects import as_dict, metadata_of
from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient, resource_path

log = logging.getLogger(__name__)

COMPONENT = "topolet.io/controller"
POD = ("v1", "Pod")  # `involved` of an Event on a pod
EVENT_QUEUE = 10_000  # Events waiting to be sent before new ones are dropped


def timestamp(seconds: float) -> str:
    """`seconds` since the epoch as the API's second-resolution UTC time."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ObjectEvents:
    """core/v1 Events from `topolet.io/controller` on one kind of object (`involved`: apiVersion, kind),
    sent by one thread the pass never waits on.

    Best effort: `record` only queues the Event; when the queue already holds `capacity` Events the new
    one is dropped and counted (`on_drop`), and a failed write is logged."""

    def __init__(self, kube: KubeClient, instance: str, involved: tuple[str, str] = ("batch/v1", "Job"),
                 on_drop: Callable[[], None] = lambda: None,
                 capacity: int = EVENT_QUEUE) -> None:
        self.kube = kube
        self.instance = instance
        self.involved = involved
        self.on_drop = on_drop
        self.writes = 0
        self.failures = 0
        self.dropped = 0
        # None is the stop sign, queued behind the Events already there so they are sent first.
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(capacity)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="admission-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued (for at most `timeout` seconds), then end the thread."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("event queue still full after %.0f s; %d Events not sent",
                        timeout, self._queue.qsize())
            return
        self._thread.join(timeout)
        self._thread = None

    def record(self, obj: Mapping[str, Any], kind: str, reason: str, message: str,
               involved: tuple[str, str] | None = None) -> None:
        """Queue an Event of type `kind` (Normal, Warning) on `obj`, an object of this instance's kind
        unless `involved` (apiVersion, kind) names another (`POD`); never blocks."""
        m = metadata_of(obj)
        ns, name = str(m.get("namespace")), str(m.get("name"))
        stamp = timestamp(time.time())
        api_version, what = involved or self.involved
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {"apiVersion": api_version, "kind": what, "namespace": ns,
                               "name": name, "uid": m.get("uid"),
                               "resourceVersion": m.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": kind,
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": self.instance, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.dropped += 1
            self.on_drop()
            log.warning("event queue full: %s on %s %s/%s dropped", reason, what, ns, name)

    def _run(self) -> None:
        while (body := self._queue.get()) is not None:
            self._send(body)

    def _send(self, body: Mapping[str, Any]) -> None:
        involved = as_dict(body.get("involvedObject"))
        ns, name, what = str(involved.get("namespace")), str(involved.get("name")), involved.get("kind")
        try:
            self.kube.create(resource_path("", "v1", "events", namespace=ns), body,
                             what=f"create Event on {what} {ns}/{name}")
            self.writes += 1
        except KubeAPIError as exc:
            self.failures += 1
            log.warning("event %s on %s %s/%s not recorded: %s", body.get("reason"), what, ns, name, exc)


# -- the controller ---------------------------------------------------------------------------------


class ToldReasons:
    """The reason each object was last told in a Waiting Event, so a reason is told once while it holds.

    Thread-safe; bounded by `retain`, which the caller runs with the uids still queued.
    """

    def __init__(self) -> None:
        self._told: dict[str, str] = {}
        self._lock = threading.Lock()

    def changed(self, uid: str, reason: str) -> bool:
        """Record `reason` for `uid`; True when it differs from the one last told (tell it now)."""
        with self._lock:
            if self._told.get(uid) == reason:
                return False
            self._told[uid] = reason
            return True

    def forget(self, uid: str) -> None:
        with self._lock:
            self._told.pop(uid, None)

    def retain(self, uids: set[str]) -> None:
        """Forget every object not among `uids`."""
        with self._lock:
            self._told = {uid: why for uid, why in self._told.items() if uid in uids}

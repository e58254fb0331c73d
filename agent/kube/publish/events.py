"""Kubernetes Events on pods (a bad annotation, a pod left in the shared pool), aggregated so they never spam.

`EventRecorder(api_client, node_name, *, interval_seconds=300.0, max_tracked=4096, ...)`:
`.warn(pod, reason, message)`, `.normal(...)`, `.on_node(kind, reason, message)`; counters `.writes`,
`.aggregated`, `.failures`.  Best effort: an API failure is logged and counted, never raised.
Repeats within the interval are only counted; the next one updates the Event's `series`.
Aggregation and the reporting identity: README.md here, "Events".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.errors import ConfigError, KubeAPIError
from agent.kubeapi.client import KubeClient, resource_path

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024  # the API server refuses an events.k8s.io note longer than 1 kB
REPORTING_CONTROLLER = "topolet.io/agent"
ACTION = "Reconcile"  # what the agent was doing: reconciling the pod's CPUs with its annotations
_REASON_RE = re.compile(r"[A-Za-z][A-Za-z0-9]{0,127}")  # UpperCamelCase by convention
_EVENTS_GROUP, _EVENTS_VERSION = "events.k8s.io", "v1"
NODE_EVENT_NAMESPACE = "default"  # where the kubelet and kubectl look for a Node's Events


@dataclass
class _Record:
    event: str  # the Event's name
    namespace: str
    count: int  # occurrences, written or not
    written_count: int  # the count the API holds
    written_at: float


@dataclass(frozen=True)
class _PodRef:
    namespace: str  # the Event's; a Pod's own
    name: str
    uid: str
    kind: str = "Pod"  # or "Node" (cluster-scoped: the Event goes to NODE_EVENT_NAMESPACE)


def _pod_ref(pod: object) -> _PodRef:
    if isinstance(pod, Mapping):
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    else:
        meta = getattr(pod, "metadata", None)
        ns, name, uid = (getattr(meta, "namespace", None), getattr(meta, "name", None),
                         getattr(meta, "uid", None))
    if not isinstance(ns, str) or not ns or not isinstance(name, str) or not name:
        raise ConfigError("an Event needs a pod with a namespace and a name")
    return _PodRef(ns, name, uid if isinstance(uid, str) else "")


def _micro_time(seconds: float) -> str:
    """An RFC 3339 time with microseconds, as events.k8s.io's eventTime and lastObservedTime want."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _cut(message: str) -> str:
    """`message` cut to MAX_MESSAGE bytes of UTF-8 (the API server counts bytes), whole characters."""
    return message.encode()[:MAX_MESSAGE].decode(errors="ignore")


class EventRecorder:
    """Creates aggregated events.k8s.io/v1 Events on pods for this node's agent."""

    def __init__(self, api_client: Any, node_name: str, *, component: str = "topolet",
                 interval_seconds: float = 300.0, max_tracked: int = 4096,
                 clock: Callable[[], float] = time.time) -> None:
        if not component:
            raise ConfigError("an event recorder needs a component name")
        self.kube = KubeClient.of(api_client)  # an ApiClient or a KubeClient
        self.node_name = node_name
        self.component = component
        self.interval_seconds = interval_seconds
        self.max_tracked = max_tracked
        self._clock = clock
        self._records: OrderedDict[tuple[str, ...], _Record] = OrderedDict()
        self._lock = threading.Lock()
        self.writes = 0
        self.aggregated = 0
        self.failures = 0

    def warn(self, pod: object, reason: str, message: str) -> bool:
        """A Warning Event on `pod`; True when written to the API."""
        return self._record(pod, "Warning", reason, message)

    def normal(self, pod: object, reason: str, message: str) -> bool:
        """A Normal Event on `pod`; True when written to the API."""
        return self._record(pod, "Normal", reason, message)

    def on_node(self, kind: str, reason: str, message: str, uid: str = "") -> bool:
        """A `kind` ("Normal" or "Warning") Event on this node's Node; True when written to the API."""
        if kind not in ("Normal", "Warning"):
            raise ConfigError(f"invalid event type {kind!r}")
        return self._record(_PodRef(NODE_EVENT_NAMESPACE, self.node_name, uid, "Node"), kind, reason,
                            message)

    def _record(self, pod: object, kind: str, reason: str, message: str) -> bool:
        if not _REASON_RE.fullmatch(reason):
            raise ConfigError(f"invalid event reason {reason!r}")
        ref = pod if isinstance(pod, _PodRef) else _pod_ref(pod)
        message = _cut(message)
        key = (ref.kind, ref.namespace, ref.name, ref.uid, kind, reason, message)
        with self._lock:
            now = self._clock()
            rec = self._records.get(key)
            if rec is not None:
                self._records.move_to_end(key)
                rec.count += 1
                if now - rec.written_at < self.interval_seconds:
                    self.aggregated += 1
                    return False
            try:
                if rec is not None and self._bump(rec, now):
                    pass
                else:
                    count = rec.count if rec is not None else 1
                    rec = self._create(ref, kind, reason, message, count, now)
                    self._records[key] = rec
                    while len(self._records) > self.max_tracked:
                        self._records.popitem(last=False)
            except KubeAPIError as exc:
                self.failures += 1
                log.warning("event %s on %s %s/%s not recorded: %s", reason, ref.kind.lower(),
                            ref.namespace, ref.name, exc)
                return False
            self.writes += 1
            return True

    def _create(self, ref: _PodRef, kind: str, reason: str, message: str, count: int,
                now: float) -> _Record:
        # kubelet's naming: the object's name and a nanosecond stamp in hex (unique per recorder).
        name = f"{ref.name[:200]}.{int(now * 1e9):x}"
        regarding = {"apiVersion": "v1", "kind": ref.kind, "name": ref.name}
        if ref.kind == "Pod":
            regarding["namespace"] = ref.namespace
        if ref.uid:
            regarding["uid"] = ref.uid
        body: dict[str, Any] = {
            "apiVersion": f"{_EVENTS_GROUP}/{_EVENTS_VERSION}",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "eventTime": _micro_time(now),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.node_name,
            "action": ACTION,
            "regarding": regarding,
            "reason": reason,
            "note": message,
            "type": kind,
        }
        if count > 1:  # an expired Event written again keeps the occurrences counted so far
            body["series"] = {"count": count, "lastObservedTime": _micro_time(now)}
        self.kube.create(resource_path(_EVENTS_GROUP, _EVENTS_VERSION, "events", namespace=ref.namespace),
                         body, what=f"create Event {ref.namespace}/{name}")
        return _Record(event=name, namespace=ref.namespace, count=count, written_count=count,
                       written_at=now)

    def _bump(self, rec: _Record, now: float) -> bool:
        """Write the new count onto the existing Event's series; False when it has expired."""
        patch = {"series": {"count": rec.count, "lastObservedTime": _micro_time(now)}}
        try:
            path = resource_path(_EVENTS_GROUP, _EVENTS_VERSION, "events", rec.event, namespace=rec.namespace)
            self.kube.patch(path, patch, "application/merge-patch+json",
                            what=f"update Event {rec.namespace}/{rec.event}")
        except KubeAPIError as exc:
            if exc.not_found:
                return False
            raise
        rec.written_count = rec.count
        rec.written_at = now
        return True

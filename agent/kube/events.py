"""Kubernetes Events on pods (a bad annotation, a pod left in the shared pool), aggregated so they never spam.

Public API (stable; the in-cluster daemon builds on it):

- `EventRecorder(api_client, node_name, *, component="topolet", interval_seconds=300.0,
  max_tracked=4096, clock=time.time)`.
- `.warn(pod, reason, message) -> bool` / `.normal(pod, reason, message) -> bool`: record a core/v1
  Event (type Warning / Normal) on `pod` — a dict as the API returns it or a kubernetes V1Pod, with
  metadata namespace, name and uid.  True when it wrote to the API.  Best effort: an API failure is
  logged and counted (`.failures`), never raised, so a missing Event cannot stop enforcement.
  Raises ConfigError only for a pod without namespace/name or an invalid reason.
- `.writes` / `.aggregated` / `.failures`: counters.

Aggregation, in the spirit of client-go's event correlator: the same (pod uid, type, reason,
message) within `interval_seconds` of our last write for it is only counted locally; the next one
after the interval updates the existing Event's `count` and `lastTimestamp` (one PATCH) instead of
creating another.  When that Event has expired (the API server drops Events after an hour), a new
one is created.  At most `max_tracked` keys are remembered, least recently seen dropped first.
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
from agent.kube.client import KubeClient, resource_path

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024  # core/v1 Event messages are cut to this by kubelet's recorder too
_REASON_RE = re.compile(r"[A-Za-z][A-Za-z0-9]{0,127}")  # UpperCamelCase by convention


@dataclass
class _Record:
    event: str  # the Event's name
    namespace: str
    count: int  # occurrences, written or not
    written_count: int  # the count the API holds
    written_at: float


@dataclass(frozen=True)
class _PodRef:
    namespace: str
    name: str
    uid: str


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


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Creates aggregated core/v1 Events on pods for this node's agent."""

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

    def _record(self, pod: object, kind: str, reason: str, message: str) -> bool:
        if not _REASON_RE.fullmatch(reason):
            raise ConfigError(f"invalid event reason {reason!r}")
        ref = _pod_ref(pod)
        message = message[:MAX_MESSAGE]
        key = (ref.namespace, ref.name, ref.uid, kind, reason, message)
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
                log.warning("event %s on pod %s/%s not recorded: %s", reason, ref.namespace, ref.name, exc)
                return False
            self.writes += 1
            return True

    def _create(self, ref: _PodRef, kind: str, reason: str, message: str, count: int,
                now: float) -> _Record:
        # kubelet's naming: the object's name and a nanosecond stamp in hex (unique per recorder).
        name = f"{ref.name[:200]}.{int(now * 1e9):x}"
        stamp = _timestamp(int(now))
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": ref.namespace, "name": ref.name}
        if ref.uid:
            involved["uid"] = ref.uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": self.component, "host": self.node_name},
            "reportingComponent": self.component,
            "reportingInstance": self.node_name,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": count,
        }
        self.kube.create(resource_path("", "v1", "events", namespace=ref.namespace), body,
                         what=f"create Event {ref.namespace}/{name}")
        return _Record(event=name, namespace=ref.namespace, count=count, written_count=count,
                       written_at=now)

    def _bump(self, rec: _Record, now: float) -> bool:
        """Write the new count onto the existing Event; False when it has expired."""
        patch = {"count": rec.count, "lastTimestamp": _timestamp(now)}
        try:
            self.kube.patch(resource_path("", "v1", "events", rec.event, namespace=rec.namespace), patch,
                            "application/merge-patch+json", what=f"update Event {rec.namespace}/{rec.event}")
        except KubeAPIError as exc:
            if exc.not_found:
                return False
            raise
        rec.written_count = rec.count
        rec.written_at = now
        return True

"""Leader election through a `coordination.k8s.io/v1` Lease, so that of several replicas one decides.

`LeaderElector(api_client, namespace, name, identity, *, lease_duration=15.0, renew_deadline=10.0,
retry_period=2.0, ...)`: `.try_acquire_or_renew()`, `.is_leader`, `.run(stop, on_change)`,
`.start(...)`, `.release()`; `NotLeader`.  The rule: `.is_leader` is True only while the last
renewal is younger than `renew_deadline`, and expiry is measured on our own monotonic clock, never
against the holder's `renewTime`.  agent/kubeapi/README.md, "Leader election".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agent.api.objects import as_dict
from agent.errors import ConfigError, KubeAPIError
from agent.kubeapi.backoff import Outage
from agent.kubeapi.client import KubeClient, resource_path

log = logging.getLogger(__name__)


def _micro_time(seconds: float) -> str:
    """A metav1.MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NotLeader(Exception):
    """This replica stopped leading in the middle of its work: write nothing more."""


class LeaderElector:
    """Holds (or waits for) one Lease; see README.md beside this module."""

    def __init__(self, api_client: Any, namespace: str, name: str, identity: str, *,
                 lease_duration: float = 15.0, renew_deadline: float = 10.0, retry_period: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not identity:
            raise ConfigError("leader election needs an identity")
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ConfigError("leader election wants 0 < retry period < renew deadline < lease duration "
                              f"(got {retry_period}, {renew_deadline}, {lease_duration})")
        self.kube = KubeClient.of(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._wall = wall
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # our clock at our last successful renewal
        self._lock = threading.Lock()
        self.outage = Outage(f"leader election {namespace}/{name}", log, clock=clock)
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return resource_path("coordination.k8s.io", "v1", "leases", self.name, namespace=self.namespace)

    @property
    def is_leader(self) -> bool:
        with self._lock:
            return self._renewed_at is not None and self._clock() - self._renewed_at < self.renew_deadline

    def _spec(self, transitions: int, acquired: str | None) -> dict[str, Any]:
        now = _micro_time(self._wall())
        return {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.lease_duration)),
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> bool:
        """One election round; True when we hold the Lease afterwards."""
        try:
            held = self._round()
            self.outage.recovered()
        except KubeAPIError as exc:
            self.outage.failed(exc)  # the delay is not ours to choose: the Lease's timing is
            held = False
        with self._lock:
            if held:
                self._renewed_at = self._clock()
            elif self._renewed_at is not None and self._clock() - self._renewed_at >= self.renew_deadline:
                self._renewed_at = None
        return held

    def _round(self) -> bool:
        now = self._clock()
        try:
            lease = self.kube.get(self.path, what=f"get Lease {self.namespace}/{self.name}")
        except KubeAPIError as exc:
            if not exc.not_found:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(0, None)}
            try:
                collection = resource_path("coordination.k8s.io", "v1", "leases", namespace=self.namespace)
                self.kube.create(collection, body, what=f"create Lease {self.namespace}/{self.name}")
            except KubeAPIError as exc2:
                if exc2.status == 409:  # another replica created it first
                    return False
                raise
            log.info("leader election: %s acquired new Lease %s/%s", self.identity, self.namespace, self.name)
            return True
        spec = as_dict(lease.get("spec"))
        meta = as_dict(lease.get("metadata"))
        holder = str(spec.get("holderIdentity") or "")
        seen = (holder, str(spec.get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        duration = spec.get("leaseDurationSeconds")
        duration = float(duration) if isinstance(duration, int) and duration > 0 else self.lease_duration
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # held by a live replica
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        if holder == self.identity:
            new_spec = self._spec(transitions, spec.get("acquireTime") if isinstance(
                spec.get("acquireTime"), str) else None)
        else:
            new_spec = self._spec(transitions + 1, None)
        body = {**lease, "spec": new_spec}
        try:
            # PUT with the resourceVersion we read: a replica that wrote in between makes it fail (409).
            updated = self.kube.request("PUT", self.path, body=body, content_type="application/json",
                                        what=f"update Lease {self.namespace}/{self.name}")
        except KubeAPIError as exc:
            if exc.status == 409:
                return False
            raise
        umeta = as_dict(updated.get("metadata"))
        self._observed = (self.identity, new_spec["renewTime"], str(umeta.get("resourceVersion") or ""))
        self._observed_at = now
        if holder != self.identity:
            log.info("leader election: %s took over Lease %s/%s from %r", self.identity, self.namespace,
                     self.name, holder)
        return True

    def release(self) -> None:
        """Clear the holder if it is us (best effort), and stop leading at once."""
        with self._lock:
            self._renewed_at = None
        try:
            lease = self.kube.get(self.path, what=f"get Lease {self.namespace}/{self.name}")
            spec = as_dict(lease.get("spec"))
            if spec.get("holderIdentity") != self.identity:
                return
            # A one-second duration and no holder: the next replica takes it on its next round.
            body = {**lease, "spec": {**spec, "holderIdentity": None, "leaseDurationSeconds": 1}}
            self.kube.request("PUT", self.path, body=body, content_type="application/json",
                              what=f"release Lease {self.namespace}/{self.name}")
        except KubeAPIError as exc:
            log.warning("leader election: releasing %s/%s: %s", self.namespace, self.name, exc)

    def run(self, stop: threading.Event, on_change: Callable[[bool], None] | None = None) -> None:
        """Elect every `retry_period` until `stop` is set; `on_change(leading)` on every change."""
        leading = False
        while not stop.is_set():
            self.try_acquire_or_renew()
            now_leading = self.is_leader
            if now_leading != leading:
                leading = now_leading
                log.info("leader election: %s %s", self.identity, "leads" if leading else "stopped leading")
                if on_change is not None:
                    on_change(leading)
            stop.wait(self.retry_period)

    def start(self, stop: threading.Event, on_change: Callable[[bool], None] | None = None) -> None:
        """`run` on a daemon thread."""
        self._thread = threading.Thread(target=self.run, args=(stop, on_change), name="leader-election",
                                        daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

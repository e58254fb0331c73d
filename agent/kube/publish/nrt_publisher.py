"""Writes this node's NodeResourceTopology when it changed, and never fights another publisher.

`NRTPublisher(api_client, node_name).publish(obj) -> bool` applies `obj` (server-side apply, forced)
only when it differs from the last applied, after a failure or `invalidate()`, or when the periodic
check (`verify_seconds`) finds it deleted or edited; call it every pass.  Where NFD's topology
updater, nfd-master or the resource topology exporter owns the object (`foreign_manager`), it
applies nothing and sets `.yielded_to` until that object is gone (README.md, "Coexistence").
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.api.nrt import API_VERSION, GROUP, KIND, PLURAL, VERSION
from agent.api.validate import is_dns_subdomain
from agent.errors import ConfigError, KubeAPIError
from agent.kube.publish.nrt import MANAGED_BY_LABEL
from agent.kubeapi.client import KubeClient, resource_path

log = logging.getLogger(__name__)

# Field managers of other NRT publishers (the user agent client-go sends, up to its first "/").
OTHER_PUBLISHERS = ("nfd-topology-updater", "nfd-master", "resource-topology-exporter")


def canonical(obj: Mapping[str, Any]) -> str:
    """A canonical text of an object (sorted keys) for change detection."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _ours_intact(ours: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the live object still holds every field we apply, with our values."""
    for key, value in ours.items():
        if key == "metadata":
            continue
        if live.get(key) != value:
            return False
    meta, live_meta = ours.get("metadata") or {}, live.get("metadata") or {}
    live_labels = live_meta.get("labels") or {}
    if any(live_labels.get(k) != v for k, v in (meta.get("labels") or {}).items()):
        return False
    live_refs = live_meta.get("ownerReferences") or []
    return all(any(all(r.get(k) == v for k, v in ref.items()) for r in live_refs)
               for ref in meta.get("ownerReferences") or [])


def foreign_manager(live: Mapping[str, Any], ours: str = "topolet") -> str:
    """Who else publishes the live NRT `live`: a known publisher that owns its zones, else the first
    manager of an object without our managed-by label ("" for ours, or no one)."""
    meta = live.get("metadata") or {}
    entries = [m for m in meta.get("managedFields") or [] if isinstance(m, Mapping)]
    for m in entries:
        name = str(m.get("manager") or "")
        if name in OTHER_PUBLISHERS and "f:zones" in (m.get("fieldsV1") or {}):
            return name
    if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == ours:
        return ""
    others = [str(m.get("manager") or "") for m in entries if m.get("manager") != ours]
    return next((n for n in others if n), "another manager")


class NRTPublisher:
    """Applies this node's NodeResourceTopology when it changed; never writes on a timer alone."""

    def __init__(self, api_client: Any, node_name: str, field_manager: str = "topolet", *,
                 verify_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not is_dns_subdomain(node_name):
            raise ConfigError(f"invalid node name {node_name!r}")
        if not field_manager or len(field_manager) > 128:
            raise ConfigError(f"invalid field manager {field_manager!r}")
        self.kube = KubeClient.of(api_client)  # an ApiClient or a KubeClient
        self.node_name = node_name
        self.field_manager = field_manager
        self.verify_seconds = verify_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._last: str | None = None  # canonical form of the last object the server accepted
        self._resource_version: str | None = None
        self._verified_at = -math.inf
        self.writes = 0  # applies sent and accepted
        self.failures = 0  # calls that failed (API down, refused)
        self.yielded_to = ""  # the other publisher left the object to ("": none)
        self._looked = False  # whether the object was read before our first apply

    def invalidate(self) -> None:
        """Apply on the next `publish` whatever it is given (e.g. after a watch saw the object deleted)."""
        with self._lock:
            self._last = None

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the server returned for our last apply or check."""
        return self._resource_version

    def publish(self, obj: Mapping[str, Any]) -> bool:
        """Apply `obj` when it differs from what we last applied (or it is gone); True when applied."""
        meta = obj.get("metadata") or {}
        if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
            raise ConfigError(f"not a {API_VERSION} {KIND}")
        if meta.get("name") != self.node_name:
            raise ConfigError(f"NodeResourceTopology {meta.get('name')!r} is not this node's "
                              f"({self.node_name})")
        text = canonical(obj)
        with self._lock:
            if self._last is None:
                # Before our first apply, and every verify_seconds while standing aside: whose is it?
                if not self._looked or (self.yielded_to and
                                        self._clock() - self._verified_at >= self.verify_seconds):
                    self._look()
                if self.yielded_to:
                    return False
            elif self._gone_or_changed(obj):  # a read every verify_seconds, changed or not
                if self.yielded_to:
                    self._last = None  # looked at again every verify_seconds
                    return False
            elif text == self._last:
                return False
            try:
                self._apply(json.loads(text))
            except KubeAPIError:
                self._last = None
                self.failures += 1
                raise
            self._last = text
            self._verified_at = self._clock()
            self.writes += 1
            return True

    def _look(self) -> None:
        """Read the object: set `yielded_to` to its other publisher ("" when absent or ours)."""
        try:
            live = self.kube.get(self._path(), what=f"get NodeResourceTopology {self.node_name}")
        except KubeAPIError as exc:
            if not exc.not_found:
                self.failures += 1
                raise
            live = {}
        self._looked = True
        self._verified_at = self._clock()
        self._set_owner(foreign_manager(live, self.field_manager) if live else "")

    def _set_owner(self, manager: str) -> None:
        if manager and not self.yielded_to:
            log.warning("NodeResourceTopology %s is published by %s: topolet leaves it alone",
                        self.node_name, manager)
        elif self.yielded_to and not manager:
            log.info("NodeResourceTopology %s is no longer %s's: topolet publishes it", self.node_name,
                     self.yielded_to)
        self.yielded_to = manager

    def _gone_or_changed(self, obj: Mapping[str, Any]) -> bool:
        """Every `verify_seconds`, read the object back: True when it was deleted or our fields changed."""
        now = self._clock()
        if now - self._verified_at < self.verify_seconds:
            return False
        try:
            live = self.kube.get(self._path(), what=f"get NodeResourceTopology {self.node_name}")
        except KubeAPIError as exc:
            if exc.not_found:
                log.info("NodeResourceTopology %s is gone; applying it again", self.node_name)
                return True
            self.failures += 1
            raise
        self._verified_at = now
        self._resource_version = (live.get("metadata") or {}).get("resourceVersion")
        self._set_owner(foreign_manager(live, self.field_manager))
        if self.yielded_to:
            return True  # publish() stands aside
        if _ours_intact(obj, live):
            return False
        log.info("NodeResourceTopology %s was changed by someone else; applying it again", self.node_name)
        return True

    def _path(self) -> str:
        # Module globals read per call: tests point PLURAL at a resource the server does not serve.
        return resource_path(GROUP, VERSION, PLURAL, self.node_name)

    def _apply(self, body: dict[str, Any]) -> None:
        out = self.kube.apply(self._path(), body, self.field_manager, force=True,
                              what=f"apply NodeResourceTopology {self.node_name}")
        self._resource_version = (out.get("metadata") or {}).get("resourceVersion")

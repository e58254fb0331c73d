"""Publishing the node's labels: an NFD NodeFeature object, the Node itself, or the features.d file.

`LabelPublisher(api_client, node_name, sink="auto", ...)`: `.publish(labels) -> bool` writes only
what changed (and reads first after a start or failure, so a restarted DaemonSet rewrites nothing);
`.resolved_sink` is the sink in use, `.next_check_in()` when `auto` looks again.  Raises
`KubeAPIError` (retry next call), `ConfigError` for an invalid label before any write,
`FeatureFileError` for a refused file.  The sinks and how `auto` moves labels: README.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.api.validate import is_dns_subdomain, is_label_key, is_label_value
from agent.errors import ConfigError, KubeAPIError, TopoletError
from agent.kubeapi.client import KubeClient, agent_namespace, resource_path
from agent.labels.auto_sink import choose_auto_sink, handover_removals, nfd_master_labels
from agent.labels.features_file import DEFAULT_FEATURES_DIR, write_features_file
from agent.labels.nodefeature import (
    NODEFEATURE_API_VERSION,
    node_label_patch,
    nodefeature_name,
    nodefeature_object,
)

log = logging.getLogger(__name__)

SINKS = ("auto", "nodefeature", "node", "file", "none")
NODEFEATURE_GROUP, NODEFEATURE_VERSION = NODEFEATURE_API_VERSION.split("/")
NODEFEATURE_PLURAL = "nodefeatures"
MANAGED_LABELS_ANNOTATION = "topolet.io/managed-labels"
# How often `auto` looks again whether an nfd-master labels this node: nfd-worker's own default
# sleep-interval, so NFD installed or removed later is followed within about a minute.
AUTO_CHECK_SECONDS = 60.0
# Tries of the hand-over patch when the Node changed under it (nfd-master labelling it meanwhile).
HANDOVER_TRIES = 3
MERGE_PATCH = "application/merge-patch+json"
# Labels the user sets and the agent only reads: `publish` refuses them and the Node sink never
# removes them.  (NVIDIA MIG manager's protocol: the user names the layout in
# topolet.io/mig.config, `agent.gpu.reconcile.CONFIG_LABEL`; the agent answers in its .state.)
USER_LABELS = frozenset({"topolet.io/mig.config"})


def _managed_keys(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The label keys recorded in our annotation, as a `previous` mapping for node_label_patch
    (user-owned keys left out even if an annotation lists them)."""
    text = (annotations or {}).get(MANAGED_LABELS_ANNOTATION, "")
    return {k: "" for k in text.split(",") if k and is_label_key(k) and k not in USER_LABELS}


class LabelPublisher:
    """Writes the node's labels to one sink, only when they changed."""

    def __init__(self, api_client: Any, node_name: str, namespace: str | None = None,
                 sink: str = "auto", features_dir: str = DEFAULT_FEATURES_DIR, *,
                 field_manager: str = "topolet", check_seconds: float = AUTO_CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if sink not in SINKS:
            raise ConfigError(f"unknown label sink {sink!r} (one of {', '.join(SINKS)})")
        if not is_dns_subdomain(node_name):
            raise ConfigError(f"invalid node name {node_name!r}")
        if api_client is None and sink in ("nodefeature", "node"):
            raise ConfigError(f"label sink {sink!r} needs an API client")
        # An ApiClient or a KubeClient; none for the file and none sinks.
        self._kube = None if api_client is None else KubeClient.of(api_client)
        self.node_name = node_name
        self.namespace = agent_namespace(namespace)
        self.sink = sink
        self.features_dir = features_dir
        self.field_manager = field_manager
        self.resolved_sink: str | None = None if sink == "auto" else sink
        self.writes = 0
        self.failures = 0
        self._last: dict[str, str] | None = None  # labels the sink is known to hold
        self._lock = threading.Lock()
        self.check_seconds = check_seconds
        self._clock = clock
        self._next_check = 0.0  # when `auto` in a cluster looks again (0: at the next publish)
        # A NodeFeature of ours may exist though the sink is "node": a run before this one, or the
        # sink just left, wrote it.  Cleared once it is deleted.
        self._nodefeature_left = True
        if sink == "auto" and api_client is None:
            choice = choose_auto_sink(has_api=False, nfd_master_labels_node=False, nodefeature_served=False)
            self._switch(choice.sink, choice.reason)

    def invalidate(self) -> None:
        """Forget what the sink holds: the next `publish` checks and writes again."""
        with self._lock:
            self._last = None

    def next_check_in(self) -> float | None:
        """Seconds until `auto` looks again where labels go (0: due now); None for a fixed sink."""
        if self.sink != "auto" or self._kube is None:
            return None
        return max(self._next_check - self._clock(), 0.0)

    def publish(self, labels: Mapping[str, str]) -> bool:
        """Write `labels` to the sink when they differ from what it holds; True when written."""
        for key, value in labels.items():
            if not is_label_key(key) or not is_label_value(value):
                raise ConfigError(f"not a valid label: {key!r}={value!r}")
            if key in USER_LABELS:
                raise ConfigError(f"label {key} is the user's to set; the agent never writes it")
        wanted = dict(sorted(labels.items()))
        with self._lock:
            due = self.next_check_in() == 0
            if wanted == self._last and not due:
                return False
            try:
                node = self._check() if due else None
                sink = self.resolved_sink or self.sink  # resolved: at construction or by _check
                wrote = wanted != self._last and self._write(sink, wanted, node)
                wrote = self._move(sink, node) or wrote
            except TopoletError:
                self._last = None
                self._next_check = 0.0  # look again on the next call: a hand-over may be half done
                self.failures += 1
                raise
            self._last = wanted
            if wrote:
                self.writes += 1
            return wrote

    def _switch(self, sink: str, reason: str) -> None:
        """Use `sink` from now on; log the change once, with `reason`."""
        if sink == self.resolved_sink:
            return
        log.info("label sink: %s (%s)", sink, reason)
        if self.resolved_sink == "nodefeature":
            self._nodefeature_left = True
        self.resolved_sink = sink
        self._last = None  # the new sink holds nothing we know of

    def _check(self) -> dict[str, Any]:
        """Decide `auto`'s sink from the Node (read here, returned) and, if needed, discovery."""
        node = self._get_node()
        labelled = nfd_master_labels(_annotations(node)) is not None
        # Discovery only where an nfd-master annotated the Node: one GET per check elsewhere.
        choice = choose_auto_sink(has_api=True, nfd_master_labels_node=labelled,
                                  nodefeature_served=labelled and self._nodefeature_served())
        self._switch(choice.sink, choice.reason)
        self._next_check = self._clock() + self.check_seconds
        return node

    @property
    def kube(self) -> KubeClient:
        if self._kube is None:  # the constructor refuses the API sinks without a client
            raise ConfigError(f"label sink {self.sink!r} needs an API client")
        return self._kube

    def _nodefeature_served(self) -> bool:
        # Module globals read per call: tests point the group at one the server does not serve.
        group_version = f"{NODEFEATURE_GROUP}/{NODEFEATURE_VERSION}"
        try:
            found = self.kube.get(resource_path(NODEFEATURE_GROUP, NODEFEATURE_VERSION),
                                  what=f"discover {group_version}")
        except KubeAPIError as exc:
            if exc.not_found:  # the group/version is not served at all
                return False
            raise
        resources = found.get("resources")
        return isinstance(resources, list) and any(
            isinstance(r, dict) and r.get("name") == NODEFEATURE_PLURAL for r in resources)

    def _write(self, sink: str, labels: dict[str, str], node: Mapping[str, Any] | None) -> bool:
        if sink == "none":
            return False
        if sink == "file":
            return write_features_file(self.features_dir, labels)
        if sink == "nodefeature":
            return self._apply_nodefeature(labels)
        return self._patch_node(labels, node)

    def _move(self, sink: str, node: Mapping[str, Any] | None) -> bool:
        """Take our labels out of the sink `auto` no longer uses; True when that wrote."""
        if sink == "nodefeature" and node is not None:
            return self._release_node_labels(node)
        if sink == "node" and self.sink == "auto" and self._nodefeature_left:
            deleted = self._delete_nodefeature()
            self._nodefeature_left = False
            return deleted
        return False

    def _get_node(self) -> dict[str, Any]:
        return self.kube.get(self._node_path(), what=f"get Node {self.node_name}")

    def _node_path(self) -> str:
        return resource_path("", "v1", "nodes", self.node_name)

    def _nodefeature_path(self) -> str:
        return resource_path(NODEFEATURE_GROUP, NODEFEATURE_VERSION, NODEFEATURE_PLURAL,
                             nodefeature_name(self.node_name), namespace=self.namespace)

    def _apply_nodefeature(self, labels: dict[str, str]) -> bool:
        body = nodefeature_object(self.node_name, self.namespace, labels)
        name = nodefeature_name(self.node_name)
        path = self._nodefeature_path()
        if self._last is None:
            live: Mapping[str, Any] | None
            try:
                live = self.kube.get(path, what=f"get NodeFeature {self.namespace}/{name}")
            except KubeAPIError as exc:
                if not exc.not_found:
                    raise
                live = None
            if live is not None and (live.get("spec") or {}).get("labels") == labels and all(
                    ((live.get("metadata") or {}).get("labels") or {}).get(k) == v
                    for k, v in body["metadata"]["labels"].items()):
                return False
        self.kube.apply(path, body, self.field_manager, force=True,
                        what=f"apply NodeFeature {self.namespace}/{name}")
        return True

    def _delete_nodefeature(self) -> bool:
        """Delete our NodeFeature; False when there was none (or the API serves no NodeFeature)."""
        name = nodefeature_name(self.node_name)
        try:
            self.kube.request("DELETE", self._nodefeature_path(),
                              what=f"delete NodeFeature {self.namespace}/{name}")
        except KubeAPIError as exc:
            if exc.not_found:
                return False
            if exc.status == 403:  # RBAC from before this version: the object stays, unread
                log.warning("NodeFeature %s/%s left in place: %s (grant delete on nodefeatures, "
                            "daemonset/rbac.yaml)", self.namespace, name, exc)
                return False
            raise
        log.info("NodeFeature %s/%s deleted: node %s's labels are on its Node now",
                 self.namespace, name, self.node_name)
        return True

    def _release_node_labels(self, node: Mapping[str, Any]) -> bool:
        """Remove our Node labels and annotation (nfd-master sets them now); False if none was there."""
        for attempt in range(HANDOVER_TRIES):
            meta = _metadata(node)
            annotations = _annotations(node)
            if MANAGED_LABELS_ANNOTATION not in annotations:
                return False
            removed = handover_removals(_managed_keys(annotations), dict(meta.get("labels") or {}),
                                        nfd_master_labels(annotations) or ())
            patch = node_label_patch({}, dict.fromkeys(removed, ""))
            patch["metadata"]["annotations"] = {MANAGED_LABELS_ANNOTATION: None}
            # On the version read: should nfd-master label the Node meanwhile (and list a key as
            # its own), the patch is refused and decided again, so no label it took is removed.
            if meta.get("resourceVersion"):
                patch["metadata"]["resourceVersion"] = str(meta["resourceVersion"])
            try:
                self.kube.patch(self._node_path(), patch, MERGE_PATCH,
                                what=f"patch Node {self.node_name}: labels moved to the NodeFeature")
            except KubeAPIError as exc:
                if exc.status != 409 or attempt + 1 == HANDOVER_TRIES:
                    raise
                node = self._get_node()
                continue
            log.info("node %s's labels moved to NodeFeature %s/%s: %d removed from the Node",
                     self.node_name, self.namespace, nodefeature_name(self.node_name), len(removed))
            return True
        return False

    def _patch_node(self, labels: dict[str, str], node: Mapping[str, Any] | None = None) -> bool:
        path = self._node_path()
        if node is None:
            node = self._get_node()
        meta = _metadata(node)
        current = dict(meta.get("labels") or {})
        annotations = _annotations(node)
        previous = _managed_keys(annotations)
        record = ",".join(sorted(labels))
        stale = [k for k in previous if k not in labels and k in current]
        if (not stale and all(current.get(k) == v for k, v in labels.items())
                and annotations.get(MANAGED_LABELS_ANNOTATION, "") == record):
            return False
        patch = node_label_patch(labels, previous)
        patch["metadata"]["annotations"] = {MANAGED_LABELS_ANNOTATION: record}
        self.kube.patch(path, patch, MERGE_PATCH, what=f"patch Node {self.node_name} labels")
        return True


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    found = obj.get("metadata")
    return found if isinstance(found, dict) else {}


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    found = _metadata(obj).get("annotations")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

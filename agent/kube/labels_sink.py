"""Publishing the node's labels: an NFD NodeFeature object, the Node itself, or the features.d file.

Public API (stable; the in-cluster daemon builds on it):

- `LabelPublisher(api_client, node_name, namespace=None, sink="auto", features_dir=DEFAULT_FEATURES_DIR,
  *, field_manager="topolet")`; `namespace` None means `agent.kube.client.agent_namespace()`
  (POD_NAMESPACE, the service-account namespace file, or "topolet-system").
- `.publish(labels: Mapping[str, str]) -> bool`: True when it wrote.  Writes only when the labels
  differ from the last ones published; on the first call (and after a failure) it reads what the
  API holds and skips the write when that already matches, so a restarted DaemonSet does not
  rewrite every node.  Raises `KubeAPIError` when the API call failed (the next call retries),
  ConfigError for an invalid label (before any write) and `FeatureFileError` for a refused file.
- `.sink`: the sink asked for; `.resolved_sink`: the one in use ("nodefeature" | "node" | "file" |
  "none"), known after the first `publish` when `sink="auto"`.
- `.writes` / `.failures`: counters for metrics.

Sinks:
- "auto": "nodefeature" when the API serves `nodefeatures.nfd.k8s-sigs.io/v1alpha1` (discovery,
  asked once and remembered), else "file".
- "nodefeature": a NodeFeature in the agent's namespace (`agent.labels.nodefeature.nodefeature_object`,
  label `nfd.node.kubernetes.io/node-name=<node>`), server-side applied as `field_manager`.
- "node": a JSON merge patch on the Node (`agent.labels.nodefeature.node_label_patch`) that sets our
  labels and removes the keys we set before and no longer publish; no other label is touched.  The
  keys we own are kept in the Node annotation `topolet.io/managed-labels` so that a restarted agent
  still knows them.
  Labels in `USER_LABELS` are never set or removed, whatever the annotation lists.
- "file": NFD's features.d file (`agent.labels.features_file.write_features_file`).
- "none": publishes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from agent.errors import ConfigError, KubeAPIError, TopoletError
from agent.kube.client import KubeClient, agent_namespace, resource_path
from agent.labels.features_file import DEFAULT_FEATURES_DIR, write_features_file
from agent.labels.nodefeature import (
    NODEFEATURE_API_VERSION,
    node_label_patch,
    nodefeature_name,
    nodefeature_object,
)
from agent.labels.validate import is_dns_subdomain, is_label_key, is_label_value

log = logging.getLogger(__name__)

SINKS = ("auto", "nodefeature", "node", "file", "none")
NODEFEATURE_GROUP, NODEFEATURE_VERSION = NODEFEATURE_API_VERSION.split("/")
NODEFEATURE_PLURAL = "nodefeatures"
MANAGED_LABELS_ANNOTATION = "topolet.io/managed-labels"
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
                 field_manager: str = "topolet") -> None:
        if sink not in SINKS:
            raise ConfigError(f"unknown label sink {sink!r} (one of {', '.join(SINKS)})")
        if not is_dns_subdomain(node_name):
            raise ConfigError(f"invalid node name {node_name!r}")
        if api_client is None and sink in ("auto", "nodefeature", "node"):
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

    def invalidate(self) -> None:
        """Forget what the sink holds: the next `publish` checks and writes again."""
        with self._lock:
            self._last = None

    def publish(self, labels: Mapping[str, str]) -> bool:
        """Write `labels` to the sink when they differ from what it holds; True when written."""
        for key, value in labels.items():
            if not is_label_key(key) or not is_label_value(value):
                raise ConfigError(f"not a valid label: {key!r}={value!r}")
            if key in USER_LABELS:
                raise ConfigError(f"label {key} is the user's to set; the agent never writes it")
        wanted = dict(sorted(labels.items()))
        with self._lock:
            if wanted == self._last:
                return False
            try:
                sink = self._resolve()
                wrote = self._write(sink, wanted)
            except TopoletError:
                self._last = None
                self.failures += 1
                raise
            self._last = wanted
            if wrote:
                self.writes += 1
            return wrote

    def _resolve(self) -> str:
        if self.resolved_sink is None:
            self.resolved_sink = "nodefeature" if self._nodefeature_served() else "file"
            log.info("label sink: %s", self.resolved_sink)
        return self.resolved_sink

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

    def _write(self, sink: str, labels: dict[str, str]) -> bool:
        if sink == "none":
            return False
        if sink == "file":
            return write_features_file(self.features_dir, labels)
        if sink == "nodefeature":
            return self._apply_nodefeature(labels)
        return self._patch_node(labels)

    def _apply_nodefeature(self, labels: dict[str, str]) -> bool:
        body = nodefeature_object(self.node_name, self.namespace, labels)
        name = nodefeature_name(self.node_name)
        path = resource_path(NODEFEATURE_GROUP, NODEFEATURE_VERSION, NODEFEATURE_PLURAL, name,
                             namespace=self.namespace)
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

    def _patch_node(self, labels: dict[str, str]) -> bool:
        path = resource_path("", "v1", "nodes", self.node_name)
        node = self.kube.get(path, what=f"get Node {self.node_name}")
        found_meta = node.get("metadata")
        meta: dict[str, Any] = found_meta if isinstance(found_meta, dict) else {}
        current = dict(meta.get("labels") or {})
        annotations = dict(meta.get("annotations") or {})
        previous = _managed_keys(annotations)
        record = ",".join(sorted(labels))
        stale = [k for k in previous if k not in labels and k in current]
        if (not stale and all(current.get(k) == v for k, v in labels.items())
                and annotations.get(MANAGED_LABELS_ANNOTATION, "") == record):
            return False
        patch = node_label_patch(labels, previous)
        patch["metadata"]["annotations"] = {MANAGED_LABELS_ANNOTATION: record}
        self.kube.patch(path, patch, "application/merge-patch+json",
                        what=f"patch Node {self.node_name} labels")
        return True

"""Watch the pods bound to this node (`spec.nodeName=<node>`) with the shared list+watch loop.

`PodWatcher` is `agent.kubeapi.reflector.Reflector` over this node's pods, keeping only the small
`PodPlan` of each (raw JSON, never the client's model classes: they cost memory; a pod's container
arguments and managedFields dropped while decoded, agent/kubeapi/bulk.py).  It hands three
kinds of change to a sink on the watcher's thread: `Synced(plans)`, the complete set after a (re)list
(pods missing from it are gone; the sink must leave unchanged containers alone, so a relist re-pins
nothing), `Changed(plan)` for a pod added or modified, `Gone(uid)` for a pod deleted.  A pod that
cannot be read or handled costs only itself; an outage changes nothing (a pod we cannot see is not a
pod gone): the reflector's rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.api.podplan import PodPlan, plan_pod
from agent.kubeapi.backoff import API_BACKOFF, Backoff
from agent.kubeapi.bulk import drop_bulk
from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.reflector import WATCH_TIMEOUT_SECONDS, Reflector

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 3.0
LIST_READ_TIMEOUT_SECONDS = 60.0  # a list of every pod on a full node is large, but not this slow


@dataclass(frozen=True, slots=True)
class Synced:
    plans: dict[str, PodPlan]  # uid → plan: every pod on this node


@dataclass(frozen=True, slots=True)
class Changed:
    plan: PodPlan


@dataclass(frozen=True, slots=True)
class Gone:
    uid: str


PodChange = Synced | Changed | Gone


class PodWatcher(Reflector[PodPlan]):
    """List + watch `spec.nodeName=<node>` pods and hand changes to `sink` (see the module docstring)."""

    def __init__(self, api_client: Any, node_name: str, sink: Callable[[PodChange], None], *,
                 backoff: Backoff = API_BACKOFF, watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
                 on_list: Callable[[], None] | None = None,
                 on_invalid: Callable[[], None] | None = None) -> None:
        self.node_name = node_name
        self.sink = sink
        super().__init__(KubeClient.of(api_client),  # an ApiClient or a KubeClient
                         resource_path("", "v1", "pods"), f"pods on {node_name}",
                         {"fieldSelector": self.selector}, on_list=on_list, on_invalid=on_invalid,
                         backoff=backoff, watch_timeout_seconds=watch_timeout_seconds,
                         list_timeout=(CONNECT_TIMEOUT_SECONDS, LIST_READ_TIMEOUT_SECONDS),
                         connect_timeout=CONNECT_TIMEOUT_SECONDS, object_hook=drop_bulk, log=log)

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    def read(self, obj: dict[str, Any]) -> PodPlan:
        return plan_pod(obj)  # raises only PodError (a ValueError): the pod is skipped and counted

    def listed(self, items: list[PodPlan]) -> None:
        self.sink(Synced({plan.uid: plan for plan in items}))

    def handle(self, kind: str, item: PodPlan) -> None:
        self.sink(Gone(item.uid) if kind == "DELETED" else Changed(item))

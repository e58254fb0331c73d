"""Watch the pods bound to this node: list, then watch from the list's resourceVersion (with bookmarks).

The watcher turns API traffic into three kinds of change, handed to a sink on the watcher's thread:

- `Synced(plans)`: the complete set of this node's pods after a (re)list.  Pods missing from it are
  gone (the API said so); the sink must leave unchanged containers alone, so a relist re-pins nothing.
- `Changed(plan)`: one pod added or modified.
- `Gone(uid)`: one pod deleted.

It reads raw JSON through `agent.kubeapi.client.KubeClient` (never the client's model classes: they
cost memory) and keeps only the small `PodPlan` of each pod.  One object costs only itself: a pod that
cannot be read, or whose change cannot be handled, is logged, counted (`on_invalid`) and skipped,
and the watch's resourceVersion moves past it, so a resumed watch never replays it.  A watch that
ends is resumed from the last resourceVersion seen; a 410 Gone (history compacted) or an expired
watch brings a relist.  While the API server is down it retries with the API loops' back-off
(`agent.kubeapi.backoff`: 1 s doubling to 30 s, jittered), logs the outage once and then a reminder a
minute, and changes nothing: a pod we cannot see is not a pod gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.api.podplan import PodError, PodPlan, plan_pod
from agent.kubeapi.backoff import API_BACKOFF, Backoff, Outage
from agent.kubeapi.client import KubeClient, WatchStream, resource_path

log = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; we resume from the last version
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


class Expired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 Gone): relist."""


class PodWatcher:
    """List + watch `spec.nodeName=<node>` pods and hand changes to `sink` (see the module docstring)."""

    def __init__(self, api_client: Any, node_name: str, sink: Callable[[PodChange], None], *,
                 backoff: Backoff = API_BACKOFF, watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
                 on_list: Callable[[], None] | None = None,
                 on_invalid: Callable[[], None] | None = None) -> None:
        self.kube = KubeClient.of(api_client)  # an ApiClient or a KubeClient
        self.node_name = node_name
        self.sink = sink
        self.outage = Outage(f"pod watch on {node_name}", log, backoff)
        self.watch_timeout = watch_timeout_seconds
        self.resource_version: str | None = None
        self.lists = 0
        self.watches = 0
        self.garbage = 0  # objects we could not read and skipped
        self.on_invalid = on_invalid  # told of each one (topolet_invalid_objects_total{kind="pod"})
        self.synced = threading.Event()  # set after the first successful list
        self.connected = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None
        self._relist = threading.Event()
        self.on_list = on_list

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    # -- thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.shutdown()  # wake a read blocked on the stream
        if self._thread is not None:
            self._thread.join(timeout=10)

    def request_relist(self) -> None:
        """End the current watch and list again (as after an expired watch); safe from any thread."""
        self._relist.set()
        stream = self._stream
        if stream is not None:
            stream.shutdown()  # wake the read blocked on the stream

    def run(self) -> None:
        """List and watch until stopped; every failure is retried with the API loops' back-off."""
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or self._relist.is_set():
                    self._relist.clear()
                    self.relist()
                    need_list = False
                    self.outage.recovered()
                self.watch_once()
                self.outage.recovered()
            except Expired:
                log.info("pod watch expired at resourceVersion %s: relisting", self.resource_version)
                need_list = True
                continue
            except Exception as exc:  # noqa: BLE001 - the API may fail in any way; we keep trying
                if self._stop.is_set():
                    break
                self.connected = False
                if _status(exc) == 410:
                    need_list = True
                    continue
                self._stop.wait(self.outage.failed(_short(exc)))

    # -- list and watch --------------------------------------------------------------------------

    def relist(self) -> None:
        """List this node's pods and hand the complete set to the sink."""
        body = self.kube.list(resource_path("", "v1", "pods"), {"fieldSelector": self.selector},
                              timeout=(CONNECT_TIMEOUT_SECONDS, LIST_READ_TIMEOUT_SECONDS),
                              what=f"list pods on {self.node_name}")
        plans: dict[str, PodPlan] = {}
        for item in body.get("items") or []:
            plan = self._plan(item)
            if plan is not None:
                plans[plan.uid] = plan
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not isinstance(rv, str) or not rv:
            raise ValueError("pod list without a resourceVersion")
        self.resource_version = rv
        self.lists += 1
        if self.on_list is not None:
            self.on_list()
        self.connected = True
        self.sink(Synced(plans))
        self.synced.set()

    def watch_once(self) -> None:
        """One watch request from the last resourceVersion, until the server ends it."""
        stream = self.kube.watch(
            resource_path("", "v1", "pods"),
            {"fieldSelector": self.selector, "allowWatchBookmarks": True,
             "resourceVersion": self.resource_version, "timeoutSeconds": self.watch_timeout},
            timeout=(CONNECT_TIMEOUT_SECONDS, self.watch_timeout + 30),
            what=f"watch pods on {self.node_name}")
        self._stream = stream
        self.watches += 1
        self.connected = True
        try:
            for event in stream:
                if self._stop.is_set() or self._relist.is_set():
                    return
                self._event(event)
        finally:
            self._stream = None
            stream.close()

    def _event(self, event: dict[str, Any] | None) -> None:
        if event is None:
            self.garbage += 1
            log.warning("pod watch: unreadable event skipped")
            return
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            self.garbage += 1
            return
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired()
            raise RuntimeError(f"watch error: {str(obj.get('message'))[:200]}")
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        # The version moves on before the event is handled: an event whose handling fails is skipped,
        # never replayed by the next watch forever (a tenant's pod would stop this node's agent).
        if isinstance(rv, str) and rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        plan = self._plan(obj)
        if plan is None:
            return
        if kind in ("ADDED", "MODIFIED"):
            self._hand(Changed(plan))
        elif kind == "DELETED":
            self._hand(Gone(plan.uid))
        else:
            self._skipped("an event of unknown type")

    def _plan(self, obj: object) -> PodPlan | None:
        """The object's plan; None (counted, logged) when it is not a pod we can read.  `plan_pod`
        raises only PodError; anything else is a defect, and still costs only this object."""
        try:
            return plan_pod(obj)
        except PodError as exc:
            self._skipped(str(exc))
        except Exception:  # noqa: BLE001 - one object never stops the watch
            log.exception("pod watch: reading a pod failed")
            self._skipped("unreadable")
        return None

    def _hand(self, change: PodChange) -> None:
        try:
            self.sink(change)
        except Exception:  # noqa: BLE001 - one object never stops the watch
            log.exception("pod watch: handling a pod change failed")
            self._skipped("its change could not be handed on")

    def _skipped(self, why: str) -> None:
        self.garbage += 1
        if self.on_invalid is not None:
            self.on_invalid()
        log.warning("pod watch: skipping an object: %s", why)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _short(exc: BaseException) -> str:
    status = _status(exc)
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]

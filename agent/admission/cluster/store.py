"""List+watch stores of API objects for `topolet controller`, and a cache of what is read from them.

Public API:

- `Reflector(kube, path, what, changed, params=None, matters=None)`: lists then watches one collection
  into memory; `.snapshot()`, `.put(obj)` (a write's response), `.synced`, `.start()`, `.stop()`.
- `VersionCache(compute)`: `compute(obj)` memoised by the object's uid and resourceVersion;
  `.retain(objs)` forgets the objects not among `objs`.

Objects are keyed by `agent.api.objects.object_key`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from agent.admission.cluster import heap
from agent.api.objects import as_dict, metadata_of, object_key, resource_version
from agent.errors import KubeAPIError
from agent.kubeapi.backoff import Outage
from agent.kubeapi.client import KubeClient, WatchStream

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCH_TIMEOUT_SECONDS = 300
LIST_TIMEOUT = (5.0, 120.0)


class Reflector:
    """Lists then watches one collection into `items` (key -> object); `changed` is set on every change
    that `matters`.

    A collection whose API is not served (404: e.g. the NRT CRD is not installed) counts as empty and
    synced, and is listed again on the next retry.  Failures are retried with the API loops' back-off
    and logged once per outage (`agent.kubeapi.backoff.Outage`).
    """

    def __init__(self, kube: KubeClient, path: str, what: str, changed: threading.Event,
                 query: Mapping[str, object] | None = None,
                 matters: Callable[[str, dict[str, Any]], bool] = lambda kind, obj: True) -> None:
        self.kube = kube
        self.matters = matters  # whether a watch event (type, object) should set `changed`
        self.path = path
        self.what = what
        self.query = dict(query or {})
        self.changed = changed
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._rv: str | None = None
        self.outage = Outage(f"watch of {what}", log)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.items.values())

    def put(self, obj: dict[str, Any]) -> None:
        """Store `obj` (a write's response) unless the store already holds a newer version."""
        key = object_key(obj)
        with self._lock:
            old = self.items.get(key)
            if old is None or resource_version(obj) >= resource_version(old):
                self.items[key] = obj

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event into the store.

        A write's response may already be stored (`put`) when the watch delivers an older version of
        the object: the newer one stays.  Else an admitted Job would look undecided for a pass, its
        ledger entries would be dropped, and its capacity could be given twice."""
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self.items.pop(key, None)
            elif kind in ("ADDED", "MODIFIED"):
                old = self.items.get(key)
                if (old is None or resource_version(obj) >= resource_version(old)
                        or metadata_of(old).get("uid") != metadata_of(obj).get("uid")):
                    self.items[key] = obj

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.what}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                if self._rv is None:  # API not served: list again later
                    need_list = True
                    self._stop.wait(10)
                    continue
                self.outage.recovered()
                need_list = self._watch()
            except Exception as exc:  # noqa: BLE001 - the API may fail in any way; we keep trying
                if self._stop.is_set():
                    break
                if getattr(exc, "status", None) == 410:
                    need_list = True
                    continue
                self._stop.wait(self.outage.failed(exc))

    def _list(self) -> None:
        try:
            with heap.paused():  # a big list decodes into millions of objects at once
                body = self.kube.list(self.path, self.query, timeout=LIST_TIMEOUT, what=f"list {self.what}")
        except KubeAPIError as exc:
            if not exc.not_found:
                raise
            with self._lock:
                self.items = {}
            self._rv = None
            self.synced.set()
            self.changed.set()
            return
        items = {object_key(o): o for o in body.get("items") or [] if isinstance(o, dict)}
        with self._lock:
            self.items = items
        self._rv = str(metadata_of(body).get("resourceVersion") or "") or None
        self.synced.set()
        self.changed.set()

    def _watch(self) -> bool:
        """One watch from the last resourceVersion; True when a relist is needed."""
        stream = self.kube.watch(self.path, {**self.query, "resourceVersion": self._rv,
                                             "allowWatchBookmarks": True,
                                             "timeoutSeconds": WATCH_TIMEOUT_SECONDS},
                                 timeout=(5.0, WATCH_TIMEOUT_SECONDS + 30), what=f"watch {self.what}")
        self._stream = stream
        try:
            for event in stream:
                if self._stop.is_set():
                    return False
                if event is None:
                    continue
                kind, obj = event.get("type"), as_dict(event.get("object"))
                if kind == "ERROR":
                    return True  # 410 Gone and the like: start over from a list
                rv = metadata_of(obj).get("resourceVersion")
                if isinstance(rv, str) and rv:
                    self._rv = rv
                if kind == "BOOKMARK":
                    continue
                self.apply(str(kind), obj)
                if self.matters(str(kind), obj):
                    self.changed.set()
        finally:
            self._stream = None
            stream.close()
        return False


class VersionCache(Generic[T]):
    """`compute(obj)` once per object version (uid, resourceVersion): for objects as the API serves
    them (pods, Nodes, NRTs), which all carry both.  It holds the latest version's value of each
    object; `retain(objs)` drops the objects not among `objs` (gone from the cluster)."""

    def __init__(self, compute: Callable[[Mapping[str, Any]], T]) -> None:
        self.compute = compute
        self._held: dict[str, tuple[str, T]] = {}  # uid -> (resourceVersion, value)

    def of(self, obj: Mapping[str, Any]) -> T:
        meta = metadata_of(obj)
        uid, rv = str(meta.get("uid")), str(meta.get("resourceVersion"))
        hit = self._held.get(uid)
        if hit is not None and hit[0] == rv:
            return hit[1]
        value = self.compute(obj)
        self._held[uid] = (rv, value)
        return value

    def retain(self, objs: Iterable[Mapping[str, Any]]) -> None:
        live = {str(metadata_of(o).get("uid")) for o in objs}
        if len(live) != len(self._held):
            self._held = {uid: v for uid, v in self._held.items() if uid in live}

"""Stores of API objects for `topolet controller`, each filled by the shared list+watch loop, and a
cache of what is read from them.

Public API:

- `Reflector(kube, path, what, changed, query=None, matters=..., on_invalid=None, slim=slim_object,
  object_hook=None, indexes={})`: one collection in memory, each object as `slim` keeps it
  (`agent.admission.cluster.slim`), listed then watched by `agent.kubeapi.reflector.Reflector` (whose
  rules it follows; `object_hook` drops fields while a response is decoded, `agent.kubeapi.bulk`);
  `.snapshot()`, `.by(index, value)`, `.put(obj)` (a write's response), `.apply(kind, obj)`, `.synced`,
  `.start()`, `.stop()`.  `indexes` names functions of an object to the values it is found by (as
  client-go's indexers: a Job's pods by their owner), kept as each object comes and goes, so a pass
  finds one owner's pods without reading every pod in the cluster.
- `VersionCache(compute)`: `compute(obj)` memoised by the object's uid and resourceVersion;
  `.retain(objs)` forgets the objects not among `objs`.  Objects are keyed by `object_key`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from agent.admission.cluster import heap
from agent.admission.cluster.slim import slim_object
from agent.api.objects import metadata_of, object_key, resource_version
from agent.kubeapi import reflector
from agent.kubeapi.client import KubeClient, ObjectHook

log = logging.getLogger(__name__)
T = TypeVar("T")
Indexer = Callable[[Mapping[str, Any]], Iterable[Hashable]]  # an object -> the values it is found by


class Reflector(reflector.Reflector[dict[str, Any]]):
    """One collection in `items` (key -> object); `changed` is set after each list and on every watch
    event that `matters`.  A collection whose API is not served (404: e.g. the NRT CRD is not
    installed) counts as empty and synced, and is listed again until it is."""

    def __init__(self, kube: KubeClient, path: str, what: str, changed: threading.Event,
                 query: Mapping[str, object] | None = None,
                 matters: Callable[[str, dict[str, Any]], bool] = lambda kind, obj: True, *,
                 on_invalid: Callable[[], None] | None = None,
                 slim: Callable[[Mapping[str, Any]], dict[str, Any]] = slim_object,
                 object_hook: ObjectHook | None = None, indexes: Mapping[str, Indexer] | None = None) -> None:
        super().__init__(kube, path, what, query, on_invalid=on_invalid, not_served_is_empty=True,
                         object_hook=object_hook, log=log)
        self.slim = slim  # what is kept of each object: the fields the controller reads
        self.matters = matters  # whether a watch event (type, object) should set `changed`
        self.changed = changed
        self.items: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._indexers = dict(indexes or {})
        # index name -> value -> object key -> object
        self._indexed: dict[str, dict[Hashable, dict[str, dict[str, Any]]]] = {n: {} for n in self._indexers}

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.items.values())

    def by(self, index: str, value: Hashable) -> list[dict[str, Any]]:
        """The objects `index` finds by `value` (in no particular order)."""
        with self._lock:
            return list(self._indexed[index].get(value, {}).values())

    def _store(self, key: str, obj: dict[str, Any] | None) -> None:
        """`obj` as the object at `key` (None: gone), its index entries moved with it; under the lock."""
        old = self.items.pop(key, None) if obj is None else self.items.get(key)
        if obj is not None:
            self.items[key] = obj
        for name, values_of in self._indexers.items():
            indexed = self._indexed[name]
            if old is not None:
                for value in _values(values_of, old):
                    members = indexed.get(value)
                    if members is not None and members.pop(key, None) is not None and not members:
                        del indexed[value]
            if obj is not None:
                _index(indexed, values_of, key, obj)

    def put(self, obj: dict[str, Any]) -> None:
        """Store `obj` (a write's response, as `slim` keeps it) unless the store already holds a newer
        version."""
        obj = self.slim(obj)
        key = object_key(obj)
        with self._lock:
            old = self.items.get(key)
            if old is None or resource_version(obj) >= resource_version(old):
                self._store(key, obj)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event into the store.

        A write's response may already be stored (`put`) when the watch delivers an older version of
        the object: the newer one stays.  Else an admitted Job would look undecided for a pass, its
        ledger entries would be dropped, and its capacity could be given twice."""
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._store(key, None)
            elif kind in ("ADDED", "MODIFIED"):
                old = self.items.get(key)
                if (old is None or resource_version(obj) >= resource_version(old)
                        or metadata_of(old).get("uid") != metadata_of(obj).get("uid")):
                    self._store(key, obj)

    # -- the shared loop's hooks -----------------------------------------------------------------

    def fetch(self) -> dict[str, Any]:
        with heap.paused():  # a big list decodes into millions of objects at once
            return super().fetch()

    def read(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.slim(obj)

    def listed(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self.items = {object_key(o): o for o in items}
            self._indexed = {name: {} for name in self._indexers}
            for name, values_of in self._indexers.items():
                for key, obj in self.items.items():
                    _index(self._indexed[name], values_of, key, obj)
        self.synced.set()  # before `changed`: a pass it wakes finds the store synced
        self.changed.set()

    def handle(self, kind: str, item: dict[str, Any]) -> None:
        self.apply(kind, item)
        if self.matters(kind, item):
            self.changed.set()


def _index(indexed: dict[Hashable, dict[str, dict[str, Any]]], values_of: Indexer, key: str,
           obj: dict[str, Any]) -> None:
    """Enter `obj` (at `key`) under each value `values_of` finds it by."""
    for value in _values(values_of, obj):
        indexed.setdefault(value, {})[key] = obj


def _values(values_of: Indexer, obj: Mapping[str, Any]) -> Iterable[Hashable]:
    """What `values_of` finds `obj` by; nothing when it cannot read it (a tenant's object that is not
    what it should be is found by no index, and costs only itself)."""
    try:
        return tuple(values_of(obj))
    except Exception:  # noqa: BLE001 - an indexer reads what a tenant wrote
        log.debug("object %s found by no index value", object_key(obj), exc_info=True)
        return ()


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

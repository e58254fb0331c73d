"""Paged lists (`KubeClient.list_paged`, the `Reflector`'s list) against a fake collection: pages joined
under the first page's resourceVersion, `continue` without `resourceVersion`, an expired continue token
listed again from the first page once, a second expiry backed off, and the caller's object hook applied
to every page as it is decoded.  On the real API server:
tests/kube/test_reflector.py, `test_a_big_collection_is_listed_in_pages_of_bounded_size`."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from agent.admission.cluster.store import Reflector as Store
from agent.api.objects import metadata_of
from agent.errors import KubeAPIError
from agent.kubeapi.backoff import Backoff
from agent.kubeapi.bulk import drop_bulk
from agent.kubeapi.client import LIST_PAGE_SIZE, REQUEST_TIMEOUT, KubeClient, ObjectHook
from agent.kubeapi.reflector import Reflector

PATH = "/api/v1/configmaps"
TOO_OLD = ("list ConfigMaps, page 2: HTTP 410: The provided continue parameter is too old to display a "
           "consistent list result. You can start a new list without the continue parameter")


class Collection(KubeClient):
    """A collection of `count` objects served in pages as the API server serves them: `limit`, then a
    `continue` token holding the offset.  Each first page is a new snapshot (its resourceVersion one
    higher); a continued page reports the collection's newest version, so only the first page's is the
    snapshot's.  The next `expire` continued pages answer 410 Gone.  Each object has `spec` besides its
    metadata; a page is decoded from JSON through the caller's object hook.  `.queries` holds every
    request's query; `.log` the requests ("list") and reads ("read") in the order they happened."""

    def __init__(self, count: int, expire: int = 0, spec: Mapping[str, Any] | None = None) -> None:
        super().__init__(object())
        self.names = [f"cm-{i:05d}" for i in range(count)]
        self.expire = expire
        self.spec = dict(spec or {})
        self.snapshots = 0
        self.queries: list[dict[str, object]] = []
        self.log: list[str] = []

    def list(self, path: str, query: Mapping[str, object] | None = None, *,
             timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None,
             object_hook: ObjectHook | None = None) -> dict[str, Any]:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        self.queries.append(q)
        self.log.append("list")
        token = q.get("continue")
        if token is None:
            self.snapshots += 1
            start = 0
        else:
            if self.expire:
                self.expire -= 1
                raise KubeAPIError(TOO_OLD, 410)
            start = int(str(token).split(":")[1])
        limit = int(str(q.get("limit", 0))) or len(self.names)
        end = min(start + limit, len(self.names))
        meta: dict[str, Any] = {"resourceVersion": str(100 + self.snapshots if token is None else 999)}
        if end < len(self.names):
            meta["continue"] = f"{self.snapshots}:{end}"
            meta["remainingItemCount"] = len(self.names) - end
        items = [{"metadata": {"name": n, "resourceVersion": "50"}, "spec": self.spec}
                 for n in self.names[start:end]]
        page = {"apiVersion": "v1", "kind": "ConfigMapList", "metadata": meta, "items": items}
        decoded: dict[str, Any] = json.loads(json.dumps(page), object_hook=object_hook)
        return decoded


class Recorder(Reflector[str]):
    """Keeps each object's name; notes each read in the collection's log; `poison-*` cannot be read."""

    def __init__(self, kube: Collection, **kw: Any) -> None:
        super().__init__(kube, PATH, "ConfigMaps", **kw)
        self.collection = kube
        self.listings: list[list[str]] = []

    def read(self, obj: dict[str, Any]) -> str:
        self.collection.log.append("read")
        name = str(metadata_of(obj)["name"])
        if name.startswith("poison"):
            raise ValueError("poisoned")
        return name

    def listed(self, items: list[str]) -> None:
        self.listings.append(items)


def test_pages_are_joined_under_the_first_pages_resource_version() -> None:
    kube = Collection(1200)
    r = Recorder(kube)
    assert r.page_size == LIST_PAGE_SIZE == 500
    assert r.relist()
    assert r.listings == [kube.names] and r.resource_version == "101" and r.lists == 1
    assert [q.get("limit") for q in kube.queries] == [500, 500, 500]
    body = kube.list_paged(PATH, page_size=500)  # the list object itself: one, without paging's marks
    assert body["metadata"] == {"resourceVersion": "102"} and body["kind"] == "ConfigMapList"
    assert [metadata_of(o)["name"] for o in body["items"]] == kube.names


def test_later_pages_pass_continue_and_never_a_resource_version() -> None:
    kube = Collection(1001)
    query = {"labelSelector": "app=x", "resourceVersion": "7", "resourceVersionMatch": "NotOlderThan"}
    kube.list_paged(PATH, query, page_size=500)
    first, *later = kube.queries
    assert first == {**query, "limit": 500}
    assert later == [{"labelSelector": "app=x", "limit": 500, "continue": "1:500"},
                     {"labelSelector": "app=x", "limit": 500, "continue": "1:1000"}]


def test_each_page_is_read_before_the_next_is_asked_for() -> None:
    kube = Collection(5)
    kube.names[3] = "poison-3"
    r = Recorder(kube, page_size=2)
    assert r.relist()
    assert kube.log == ["list", "read", "read", "list", "read", "read", "list", "read"]
    assert r.listings == [["cm-00000", "cm-00001", "cm-00002", "cm-00004"]] and r.skipped == 1


def test_page_size_none_is_one_unpaged_request() -> None:
    kube = Collection(1200)
    r = Recorder(kube, page_size=None)
    assert r.relist() and r.listings == [kube.names]
    assert kube.queries == [{}]


def test_an_expired_continue_token_lists_again_from_the_first_page(caplog: pytest.LogCaptureFixture) -> None:
    kube = Collection(1200, expire=1)
    r = Recorder(kube)
    with caplog.at_level(logging.INFO, logger="agent.kubeapi.client"):
        assert r.relist()
    assert [q.get("continue") for q in kube.queries] == [None, "1:500", None, "2:500", "2:1000"]
    assert r.listings == [kube.names]  # the first try's page is not kept: no object twice
    assert r.resource_version == "102"  # the new snapshot's
    (line,) = [m for m in caplog.messages if "expired" in m]
    assert "on page 2" in line and "listing again from the first page" in line


def test_two_expiries_in_a_row_raise() -> None:
    kube = Collection(1200, expire=2)
    r = Recorder(kube)
    with pytest.raises(KubeAPIError) as raised:
        r.relist()
    assert raised.value.status == 410 and "continue parameter is too old" in str(raised.value)
    assert [q.get("continue") for q in kube.queries] == [None, "1:500", None, "2:500"]
    assert r.listings == [] and r.resource_version is None and not r.synced.is_set()


def test_a_list_that_keeps_expiring_is_backed_off_not_retried_at_once() -> None:
    """`run` takes a 410 from the list for a failure (its back-off), not for an expired watch version
    (listed again at once): a continue token that always expires never makes a tight loop."""
    kube = Collection(1200, expire=10**6)
    r = Recorder(kube, backoff=Backoff(initial=0.01, cap=0.01))
    failures: list[str] = []

    def failed(error: object) -> float:
        failures.append(str(error))
        if len(failures) == 3:
            r._stop.set()  # run() ends after this wait: the test runs it on its own thread
        return 0.0

    r.outage.failed = failed  # type: ignore[method-assign]
    r.run()
    assert len(failures) == 3 and all("continue parameter is too old" in f for f in failures)
    assert len(kube.queries) == 3 * 4  # each failure after one restart: two first pages, two expiries


def test_the_controllers_store_lists_in_pages() -> None:
    kube = Collection(1200)
    store = Store(kube, PATH, "ConfigMaps", threading.Event())
    assert store.relist()
    assert sorted(metadata_of(o)["name"] for o in store.snapshot()) == kube.names
    assert len(kube.queries) == 3 and store.resource_version == "101"


@pytest.mark.parametrize(("hook", "containers"), [
    (None, [{"name": "main", "args": ["ab"] * 3, "resources": {"limits": {"cpu": "1"}}}]),
    (drop_bulk, [{"name": "main", "resources": {"limits": {"cpu": "1"}}}]),
], ids=["no hook: as served", "drop_bulk: the bulk gone"])
def test_the_callers_object_hook_decodes_every_page(hook: ObjectHook | None,
                                                    containers: list[dict[str, Any]]) -> None:
    spec = {"containers": [{"name": "main", "args": ["ab"] * 3, "resources": {"limits": {"cpu": "1"}}}]}
    kube = Collection(1200, spec=spec)
    store = Store(kube, PATH, "ConfigMaps", threading.Event(), object_hook=hook)
    assert store.object_hook is hook and store.relist() and len(kube.queries) == 3
    assert [o["spec"]["containers"] for o in store.snapshot()] == [containers] * 1200

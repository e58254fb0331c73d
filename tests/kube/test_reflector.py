"""The shared list+watch loop (`agent.kubeapi.reflector`) against a real API server: list then events,
a watch the server ends, 410 Gone, ERROR events, bad objects, a collection not served, an API server
restart and stop, a big collection listed in pages; then its two users, the node's `PodWatcher` and the
controller's store.  Paging's corner cases (expired continue tokens): tests/kube/test_list_pages.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agent.admission.cluster.store import Reflector as Store
from agent.api.objects import metadata_of
from agent.kube.pods.watch import Changed, Gone, PodChange, PodWatcher, Synced
from agent.kubeapi import reflector
from agent.kubeapi.backoff import Backoff
from agent.kubeapi.client import KubeClient, WatchStream, resource_path
from agent.kubeapi.reflector import Reflector
from tests.controlplane.harness import ControlPlane
from tests.kube.list_meter import ListMeter

FAST = Backoff(initial=0.05, cap=0.2)
GROUP = "reflector.test.topolet.io"
SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}


def eventually(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Spliced:
    """A real watch stream with the client's pending events put before its next real event."""

    def __init__(self, stream: WatchStream, pending: list[dict[str, Any] | None]) -> None:
        self.stream, self.pending = stream, pending

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        for event in self.stream:
            while self.pending:
                yield self.pending.pop(0)
            yield event

    def shutdown(self) -> None:
        self.stream.shutdown()

    def close(self) -> None:
        self.stream.close()


class Splicing(KubeClient):
    """The real client; `inject(...)` events arrive on the watch just before the next real one."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.pending: list[dict[str, Any] | None] = []

    def inject(self, *events: dict[str, Any] | None) -> None:
        self.pending.extend(events)

    def watch(self, path: str, query: Any = None, **kw: Any) -> Any:
        return Spliced(super().watch(path, query, **kw), self.pending)


class Recorder(Reflector[dict[str, Any]]):
    """What the loop hands on: each list's names, each event as (kind, name), and the picture both make.
    An object labelled `poison` cannot be read."""

    def __init__(self, kube: KubeClient, path: str, **kw: Any) -> None:
        self.invalid = 0
        self.failures: list[str] = []

        def count() -> None:
            self.invalid += 1
        super().__init__(kube, path, path.rsplit("/", 1)[-1], on_invalid=count, backoff=FAST, **kw)
        failed = self.outage.failed

        def failing(error: object) -> float:
            self.failures.append(str(error))
            return failed(error)
        self.outage.failed = failing  # type: ignore[method-assign]
        self.listings: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.names: set[str] = set()

    def read(self, obj: dict[str, Any]) -> dict[str, Any]:
        if "poison" in (metadata_of(obj).get("labels") or {}):
            raise ValueError("poisoned")
        return obj

    def listed(self, items: list[dict[str, Any]]) -> None:
        self.listings.append(sorted(metadata_of(o)["name"] for o in items))
        self.names = set(self.listings[-1])

    def handle(self, kind: str, item: dict[str, Any]) -> None:
        name = metadata_of(item)["name"]
        self.events.append((kind, name))
        (self.names.discard if kind == "DELETED" else self.names.add)(name)


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Splicing]:
    client = Splicing(control_plane.client())
    yield client
    client.close()


@pytest.fixture
def ns(kube: KubeClient) -> Iterator[str]:
    name = f"rf-{uuid.uuid4().hex[:8]}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    kube.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def reflectors() -> Iterator[list[Reflector[Any]]]:
    """Reflectors the test started: stopped after it, pass or fail."""
    started: list[Reflector[Any]] = []
    yield started
    for r in started:
        r.stop()


def configmaps(ns: str) -> str:
    return resource_path("", "v1", "configmaps", namespace=ns)


def put(kube: KubeClient, ns: str, name: str, labels: dict[str, str] | None = None) -> str:
    """Create the ConfigMap `name` (or bump its data); its new resourceVersion."""
    body = {"metadata": {"name": name, "labels": labels or {}}, "data": {"at": str(time.monotonic())}}
    try:
        made = kube.create(configmaps(ns), body)
    except Exception:  # noqa: BLE001 - it exists: change it
        made = kube.patch(f"{configmaps(ns)}/{name}", body, "application/merge-patch+json")
    return str(made["metadata"]["resourceVersion"])


def delete(kube: KubeClient, ns: str, name: str) -> None:
    kube.request("DELETE", f"{configmaps(ns)}/{name}")


def started(r: Reflector[Any], reflectors: list[Reflector[Any]]) -> None:
    reflectors.append(r)
    r.start()
    assert r.synced.wait(30), "the first list"


def test_lists_then_hands_on_each_event_in_order(kube: Splicing, ns: str,
                                                 reflectors: list[Reflector[Any]]) -> None:
    put(kube, ns, "a")
    put(kube, ns, "b")
    r = Recorder(kube, configmaps(ns))
    started(r, reflectors)
    assert r.listings == [["a", "b"]] and r.lists == 1
    put(kube, ns, "c")
    put(kube, ns, "a")
    delete(kube, ns, "b")
    eventually(lambda: len(r.events) == 3, "three events")
    assert r.events == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert r.names == {"a", "c"} and r.lists == 1 and r.invalid == 0 and r.failures == []
    r.request_relist()  # the agent's SIGHUP: end the watch, list again, no failure counted
    eventually(lambda: r.lists == 2, "the requested relist")
    assert r.listings[-1] == ["a", "c"] and r.failures == []


def test_a_watch_the_server_ends_is_resumed_from_its_version_without_a_list(
        kube: Splicing, ns: str, reflectors: list[Reflector[Any]]) -> None:
    r = Recorder(kube, configmaps(ns), watch_timeout_seconds=2)
    started(r, reflectors)
    eventually(lambda: r.watches >= 3, "the server to end two watches", timeout=20)
    put(kube, ns, "a")
    eventually(lambda: r.events == [("ADDED", "a")], "the event on a resumed watch")
    assert r.lists == 1 and r.failures == []


def test_error_events_back_off_and_watch_again_or_relist_on_410(kube: Splicing, ns: str,
                                                                 reflectors: list[Reflector[Any]]) -> None:
    r = Recorder(kube, configmaps(ns))
    started(r, reflectors)
    put(kube, ns, "a")
    eventually(lambda: r.events == [("ADDED", "a")], "the first event")
    # Another ERROR: back off, watch again from the same version (the event after it is not lost).
    kube.inject({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd hiccup"}})
    put(kube, ns, "b")
    eventually(lambda: ("ADDED", "b") in r.events, "the event after the error, on the next watch")
    assert r.lists == 1 and len(r.failures) == 1 and "etcd hiccup" in r.failures[0]
    assert not r.outage.ongoing
    # 410 Gone in an ERROR event: list again at once (history moved on past our version).
    kube.inject({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                             "message": "too old resource version"}})
    put(kube, ns, "c")
    eventually(lambda: r.lists == 2, "the relist")
    assert r.listings[-1] == ["a", "b", "c"] and len(r.failures) == 1
    put(kube, ns, "d")
    eventually(lambda: ("ADDED", "d") in r.events, "events after the relist")


def test_a_bad_object_costs_only_itself_and_is_never_replayed(kube: Splicing, ns: str,
                                                              reflectors: list[Reflector[Any]]) -> None:
    put(kube, ns, "listed-poison", {"poison": "yes"})
    put(kube, ns, "a")
    r = Recorder(kube, configmaps(ns))
    started(r, reflectors)
    assert r.listings == [["a"]] and r.invalid == 1  # the list goes on without it
    rv = put(kube, ns, "poison", {"poison": "yes"})
    eventually(lambda: r.invalid == 2, "the poisoned object skipped")
    assert int(r.resource_version or 0) >= int(rv)  # moved past it: a resumed watch never replays it
    kube.inject(None, {"type": "ADDED", "object": "not an object"},
                {"type": "SIDEWAYS", "object": {"metadata": {"name": "x"}}})
    put(kube, ns, "b")
    eventually(lambda: ("ADDED", "b") in r.events, "the event after the bad ones")
    assert r.invalid == 5 and r.skipped == 5 and r.lists == 1 and r.failures == []
    assert r.events == [("ADDED", "b")] and r.names == {"a", "b"}


@pytest.fixture
def crd(kube: KubeClient) -> Iterator[tuple[str, Callable[[], None]]]:
    """A Widget kind of our own, not yet installed: (its collection's path in `default`, install)."""
    plural = f"w{uuid.uuid4().hex[:8]}"
    name = f"{plural}.{GROUP}"

    def install() -> None:
        kube.create(resource_path("apiextensions.k8s.io", "v1", "customresourcedefinitions"), {
            "metadata": {"name": name},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": plural, "kind": plural.capitalize(), "listKind": f"{plural}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": SCHEMA}]}})
    yield resource_path(GROUP, "v1", plural, namespace="default"), install
    try:
        kube.request("DELETE", resource_path("apiextensions.k8s.io", "v1", "customresourcedefinitions", name))
    except Exception:  # noqa: BLE001 - never installed
        pass


def create_widget(kube: KubeClient, path: str, name: str) -> None:
    kind = path.rsplit("/", 1)[-1].capitalize()
    for _ in range(100):  # a new CRD is served a moment after it is created
        try:
            kube.create(path, {"apiVersion": f"{GROUP}/v1", "kind": kind, "metadata": {"name": name}})
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.1)
    raise AssertionError(f"could not create widget {name}")


def test_410_gone_on_the_watch_relists(kube: Splicing, crd: tuple[str, Callable[[], None]],
                                       reflectors: list[Reflector[Any]]) -> None:
    """A version older than the collection's watch cache (a new CRD's starts when it is served): the
    server answers 410 Gone; straight after a list that is a failure (backed off), then a relist."""
    path, install = crd
    install()
    create_widget(kube, path, "w1")

    class Stale(Recorder):
        def fetch(self) -> dict[str, Any]:
            body = super().fetch()
            if self.lists == 0:
                body["metadata"]["resourceVersion"] = "1"  # as if history was compacted since
            return body

    r = Stale(kube, path)
    started(r, reflectors)
    eventually(lambda: r.lists == 2, "the relist after 410 Gone")
    assert r.listings == [["w1"], ["w1"]] and len(r.failures) == 1 and "too old" in r.failures[0]
    create_widget(kube, path, "w2")
    eventually(lambda: r.events == [("ADDED", "w2")], "the watch after the relist")


def test_a_big_collection_is_listed_in_pages_of_bounded_size(
        control_plane: ControlPlane, kube: Splicing, ns: str, reflectors: list[Reflector[Any]]) -> None:
    """1,200 ConfigMaps of 1 KiB, pages of 500: three requests (the later two by `continue` alone), every
    object once, each response under half the unpaged one; the watch goes on from the first page's
    snapshot."""
    names = [f"cm-{i:04d}" for i in range(1200)]
    data = {"b": "x" * 1024}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: kube.create(configmaps(ns), {"metadata": {"name": n}, "data": data}), names))
    paged, unpaged = ListMeter(control_plane.client()), ListMeter(control_plane.client())
    try:
        r = Recorder(paged, configmaps(ns), page_size=500)
        started(r, reflectors)
        assert r.listings == [names] and r.invalid == 0
        queries = [q for q, _ in paged.lists]
        assert [q.get("limit") for q in queries] == [500, 500, 500]
        assert "continue" not in queries[0]
        assert all(q.get("continue") and "resourceVersion" not in q for q in queries[1:])
        whole = Recorder(unpaged, configmaps(ns), page_size=None)
        assert whole.relist() and whole.listings == [names]
        ((query, one_response),) = unpaged.lists
        assert "limit" not in query
        sizes = [size for _, size in paged.lists]
        assert paged.largest < one_response / 2, (sizes, one_response)  # ~500/1200 of it
        assert sum(sizes) > one_response * 0.95  # the same objects, only cut up
        put(kube, ns, "after")
        eventually(lambda: r.events == [("ADDED", "after")], "the event after the paged list")
        assert r.lists == 1 and r.failures == []
    finally:
        paged.close()
        unpaged.close()
        kube.request("DELETE", configmaps(ns))  # no namespace controller here to empty the namespace


def test_a_collection_not_served_is_empty_or_a_failure(kube: Splicing, crd: tuple[str, Callable[[], None]],
                                                        reflectors: list[Reflector[Any]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflector, "NOT_SERVED_RETRY_SECONDS", 0.2)
    path, install = crd
    empty = Recorder(kube, path, not_served_is_empty=True)  # the controller's stores (an NRT CRD)
    started(empty, reflectors)
    assert empty.listings == [[]] and empty.lists == 0 and empty.failures == []
    strict = Recorder(kube, path)  # the pod watch: a 404 is never "no pods"
    reflectors.append(strict)
    strict.start()
    eventually(lambda: strict.failures, "a failure")
    assert not strict.synced.is_set() and "404" in strict.failures[0]
    install()
    create_widget(kube, path, "w1")
    for r in (empty, strict):
        eventually(lambda: r.names == {"w1"}, "the widget, once served")  # noqa: B023
        assert r.lists >= 1


def test_an_api_server_restart_is_ridden_out_and_its_410_relists(
        control_plane: ControlPlane, kube: Splicing, ns: str, reflectors: list[Reflector[Any]]) -> None:
    put(kube, ns, "a")
    put(kube, ns, "b")
    r = Recorder(kube, configmaps(ns))
    started(r, reflectors)
    put(kube, ns, "c")
    eventually(lambda: r.names == {"a", "b", "c"}, "the event before the restart")
    other = f"elsewhere-{ns}"  # history moves on past the watch's version, where it cannot see
    put(kube, "default", other)
    delete(kube, "default", other)
    control_plane.stop_apiserver()
    try:
        eventually(lambda: r.failures and not r.connected, "the outage noticed")
        assert r.names == {"a", "b", "c"}  # nothing taken for gone while the server is away
    finally:
        control_plane.start_apiserver()
    delete(kube, ns, "a")
    put(kube, ns, "d")
    eventually(lambda: r.names == {"b", "c", "d"}, "the picture after the restart")
    eventually(lambda: not r.outage.ongoing and r.connected, "the outage over")
    # The restarted server's watch cache starts past the watch's version: 410 Gone, relisted at once.
    assert r.lists == 2 and r.invalid == 0


def test_stop_ends_a_blocked_watch_at_once(kube: Splicing, ns: str, reflectors: list[Reflector[Any]]) -> None:
    r = Recorder(kube, configmaps(ns))
    started(r, reflectors)
    eventually(lambda: r.watches == 1, "the watch")
    time.sleep(0.2)  # blocked reading the stream
    began = time.monotonic()
    r.stop()
    assert time.monotonic() - began < 2.0
    assert r._thread is not None and not r._thread.is_alive()
    put(kube, ns, "late")
    time.sleep(0.5)
    assert r.events == [] and r.lists == 1


def test_the_pod_watch_hands_on_this_nodes_pods(kube: Splicing, ns: str,
                                                reflectors: list[Reflector[Any]]) -> None:
    node = f"node-{ns}"
    kube.create(resource_path("", "v1", "serviceaccounts", namespace=ns), {"metadata": {"name": "default"}})
    pods = resource_path("", "v1", "pods", namespace=ns)

    def pod(name: str, on: str) -> dict[str, Any]:
        return kube.create(pods, {"metadata": {"name": name}, "spec": {
            "nodeName": on, "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "busybox"}]}})

    first = pod("first", node)
    changes: list[PodChange] = []
    lists = []
    w = PodWatcher(kube, node, changes.append, backoff=FAST, on_list=lambda: lists.append(1))
    started(w, reflectors)
    (synced,) = changes
    assert isinstance(synced, Synced) and list(synced.plans) == [first["metadata"]["uid"]]
    pod("elsewhere", "another-node")
    pod("second", node)
    kube.request("DELETE", f"{pods}/first", query={"gracePeriodSeconds": 0})  # no kubelet to wait for
    eventually(lambda: any(isinstance(c, Gone) for c in changes), "the deletion")
    seen = [(type(c).__name__, c.plan.name if isinstance(c, Changed) else getattr(c, "uid", ""))
            for c in changes[1:]]
    assert ("Changed", "second") in seen and ("Gone", first["metadata"]["uid"]) in seen
    assert all(c.plan.name != "elsewhere" for c in changes if isinstance(c, Changed))
    assert lists == [1]


def test_the_controllers_store_holds_the_collection(kube: Splicing, ns: str,
                                                    reflectors: list[Reflector[Any]]) -> None:
    put(kube, ns, "a")
    changed = threading.Event()
    store = Store(kube, configmaps(ns), "ConfigMaps", changed,
                  matters=lambda kind, obj: metadata_of(obj)["name"] != "quiet")
    started(store, reflectors)
    assert changed.wait(5) and [metadata_of(o)["name"] for o in store.snapshot()] == ["a"]
    changed.clear()
    put(kube, ns, "quiet")
    eventually(lambda: len(store.snapshot()) == 2, "the quiet one stored")
    assert not changed.is_set()
    delete(kube, ns, "a")
    assert changed.wait(10)
    assert [metadata_of(o)["name"] for o in store.snapshot()] == ["quiet"]

"""A controller store's indexes (agent/admission/cluster/store.py `indexes=`, `.by`): kept as objects
are listed, watched, written and deleted, so a pass finds one owner's pods without reading them all."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agent.admission.cluster.store import Reflector
from agent.admission.gangs.jobset import JOBSET_UID_LABEL, jobset_keys
from agent.admission.gangs.slots import owner_keys, pods_by_owner


def _pod(name: str, owner: str | None, rv: str = "1", ns: str = "team", uid: str | None = None,
         jobset: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid or f"u-{name}", "resourceVersion": rv}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "Job", "name": owner, "uid": owner, "controller": True},
                                   {"kind": "Other", "name": "x", "uid": "not-the-controller"}]
    if jobset is not None:
        meta["labels"] = {JOBSET_UID_LABEL: jobset}
    return {"metadata": meta, "spec": {}}


def _store() -> Reflector:
    return Reflector(None, "/api/v1/pods", "pods", threading.Event(),  # type: ignore[arg-type]
                     indexes={"owner": owner_keys, "jobset": jobset_keys})


def _names(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def test_objects_move_between_index_values_as_they_change() -> None:
    store = _store()
    store.listed([_pod("a", "job1"), _pod("b", "job1"), _pod("c", "job2", jobset="js"), _pod("d", None)])
    assert _names(store.by("owner", ("team", "job1"))) == ["a", "b"]
    assert _names(store.by("jobset", ("team", "js"))) == ["c"]
    assert store.by("owner", ("team", "not-the-controller")) == []  # only the controller reference
    assert store.by("owner", ("other-namespace", "job1")) == []

    store.handle("MODIFIED", _pod("b", "job2", rv="2"))  # its owner reference rewritten
    assert _names(store.by("owner", ("team", "job1"))) == ["a"]
    assert _names(store.by("owner", ("team", "job2"))) == ["b", "c"]
    store.handle("MODIFIED", _pod("b", "job1", rv="1"))  # an older version: the newer one stays
    assert _names(store.by("owner", ("team", "job2"))) == ["b", "c"]

    store.put(_pod("e", "job1", rv="3"))  # a write's response
    store.handle("DELETED", _pod("a", "job1", rv="4"))
    assert _names(store.by("owner", ("team", "job1"))) == ["e"]
    store.handle("DELETED", _pod("e", "job1", rv="5"))
    assert store.by("owner", ("team", "job1")) == []
    assert store._indexed["owner"].get(("team", "job1")) is None  # noqa: SLF001 - nothing left behind

    store.handle("ADDED", _pod("c", None, rv="9", uid="new-uid"))  # re-created: found by its new self
    assert _names(store.by("owner", ("team", "job2"))) == ["b"] and store.by("jobset", ("team", "js")) == []


def test_a_relist_rebuilds_the_indexes() -> None:
    store = _store()
    store.listed([_pod("a", "job1"), _pod("b", "job1")])
    store.listed([_pod("b", "job1", rv="7"), _pod("z", "job3")])
    assert _names(store.by("owner", ("team", "job1"))) == ["b"]
    assert store.by("owner", ("team", "job1"))[0]["metadata"]["resourceVersion"] == "7"
    assert _names(store.by("owner", ("team", "job3"))) == ["z"]


@pytest.mark.parametrize("refs", [
    "not a list", [None], [{"controller": "yes", "uid": "job1"}], [["odd"]], 12,
])
def test_a_tenants_odd_pod_is_found_by_no_owner_and_costs_only_itself(refs: object) -> None:
    store = _store()
    odd = _pod("odd", None)
    odd["metadata"]["ownerReferences"] = refs
    store.listed([odd, _pod("a", "job1")])
    store.handle("MODIFIED", {**odd, "metadata": {**odd["metadata"], "resourceVersion": "2"}})
    assert _names(store.by("owner", ("team", "job1"))) == ["a"]
    assert len(store.snapshot()) == 2


def test_an_indexer_that_raises_leaves_the_object_stored_and_found_by_nothing() -> None:
    def broken(obj: object) -> tuple[str, ...]:
        raise ValueError("cannot read")

    store = Reflector(None, "/x", "things", threading.Event(), indexes={"b": broken})  # type: ignore[arg-type]
    store.listed([_pod("a", "job1")])
    store.handle("DELETED", _pod("a", "job1", rv="2"))
    assert store.snapshot() == [] and store.by("b", "anything") == []


def test_the_store_index_agrees_with_the_pure_reading() -> None:
    pods = [_pod(f"p{i}", f"job{i % 3}", ns=f"ns{i % 2}") for i in range(12)]
    store = _store()
    store.listed(pods)
    for key, members in pods_by_owner(pods).items():
        assert _names(store.by("owner", key)) == _names([dict(p) for p in members])

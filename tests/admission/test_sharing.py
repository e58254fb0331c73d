"""The table that holds the parts many stored objects have in common once
(agent/admission/cluster/sharing.py), and the pod and NRT stores' use of it (slim_pod, slim_nrt)."""

from __future__ import annotations

import copy
import gc
import threading

import pytest

from agent.admission.cluster import sharing as sharing_module
from agent.admission.cluster.sharing import Sharing, shared_strings
from agent.admission.cluster.slim import slim_nrt, slim_pod


def _pod(i: int, job: str = "train", cpu: str = "4") -> dict:
    return {
        "metadata": {"name": f"{job}-{i}", "namespace": "ns", "uid": f"uid-{job}-{i}",
                     "resourceVersion": str(i), "labels": {"job-name": job, "app": "x"},
                     "ownerReferences": [{"kind": "Job", "name": job, "uid": f"job-{job}",
                                          "controller": True}]},
        "spec": {"nodeName": f"node-{i % 3}",
                 "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                                               "limits": {"cpu": cpu, "memory": "1Gi"}}}]},
        "status": {"phase": "Running", "qosClass": "Guaranteed",
                   "containerStatuses": [{"name": "main", "containerID": f"containerd://{i:064x}",
                                          "state": {"running": {"startedAt": "2026-12-08T00:00:00Z"}}}]},
    }


def test_a_shared_pod_equals_the_unshared_one_and_holds_common_parts_once() -> None:
    table = Sharing()
    a, b = slim_pod(_pod(1), table), slim_pod(_pod(2), table)
    assert a == slim_pod(_pod(1)) and b == slim_pod(_pod(2))
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["metadata"]["ownerReferences"] is b["metadata"]["ownerReferences"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    assert a["status"]["containerStatuses"][0]["state"] is b["status"]["containerStatuses"][0]["state"]
    # A pod's own parts (its uid, node and container IDs are in them) are its own, never looked up.
    assert a["metadata"] is not b["metadata"]
    assert a["status"]["containerStatuses"] is not b["status"]["containerStatuses"]
    # Another Job's pods share nothing of the first's that differs.
    c = slim_pod(_pod(3, job="other", cpu="2"), table)
    assert c["spec"]["containers"] is not a["spec"]["containers"]
    assert c["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}


@pytest.mark.parametrize(("one", "other"), [
    ({"a": True}, {"a": 1}),
    ({"a": 1}, {"a": 1.0}),
    ([0], [False]),
    ({"a": None}, {"a": "null"}),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # equal as dicts; held apart (the order is part of the text)
    ([{"x": "1"}], [{"x": "1"}, {"x": "1"}]),
])
def test_parts_that_differ_as_json_are_never_merged(one: object, other: object) -> None:
    table = Sharing()
    got_one, got_other = table.tree(copy.deepcopy(one)), table.tree(copy.deepcopy(other))
    assert got_one == one and got_other == other
    assert type(got_one) is type(one) and _types(got_one) == _types(one)
    assert _types(got_other) == _types(other)
    if one != other:
        assert got_one is not got_other


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_a_hash_collision_keeps_both_parts_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharing_module, "_encode", lambda value: "same text for every part")
    table = Sharing()
    a, b = table.tree({"cpu": "1"}), table.tree({"cpu": "2"})
    assert a == {"cpu": "1"} and b == {"cpu": "2"}
    assert table.tree({"cpu": "1"}) is a  # the first holder of the key is still shared


def test_what_is_not_json_is_held_as_it_is() -> None:
    table = Sharing()
    odd = {"a": {1, 2}}
    assert table.tree(odd) == odd
    assert table.tree("text") == "text" and table.tree(5) == 5 and table.tree(None) is None


def test_the_table_drops_the_parts_no_object_holds() -> None:
    """A tenant's unique labels cost the table only while their pods live: after they are gone the
    table holds no more than its floor and the parts still held."""
    table = Sharing()
    kept = [table.tree({"labels": {"tenant": f"value-{i}"}}) for i in range(50)]
    for i in range(20_000):  # each dropped by the caller at once
        table.tree({"unique": str(i)})
    gc.collect()
    assert table.held <= 2 * sharing_module._FLOOR + len(kept)  # noqa: SLF001
    again = [table.tree({"labels": {"tenant": f"value-{i}"}}) for i in range(50)]
    assert all(a is b for a, b in zip(kept, again, strict=True))


def test_many_threads_share_one_table() -> None:
    table = Sharing()
    errors: list[BaseException] = []
    held: list[list[object]] = [[] for _ in range(4)]

    def work(k: int) -> None:
        try:
            for i in range(3_000):
                held[k].append(table.tree({"common": [1, 2, 3], "mine": i % 500}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(held[k][i] == {"common": [1, 2, 3], "mine": i % 500} for k in range(4) for i in range(3_000))
    assert len({id(v) for row in held for v in row}) <= 500 * 2  # equal parts mostly one copy


def test_shared_strings_interns_every_string() -> None:
    value = shared_strings({"".join(["k", "ey"]): ["".join(["va", "lue"]), 1]})
    assert next(iter(value)) is "key"  # noqa: F632 - identity is what interning promises
    assert value["key"][0] is "value"  # noqa: F632


def test_nrts_share_their_common_parts() -> None:
    def nrt(name: str, available: str) -> dict:
        return {"metadata": {"name": name, "uid": f"u-{name}"},
                "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                               {"name": "nodeTopologyPodsFingerprint", "value": f"pfp0v001{name}"}],
                "zones": [{"name": "node-0", "type": "Node", "costs": [{"name": "node-0", "value": 10}],
                           "resources": [{"name": "cpu", "capacity": "32", "allocatable": "30",
                                          "available": available},
                                         {"name": "memory", "capacity": "64Gi", "allocatable": "60Gi",
                                          "available": "60Gi"}]}]}

    table = Sharing()
    a, b = slim_nrt(nrt("a", "30"), table), slim_nrt(nrt("b", "12"), table)
    assert a == slim_nrt(nrt("a", "30")) and b == slim_nrt(nrt("b", "12"))
    za, zb = a["zones"][0], b["zones"][0]
    assert za["costs"] is zb["costs"] and za["resources"][1] is zb["resources"][1]
    assert za["resources"][0] is not zb["resources"][0]
    assert a["attributes"][0] is b["attributes"][0] and a["attributes"][1] != b["attributes"][1]

"""agent.kubeapi.client.KubeClient: raw JSON requests on a real API server — round trips, error mapping, token
refresh, watch — and no generated API classes or models loaded on the way."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.errors import ConfigError, KubeAPIError
from agent.kubeapi import client as client_module
from agent.kubeapi.client import KubeClient, load_api_client, resource_path
from tests.conftest import REPO
from tests.controlplane.harness import ControlPlane

MERGE = "application/merge-patch+json"


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[KubeClient]:
    with control_plane.client() as api:
        yield KubeClient(api)


@pytest.fixture
def namespace(kube: KubeClient) -> str:
    name = f"client-{uuid.uuid4().hex[:8]}"
    kube.create(resource_path("", "v1", "namespaces"),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def configmaps(namespace: str, name: str | None = None) -> str:
    return resource_path("", "v1", "configmaps", name, namespace=namespace)


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


# ---- paths and queries (pure) --------------------------------------------------------------------

@pytest.mark.parametrize(("args", "kw", "path"), [
    (("", "v1"), {}, "/api/v1"),
    (("", "v1", "nodes"), {}, "/api/v1/nodes"),
    (("", "v1", "nodes", "worker-1"), {}, "/api/v1/nodes/worker-1"),
    (("", "v1", "pods", "p"), {"namespace": "ns", "subresource": "status"},
     "/api/v1/namespaces/ns/pods/p/status"),
    (("nfd.k8s-sigs.io", "v1alpha1"), {}, "/apis/nfd.k8s-sigs.io/v1alpha1"),
    (("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", "n.example"), {},
     "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/n.example"),
    (("", "v1", "events", "a/b?c"), {"namespace": "ns"}, "/api/v1/namespaces/ns/events/a%2Fb%3Fc"),
])
def test_resource_path(args: tuple[str, ...], kw: dict[str, str], path: str) -> None:
    assert resource_path(*args, **kw) == path


def test_a_client_needs_an_api_client() -> None:
    with pytest.raises(ConfigError):
        KubeClient(None)
    with pytest.raises(ConfigError):
        KubeClient.of(None)


# ---- requests on a real API server ---------------------------------------------------------------

def test_create_get_list_patch_apply_round_trip(kube: KubeClient, namespace: str) -> None:
    made = kube.create(configmaps(namespace), configmap("a", k="1"))
    assert isinstance(made, dict) and made["data"] == {"k": "1"} and made["metadata"]["uid"]
    assert kube.get(configmaps(namespace, "a"))["metadata"]["uid"] == made["metadata"]["uid"]

    patched = kube.patch(configmaps(namespace, "a"), {"data": {"k": "2"}}, MERGE)
    assert patched["data"] == {"k": "2"}

    applied = kube.apply(configmaps(namespace, "b"), configmap("b", x="y"), "topolet-test")
    assert applied["data"] == {"x": "y"}
    managers = {m["manager"]: m["operation"] for m in applied["metadata"]["managedFields"]}
    assert managers == {"topolet-test": "Apply"}

    listed = kube.list(configmaps(namespace), {"fieldSelector": "metadata.name=b", "limit": None})
    assert [i["metadata"]["name"] for i in listed["items"]] == ["b"]
    assert listed["metadata"]["resourceVersion"]


def test_apply_conflict_is_forced_only_when_asked(kube: KubeClient, namespace: str) -> None:
    kube.apply(configmaps(namespace, "c"), configmap("c", k="mine"), "owner-a")
    with pytest.raises(KubeAPIError) as conflict:
        kube.apply(configmaps(namespace, "c"), configmap("c", k="theirs"), "owner-b", force=False)
    assert conflict.value.status == 409
    assert kube.apply(configmaps(namespace, "c"), configmap("c", k="theirs"), "owner-b")["data"] == {
        "k": "theirs"}


def test_errors_carry_the_status_and_the_servers_message(
        control_plane: ControlPlane, kube: KubeClient, namespace: str) -> None:
    with pytest.raises(KubeAPIError) as missing:
        kube.get(configmaps(namespace, "absent"), what="get the absent one")
    assert missing.value.not_found and missing.value.status == 404
    assert str(missing.value).startswith("get the absent one: HTTP 404")
    assert '"absent" not found' in str(missing.value)

    with pytest.raises(KubeAPIError) as invalid:
        kube.create(configmaps(namespace), configmap("Not_A_Name"))
    assert invalid.value.status == 422 and not invalid.value.not_found

    with control_plane.client(control_plane.unprivileged_token) as api:
        with pytest.raises(KubeAPIError) as refused:
            KubeClient(api).get(configmaps(namespace, "absent"))
    assert refused.value.status == 403


def test_server_down_is_an_error_without_status(control_plane: ControlPlane, kube: KubeClient) -> None:
    control_plane.stop_apiserver()
    try:
        with pytest.raises(KubeAPIError) as down:
            kube.get(resource_path("", "v1", "nodes"), timeout=(1.0, 2.0))
        assert down.value.status is None
        assert "unreachable" in str(down.value)
    finally:
        control_plane.start_apiserver()
    assert "items" in kube.list(resource_path("", "v1", "nodes"))


def test_a_refused_token_is_asked_for_again_at_once(
        control_plane: ControlPlane, namespace: str) -> None:
    """What the in-cluster loader relies on to pick up a rotated service-account token: after a 401
    the next request asks the refresh hook again, however recent the last ask."""
    tokens = iter(["not-a-valid-token", control_plane.admin_token])
    with control_plane.client() as api:
        conf = api.configuration
        calls: list[str] = []

        def refresh(c: Any) -> None:
            calls.append("refresh")
            c.api_key["BearerToken"] = next(tokens, control_plane.admin_token)
            c.api_key_prefix["BearerToken"] = "Bearer"

        conf.api_key.pop("authorization", None)
        conf.api_key["BearerToken"] = "stale"
        conf.refresh_api_key_hook = refresh
        kube = KubeClient(api)
        with pytest.raises(KubeAPIError) as rejected:
            kube.get(configmaps(namespace, "x"))
        assert rejected.value.status == 401
        with pytest.raises(KubeAPIError) as now_valid:
            kube.get(configmaps(namespace, "x"))
        assert now_valid.value.status == 404  # authenticated: the refreshed token was sent
        assert calls == ["refresh", "refresh"]


def test_the_token_is_asked_for_again_after_auth_refresh_seconds(
        control_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepted headers are reused for AUTH_REFRESH_SECONDS, then the refresh hook is asked again (a
    rotated token replaces the old one before that expires)."""
    with control_plane.client() as api:
        conf = api.configuration
        calls: list[str] = []

        def refresh(c: Any) -> None:
            calls.append("refresh")
            c.api_key["BearerToken"] = control_plane.admin_token
            c.api_key_prefix["BearerToken"] = "Bearer"

        conf.api_key.pop("authorization", None)
        conf.api_key["BearerToken"] = "stale"  # the hook replaces it before the first request
        conf.refresh_api_key_hook = refresh
        kube = KubeClient(api)
        monkeypatch.setattr(client_module, "AUTH_REFRESH_SECONDS", 3600.0)
        for _ in range(3):
            with pytest.raises(KubeAPIError) as missing:
                kube.get(configmaps(namespace, "x"))
            assert missing.value.status == 404
        assert calls == ["refresh"]
        monkeypatch.setattr(client_module, "AUTH_REFRESH_SECONDS", 0.0)
        assert kube.list(configmaps(namespace))["items"] == []
        assert calls == ["refresh", "refresh"]


def test_kubeconfig_client(control_plane: ControlPlane) -> None:
    kube = KubeClient(load_api_client(str(control_plane.kubeconfig)))
    try:
        assert kube.get(resource_path("", "v1", "namespaces", "default"))["metadata"]["name"] == "default"
    finally:
        kube.close()


# ---- watch ---------------------------------------------------------------------------------------

def test_watch_streams_events_as_dicts(kube: KubeClient, namespace: str) -> None:
    listed = kube.list(configmaps(namespace))
    with kube.watch(configmaps(namespace), {"resourceVersion": listed["metadata"]["resourceVersion"],
                                            "timeoutSeconds": 30}, timeout=(3.0, 40.0)) as stream:
        kube.create(configmaps(namespace), configmap("w", k="1"))
        kube.patch(configmaps(namespace, "w"), {"data": {"k": "2"}}, MERGE)
        seen: list[tuple[str, str]] = []
        for event in stream:
            assert event is not None
            seen.append((event["type"], event["object"]["data"]["k"]))
            if len(seen) == 2:
                break
    assert seen == [("ADDED", "1"), ("MODIFIED", "2")]


def test_watch_shutdown_wakes_a_blocked_reader(kube: KubeClient, namespace: str) -> None:
    stream = kube.watch(configmaps(namespace), {"timeoutSeconds": 60}, timeout=(3.0, 90.0))
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.extend(e for e in stream if e is not None and e.get("type") != "ADDED")
            outcome.append("ended")
        except KubeAPIError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive()  # nothing to read: blocked on the socket
    stream.shutdown()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert len(outcome) == 1 and (outcome[0] == "ended" or isinstance(outcome[0], KubeAPIError))
    stream.close()


def test_watch_of_a_missing_resource_is_an_api_error(kube: KubeClient) -> None:
    with pytest.raises(KubeAPIError) as err:
        kube.watch(resource_path("topology.node.k8s.io", "v1alpha2", "notserved"))
    assert err.value.status == 404


# ---- no model machinery ------------------------------------------------------------------------

_PROBE = """
import json, sys
from agent.kubeapi.client import KubeClient, load_api_client, resource_path
kube = KubeClient(load_api_client(sys.argv[1]))
ns = sys.argv[2]
kube.list(resource_path("", "v1", "pods"), {"fieldSelector": "spec.nodeName=none"})
kube.apply(resource_path("", "v1", "configmaps", "m", namespace=ns),
           {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}}, "probe")
with kube.watch(resource_path("", "v1", "configmaps", namespace=ns), {"timeoutSeconds": 1}) as stream:
    list(stream)
print(json.dumps(sorted(m for m in sys.modules
                        if m.startswith(("kubernetes.client.api.", "kubernetes.client.models.")))))
"""


def test_requests_load_no_generated_api_class_or_model(control_plane: ControlPlane, namespace: str) -> None:
    """The generated classes build pydantic schemas (~20 MiB) the agent has no use for."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(control_plane.kubeconfig), namespace],
                         capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []

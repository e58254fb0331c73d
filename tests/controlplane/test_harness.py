"""The test control plane: a real API server that authenticates, authorizes, mints bound tokens, restarts."""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import HERE, ControlPlane, decode_jwt_payload

try:
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with control_plane.client() as api:
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    with control_plane.client() as api:
        k8s.CoreV1Api(api).delete_namespace(name)


def make_service_account(plane: ControlPlane, namespace: str, name: str = "agent") -> str:
    with plane.client() as api:
        k8s.CoreV1Api(api).create_namespaced_service_account(
            namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name)))
    return name


def make_node(plane: ControlPlane) -> tuple[str, str]:
    name = f"node-{uuid.uuid4().hex[:8]}"
    with plane.client() as api:
        node = k8s.CoreV1Api(api).create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name)))
    return name, node.metadata.uid


def make_pod(plane: ControlPlane, namespace: str, sa: str, node_name: str | None) -> tuple[str, str]:
    """A pod already bound to node_name (no scheduler runs here), as the API stores it."""
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=f"pod-{uuid.uuid4().hex[:8]}"),
        spec=k8s.V1PodSpec(service_account_name=sa, node_name=node_name,
                           containers=[k8s.V1Container(name="c", image="registry.k8s.io/pause:3.10")]),
    )
    with plane.client() as api:
        made = k8s.CoreV1Api(api).create_namespaced_pod(namespace, pod)
    return made.metadata.name, made.metadata.uid


def who_am_i(plane: ControlPlane, token: str) -> Any:
    """The user the API server authenticates token as (SelfSubjectReview)."""
    with plane.client(token) as api:
        review = k8s.AuthenticationV1Api(api).create_self_subject_review(k8s.V1SelfSubjectReview())
    return review.status.user_info


def list_pods_status(plane: ControlPlane, token: str, namespace: str) -> int:
    """HTTP status of listing pods in namespace with token."""
    with plane.client(token) as api:
        try:
            k8s.CoreV1Api(api).list_namespaced_pod(namespace)
        except ApiException as exc:
            return int(exc.status)
    return 200


def test_server_answers_with_the_built_release(control_plane: ControlPlane) -> None:
    go_mod = (HERE / "apiserver" / "go.mod").read_text()
    pinned = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", go_mod, re.M)
    assert pinned is not None
    with control_plane.client() as api:
        info = k8s.VersionApi(api).get_code()
        assert info.git_version == pinned.group(1)
        names = {ns.metadata.name for ns in k8s.CoreV1Api(api).list_namespace().items}
    assert {"default", "kube-system"} <= names
    assert control_plane.raw_get("/readyz", token=control_plane.admin_token)[0] == 200


def test_admin_kubeconfig_works(control_plane: ControlPlane) -> None:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    with api:
        user = k8s.AuthenticationV1Api(api).create_self_subject_review(k8s.V1SelfSubjectReview())
    assert user.status.user_info.username == "admin"
    assert "system:masters" in user.status.user_info.groups


@pytest.mark.parametrize("token", [None, "", "not-a-token"])
def test_requests_without_valid_credentials_are_rejected(
    control_plane: ControlPlane, token: str | None
) -> None:
    status, _ = control_plane.raw_get("/api/v1/namespaces", token=token)
    assert status == 401


def test_rbac_denies_unprivileged_user_and_allows_what_is_bound(
    control_plane: ControlPlane, namespace: str
) -> None:
    assert list_pods_status(control_plane, control_plane.unprivileged_token, namespace) == 403
    sa = make_service_account(control_plane, namespace)
    token = control_plane.mint_token(namespace, sa)
    assert list_pods_status(control_plane, token, namespace) == 403

    with control_plane.client() as api:
        rbac = k8s.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(namespace, k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name="read-pods"),
            rules=[k8s.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])]))
        rbac.create_namespaced_role_binding(namespace, k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="read-pods"),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-pods"),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=namespace)]))
    assert list_pods_status(control_plane, token, namespace) == 200
    # The grant is namespaced: the same token still may not list pods elsewhere.
    assert list_pods_status(control_plane, token, "default") == 403


def test_pod_bound_token_carries_the_pods_node(control_plane: ControlPlane, namespace: str) -> None:
    sa = make_service_account(control_plane, namespace)
    node_name, node_uid = make_node(control_plane)
    pod_name, pod_uid = make_pod(control_plane, namespace, sa, node_name)

    token = control_plane.mint_token(namespace, sa, bound_pod=(pod_name, pod_uid))

    claims = decode_jwt_payload(token)
    assert claims["sub"] == f"system:serviceaccount:{namespace}:{sa}"
    assert claims["kubernetes.io"]["pod"] == {"name": pod_name, "uid": pod_uid}
    assert claims["kubernetes.io"]["node"] == {"name": node_name, "uid": node_uid}
    user = who_am_i(control_plane, token)
    assert user.username == f"system:serviceaccount:{namespace}:{sa}"
    assert user.extra[NODE_NAME_EXTRA] == [node_name]
    assert user.extra["authentication.kubernetes.io/pod-uid"] == [pod_uid]


def test_token_of_unscheduled_pod_has_no_node(control_plane: ControlPlane, namespace: str) -> None:
    sa = make_service_account(control_plane, namespace)
    pod_name, pod_uid = make_pod(control_plane, namespace, sa, None)
    token = control_plane.mint_token(namespace, sa, bound_pod=(pod_name, pod_uid))
    assert "node" not in decode_jwt_payload(token)["kubernetes.io"]
    assert NODE_NAME_EXTRA not in (who_am_i(control_plane, token).extra or {})


def test_node_bound_token(control_plane: ControlPlane, namespace: str) -> None:
    sa = make_service_account(control_plane, namespace)
    node_name, node_uid = make_node(control_plane)
    token = control_plane.mint_token(namespace, sa, node=(node_name, node_uid))
    assert decode_jwt_payload(token)["kubernetes.io"]["node"] == {"name": node_name, "uid": node_uid}
    assert who_am_i(control_plane, token).extra[NODE_NAME_EXTRA] == [node_name]


def test_token_dies_with_its_pod(control_plane: ControlPlane, namespace: str) -> None:
    sa = make_service_account(control_plane, namespace)
    pod_name, pod_uid = make_pod(control_plane, namespace, sa, None)
    token = control_plane.mint_token(namespace, sa, bound_pod=(pod_name, pod_uid))
    assert who_am_i(control_plane, token).username.endswith(f":{sa}")
    with control_plane.client() as api:
        k8s.CoreV1Api(api).delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
    # The API server caches a successful token review for a few seconds; the token must fail after that.
    deadline = time.monotonic() + 60
    while control_plane.raw_get("/api", token=token)[0] != 401 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert control_plane.raw_get("/api", token=token)[0] == 401


def test_token_binds_to_one_object(control_plane: ControlPlane) -> None:
    with pytest.raises(ValueError):
        control_plane.mint_token("default", "default", bound_pod=("p", "1"), node=("n", "2"))


def test_token_kubeconfig(control_plane: ControlPlane, namespace: str, tmp_path: Any) -> None:
    from kubernetes import config

    sa = make_service_account(control_plane, namespace)
    path = control_plane.write_kubeconfig(tmp_path / "sa.kubeconfig", control_plane.mint_token(namespace, sa))
    with config.new_client_from_config(config_file=str(path)) as api:
        review = k8s.AuthenticationV1Api(api).create_self_subject_review(k8s.V1SelfSubjectReview())
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:{sa}"


def test_apiserver_stops_and_restarts_on_the_same_port_and_data(
    control_plane: ControlPlane, namespace: str
) -> None:
    payload = {"key": uuid.uuid4().hex}
    with control_plane.client() as api:
        k8s.CoreV1Api(api).create_namespaced_config_map(
            namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="keep"), data=payload))

    control_plane.stop_apiserver()
    assert not control_plane.apiserver_running()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", control_plane.port), timeout=2):
        pass

    control_plane.start_apiserver()
    assert control_plane.apiserver_running()
    with control_plane.client() as api:
        kept = k8s.CoreV1Api(api).read_namespaced_config_map("keep", namespace)
    assert kept.data == payload


def test_admission_policy_sees_the_node_of_a_pod_bound_token(
    control_plane: ControlPlane, namespace: str
) -> None:
    """ValidatingAdmissionPolicy is enforced and reads the node claim from a pod-bound token's user."""
    sa = make_service_account(control_plane, namespace)
    node_name, _ = make_node(control_plane)
    pod_name, pod_uid = make_pod(control_plane, namespace, sa, node_name)
    token = control_plane.mint_token(namespace, sa, bound_pod=(pod_name, pod_uid))
    policy = f"own-node-only-{namespace}"
    same_node = (
        f"'{NODE_NAME_EXTRA}' in request.userInfo.extra"
        f" && object.metadata.name == request.userInfo.extra['{NODE_NAME_EXTRA}'][0]"
    )
    with control_plane.client() as api:
        rbac = k8s.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(namespace, k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name="write-cm"),
            rules=[k8s.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["create"])]))
        rbac.create_namespaced_role_binding(namespace, k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="write-cm"),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="write-cm"),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=namespace)]))
        adm = k8s.AdmissionregistrationV1Api(api)
        adm.create_validating_admission_policy(k8s.V1ValidatingAdmissionPolicy(
            metadata=k8s.V1ObjectMeta(name=policy),
            spec=k8s.V1ValidatingAdmissionPolicySpec(
                failure_policy="Fail",
                match_constraints=k8s.V1MatchResources(resource_rules=[k8s.V1NamedRuleWithOperations(
                    api_groups=[""], api_versions=["v1"], operations=["CREATE"], resources=["configmaps"])]),
                validations=[k8s.V1Validation(expression=same_node, reason="Forbidden")])))
        adm.create_validating_admission_policy_binding(k8s.V1ValidatingAdmissionPolicyBinding(
            metadata=k8s.V1ObjectMeta(name=policy),
            spec=k8s.V1ValidatingAdmissionPolicyBindingSpec(
                policy_name=policy, validation_actions=["Deny"],
                match_resources=k8s.V1MatchResources(namespace_selector=k8s.V1LabelSelector(
                    match_labels={"kubernetes.io/metadata.name": namespace})))))

    def create_status(name: str) -> int:
        with control_plane.client(token) as api:
            try:
                k8s.CoreV1Api(api).create_namespaced_config_map(
                    namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name)))
            except ApiException as exc:
                return int(exc.status)
        return 201

    # A new policy takes effect once the API server's policy informer has it.
    deadline = time.monotonic() + 60
    attempt = 0
    while create_status(f"elsewhere-{attempt}") != 403 and time.monotonic() < deadline:
        attempt += 1
        time.sleep(0.5)
    assert create_status("elsewhere") == 403
    assert create_status(node_name) == 201

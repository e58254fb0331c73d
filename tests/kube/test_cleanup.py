"""`topolet cleanup --objects` against the real API server, and the node-cleanup DaemonSet it builds.

topolet's NodeResourceTopology, NodeFeature and Node labels go; another publisher's NRT
(`nfd-topology-updater`'s), nfd-worker's NodeFeature, labels topolet never set and both CRDs stay.
A second run finds nothing and succeeds; an API server that is not there is one line and exit 2.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent.api import nrt
from agent.enforce.state import State
from agent.kube.cleanup.nodes import CLEANUP_LABELS, CLEANUP_OF_LABEL, cleanup_daemonset
from agent.kube.publish.labels_sink import MANAGED_LABELS_ANNOTATION, LabelPublisher
from agent.kube.publish.nrt import nrt_object
from agent.kube.publish.nrt_publisher import NRTPublisher
from agent.labels.nodefeature import NODE_NAME_LABEL, nodefeature_name
from tests.conftest import REPO, topolet_bin
from tests.controlplane.harness import ControlPlane
from tests.kube.test_labels_sink import NODEFEATURE_CRD
from tests.kube.test_nrt import NRT_CRD, TWO_SOCKETS_AND_CXL, install_crd
from tests.kube.test_nrt_coexistence import NFD, nfd_nrt

LABELS = {"feature.node.kubernetes.io/cpu-hardware_multithreading": "true", "topolet.io/numa.nodes": "2"}
NFD_CRD_NAME = "nodefeatures.nfd.k8s-sigs.io"
NRT_CRD_NAME = "noderesourcetopologies.topology.node.k8s.io"


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[Any]:
    """An admin ApiClient with both CRDs installed (as NFD would have installed them)."""
    with control_plane.client() as client:
        install_crd(client, NRT_CRD)
        install_crd(client, NODEFEATURE_CRD)
        yield client


@pytest.fixture
def namespace(api: Any) -> str:
    """A fresh namespace (never deleted: without a controller-manager it would not finish deleting)."""
    from kubernetes import client as k8s

    name = f"cleanup-{uuid.uuid4().hex[:8]}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    return name


@pytest.fixture
def nodes(api: Any) -> Iterator[list[dict[str, Any]]]:
    """Two fresh Nodes, one carrying a label of its operator's; deleted afterwards."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api)
    made = []
    for _ in range(2):
        name = f"cleanup-{uuid.uuid4().hex[:8]}"
        node = core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(
            name=name, labels={"team": "a", "topolet.io/mig.config": "all-1g.18gb"})))
        made.append({"metadata": {"name": name, "uid": node.metadata.uid}})
    yield made
    for node in made:
        core.delete_node(node["metadata"]["name"])


def publish_as_topolet(api: Any, node: dict[str, Any], namespace: str) -> None:
    """What an agent on `node` writes: its NRT, its NodeFeature, and (node sink) labels on the Node."""
    name = node["metadata"]["name"]
    assert NRTPublisher(api, name).publish(nrt_object(node, TWO_SOCKETS_AND_CXL, State()))
    assert LabelPublisher(api, name, namespace, sink="nodefeature").publish(LABELS)
    assert LabelPublisher(api, name, namespace, sink="node").publish(LABELS)


def nfd_worker_nodefeature(api: Any, node: str, namespace: str) -> None:
    """nfd-worker's own NodeFeature for `node`: named after the node, no managed-by label."""
    from kubernetes import client as k8s

    body = {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
            "metadata": {"name": node, "labels": {NODE_NAME_LABEL: node}},
            "spec": {"labels": {"feature.node.kubernetes.io/kernel-version.major": "6"}}}
    k8s.CustomObjectsApi(api).create_namespaced_custom_object("nfd.k8s-sigs.io", "v1alpha1", namespace,
                                                              "nodefeatures", body)


def exists(call: Any, *args: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        call(*args)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def cleanup(control_plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [topolet_bin(), "cleanup", "--objects", "--kubeconfig", str(control_plane.kubeconfig), *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)


def test_cleanup_deletes_topolets_objects_and_never_another_projects(
        control_plane: ControlPlane, api: Any, namespace: str, nodes: list[dict[str, Any]]) -> None:
    from kubernetes import client as k8s

    objects, core, ext = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api), k8s.ApiextensionsV1Api(api)
    ours, theirs = (n["metadata"]["name"] for n in nodes)
    publish_as_topolet(api, nodes[0], namespace)
    objects.create_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL,
                                         nfd_nrt(theirs, nodes[1]["metadata"]["uid"]), field_manager=NFD)
    nfd_worker_nodefeature(api, ours, namespace)

    def nrt_exists(name: str) -> bool:
        return exists(objects.get_cluster_custom_object, nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)

    def nodefeature_exists(name: str) -> bool:
        return exists(objects.get_namespaced_custom_object, "nfd.k8s-sigs.io", "v1alpha1", namespace,
                      "nodefeatures", name)

    assert nrt_exists(ours) and nrt_exists(theirs) and nodefeature_exists(nodefeature_name(ours))
    result = cleanup(control_plane, "--all-nodes", "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1, result.stdout

    assert not nrt_exists(ours)
    assert nrt_exists(theirs)  # NFD's topology updater's, left alone
    assert not nodefeature_exists(nodefeature_name(ours))
    assert nodefeature_exists(ours)  # nfd-worker's
    meta = core.read_node(ours).metadata
    assert meta.labels.get("team") == "a" and meta.labels.get("topolet.io/mig.config") == "all-1g.18gb"
    assert not set(LABELS) & set(meta.labels)
    assert MANAGED_LABELS_ANNOTATION not in (meta.annotations or {})
    for crd in (NFD_CRD_NAME, NRT_CRD_NAME):  # never another project's CRD
        assert exists(ext.read_custom_resource_definition, crd)

    again = cleanup(control_plane, "--all-nodes", "--namespace", namespace)
    assert again.returncode == 0, again.stderr
    assert "0 NodeResourceTopology(ies), 0 NodeFeature(s)" in again.stdout
    assert "from 0 Node(s)" in again.stdout


def test_cleanup_of_one_node_leaves_the_others(control_plane: ControlPlane, api: Any, namespace: str,
                                               nodes: list[dict[str, Any]]) -> None:
    from kubernetes import client as k8s

    objects = k8s.CustomObjectsApi(api)
    for node in nodes:
        publish_as_topolet(api, node, namespace)
    first, second = (n["metadata"]["name"] for n in nodes)
    result = cleanup(control_plane, "--node-name", first, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert f"objects (node {first}): 1 NodeResourceTopology(ies), 1 NodeFeature(s)" in result.stdout
    assert not exists(objects.get_cluster_custom_object, nrt.GROUP, nrt.VERSION, nrt.PLURAL, first)
    assert exists(objects.get_cluster_custom_object, nrt.GROUP, nrt.VERSION, nrt.PLURAL, second)
    assert exists(objects.get_namespaced_custom_object, "nfd.k8s-sigs.io", "v1alpha1", namespace,
                  "nodefeatures", nodefeature_name(second))


def test_an_nrt_nfd_took_over_is_left_to_it(control_plane: ControlPlane, api: Any, namespace: str,
                                            nodes: list[dict[str, Any]]) -> None:
    """topolet published it, then NFD's topology updater rewrote its zones (keeping topolet's label,
    as its update does): it is NFD's now, and the cleanup of that node says so and leaves it."""
    from kubernetes import client as k8s

    objects = k8s.CustomObjectsApi(api)
    name = nodes[0]["metadata"]["name"]
    publish_as_topolet(api, nodes[0], namespace)
    live = objects.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)
    live["zones"][0]["resources"][0]["available"] = "0"
    objects.replace_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, name, live, field_manager=NFD)
    for args in (("--node-name", name), ("--all-nodes",)):
        result = cleanup(control_plane, *args, "--namespace", namespace)
        assert result.returncode == 0, result.stderr
        assert f"left to their managers: NodeResourceTopology {name} ({NFD})" in result.stdout, result.stdout
        assert exists(objects.get_cluster_custom_object, nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)


def test_an_api_server_that_is_not_there_is_one_line(tmp_path: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c",
                      "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    argv = [topolet_bin(), "cleanup", "--objects", "--all-nodes", "--kubeconfig", str(kubeconfig)]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("topolet cleanup: "), result.stderr


def test_the_node_cleanup_daemonset_runs_cleanup_local_where_the_agents_ran() -> None:
    agents = next(d for d in yaml.safe_load_all((REPO / "daemonset/agent.yaml").read_text())
                  if d and d["kind"] == "DaemonSet")
    ds = cleanup_daemonset(agents, "topolet-agent-cleanup")
    pod, agent_pod = ds["spec"]["template"]["spec"], agents["spec"]["template"]["spec"]
    agent = agent_pod["containers"][0]
    (init,) = pod["initContainers"]
    assert init["command"] == ["topolet", "cleanup", "--local", "--state-dir=/var/lib/topolet",
                               "--features-dir=/etc/kubernetes/node-feature-discovery/features.d"]
    assert init["image"] == agent["image"] and init["volumeMounts"] == agent["volumeMounts"]
    assert init["securityContext"] == agent["securityContext"]
    assert [c["command"] for c in pod["containers"]] == [["sleep", "infinity"]]
    assert not any("Probe" in k for c in pod["containers"] + pod["initContainers"] for k in c)
    for key in ("nodeSelector", "affinity", "tolerations", "volumes", "securityContext",
                "priorityClassName"):
        assert pod[key] == agent_pod[key], key
    assert pod["automountServiceAccountToken"] is False
    # Its own labels: never counted as an agent (selectors, PodMonitor, NetworkPolicy).
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"] == {**CLEANUP_LABELS, CLEANUP_OF_LABEL: "topolet-agent"} \
        == template_labels
    assert agents["spec"]["template"]["spec"]["containers"][0].get("livenessProbe")  # the input is untouched


@pytest.mark.parametrize(("args", "want"), [
    (["--state-dir", "/x", "--listen=0.0.0.0:1", "--cgroup-root=/sys/fs/cgroup/cpuset"],
     ["--state-dir=/x", "--cgroup-root=/sys/fs/cgroup/cpuset"]),
    (["--features-dir=/f", "--state-dir"], ["--features-dir=/f", "--state-dir="]),
    ([], []),
])
def test_local_options_taken_from_the_agent(args: list[str], want: list[str]) -> None:
    agents = {"metadata": {"name": "a", "namespace": "n"},
              "spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "i", "args": args}]}}}}
    init = cleanup_daemonset(agents, "a-cleanup")["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"] == ["topolet", "cleanup", "--local", *want]
